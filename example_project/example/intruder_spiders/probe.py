"""A spider that looks for its node's keys wherever a crawl, running as the node's user, can: its own environment,
its ancestors' (``/proc/<pid>/environ``: the node's spawner and the node, or the warm process, the spawner and the
node), and every file under its working directory and home (a crawl's own: none of the node's). It records what it read, or why it could
not, in <EXAMPLE_RECORD_DIR>/probes.jsonl, with the crawl's token and its node's address.

Importing this module records the importing process's environment and arguments in
<EXAMPLE_RECORD_DIR>/imports.jsonl: ``scrapy list``, a warm process, a cold crawl.
"""

import ctypes
import json
import os
import sys
from pathlib import Path

from example.recording import RecordingSpider

MAX_FILE = 1024 * 1024
PR_GET_DUMPABLE = 3


def _record(name, record):
    directory = os.environ.get("EXAMPLE_RECORD_DIR")
    if directory:
        os.makedirs(directory, exist_ok=True)  # imported by `scrapy list` before any crawl made it
        with open(os.path.join(directory, name), "a") as f:
            f.write(json.dumps(record) + "\n")


_record("imports.jsonl", {"pid": os.getpid(), "argv": sys.argv, "environ": dict(os.environ)})


def read(path):
    """What a file holds, or why it could not be read."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE).decode(errors="replace")
    except OSError as e:
        return f"unreadable: {type(e).__name__}: {e}"


def parent_of(pid):
    return int(read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])


def children_of(pids):
    """The processes whose parent is one of ``pids`` (a node's other children: its helpers, other crawls)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if parent_of(entry.name) in pids:
                    found.append(int(entry.name))
            except (IndexError, ValueError):  # gone meanwhile
                continue
    return found


def what_is_readable(pids):
    return {str(pid): {"cmdline": read(f"/proc/{pid}/cmdline"), "environ": read(f"/proc/{pid}/environ")}
            for pid in pids}


class ProbeSpider(RecordingSpider):
    name = "probe"

    async def start(self):
        from scrapyd_pgqueue.crawl_process import crawl_node

        parent = os.getppid()
        ancestors = [parent, parent_of(parent), parent_of(parent_of(parent))]
        files = {}
        for top in {Path.cwd(), Path.home()}:
            for path in top.rglob("*"):
                if path.is_file() and not path.is_symlink() or path.name == ".scrapy.cfg":
                    files[str(path)] = read(path)
        _record("probes.jsonl", {
            "job": self.job,
            "environ": dict(os.environ),
            "cmdline": read(f"/proc/{os.getpid()}/cmdline"),
            "node": list(crawl_node._node),  # its node's address and its own token, as its launch gave them
            "cwd": os.getcwd(),
            "dumpable": ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0),
            "ancestors": what_is_readable(ancestors),
            "relatives": what_is_readable(children_of(ancestors)),
            "files": files,
        })
        return
        yield
