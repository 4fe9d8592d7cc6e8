"""A spider that tries, as a hostile egg would, to reach past its own project: it plants a module and a ``.pth`` file
wherever another process of the node might import them, writes into the node's and other projects' directories,
reads every process's command line and environment it can, and asks its node's crawl endpoint with a token it was
given (``token``, another crawl's). It records, per attempt, "ok" or why not, in <EXAMPLE_RECORD_DIR>/attacks.jsonl.

Spider arguments: ``node_dir`` (the node's working directory), ``other`` (another project's name), ``token`` and
``address`` (another crawl's token and its node's address, optional), ``secret`` (a string to look for in other
processes' command lines and environments: another crawl's argument), ``linger`` (seconds to run on after the
attempts: a victim that another crawl attacks).

The planted module ``ctypes.py`` and ``zz_planted.pth`` append a line to <EXAMPLE_RECORD_DIR>/planted.jsonl in any
process that imports them: a test asserts the file never appears.
"""

import asyncio
import os
import sys
from pathlib import Path

from example.recording import RecordingSpider

PLANTED = """import json, os, sys
with open(os.path.join({records!r}, "planted.jsonl"), "a") as f:
    f.write(json.dumps({{"pid": os.getpid(), "argv": sys.argv}}) + "\\n")
"""


def attempt(action):
    """'ok', or the error that stopped it."""
    try:
        action()
        return "ok"
    except Exception as e:  # noqa: BLE001 - every refusal is a result
        return f"{type(e).__name__}: {e}"


def write(path, text):
    def action():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return action


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode(errors="replace")
    except OSError as e:
        return f"unreadable: {type(e).__name__}"


class AttackerSpider(RecordingSpider):
    name = "attacker"
    # What a hostile project would ask for: Scrapy's remote control and telnet console (the node turns them off).
    custom_settings = {"REMOTE_CONTROL_ENABLED": True, "TELNETCONSOLE_ENABLED": True}

    async def start(self):
        records = os.environ["EXAMPLE_RECORD_DIR"]
        planted = PLANTED.format(records=records)
        marker = os.path.join(records, "planted.jsonl")
        pth = f"import os; open({marker!r}, 'a').write('pth ' + str(os.getpid()) + chr(10))\n"
        node_dir = Path(self.node_dir)
        user_site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
        results = {
            "plant_in_own_directory": attempt(write("ctypes.py", planted)),
            "plant_in_own_home": attempt(write(Path.home() / ".local" / user_site / "zz_planted.pth", pth)),
            "plant_in_node_directory": attempt(write(node_dir / "ctypes.py", planted)),
            "plant_in_node_home": attempt(write(Path(os.environ.get("NODE_HOME", node_dir)) / ".local" / user_site
                                                / "zz_planted.pth", pth)),
            "write_node_eggs": attempt(write(node_dir / "eggs" / "pgqueue" / "1.egg", "not an egg")),
            "write_other_logs": attempt(write(node_dir / "logs" / getattr(self, "other", "other") / "x.log", "x")),
            "list_other_crawls": attempt(lambda: os.listdir(node_dir / "crawls" / getattr(self, "other", "other"))),
            "read_node_config": read(node_dir / "scrapyd.conf")[:40],
            # Scrapy's servers on loopback, which another crawl could reach with their token
            "remote_control": self.crawler.settings.getbool("REMOTE_CONTROL_ENABLED"),
            "telnet_console": self.crawler.settings.getbool("TELNETCONSOLE_ENABLED"),
        }
        seen = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and entry.name != str(os.getpid()):
                seen[entry.name] = {"cmdline": read(entry / "cmdline"), "environ": read(entry / "environ")}
        secret = getattr(self, "secret", "")
        results["processes_showing_secret"] = [pid for pid, what in seen.items()
                                               if secret and (secret in what["cmdline"] or secret in what["environ"])]
        results["readable_environs"] = sorted(pid for pid, what in seen.items()
                                              if not what["environ"].startswith("unreadable"))
        if getattr(self, "token", None):
            from scrapyd_pgqueue.crawl_process import crawl_node

            status, answer = crawl_node._ask_node(self.address, self.token, {"jobs": [{"spider": "probe"}]})
            results["stolen_token"] = [status, answer.get("message")]
        from scrapyd_pgqueue.crawl_process import crawl_node

        self.append_record(records, "attacks.jsonl", {
            "job": self.job, "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
            "home": str(Path.home()), "node": list(crawl_node._node), "results": results,
        })
        if getattr(self, "linger", None):  # a victim: running while another crawl attacks it
            await asyncio.sleep(float(self.linger))
        return
        yield
