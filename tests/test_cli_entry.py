"""``scrapyd-pgqueue cluster``, the README's command, as a user runs it: real nodes until Ctrl-C, then none left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from helpers import COMMAND, wait_for


def children_of(parent: int) -> list[int]:
    """Pids of a process's live children."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after the command's name, which may hold spaces
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == parent and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def test_ctrl_c_stops_every_node_it_started_and_exits_cleanly(database_url, tmp_path):
    command = [COMMAND, "cluster", "--nodes", "1", "--directory", str(tmp_path)]
    env = {**os.environ, "SCRAPYD_DATABASE_URL": database_url}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # its own process group, as a terminal's foreground job
    lines = []
    try:
        while not any("Ctrl-C stops" in line for line in lines):
            line = process.stdout.readline()
            assert line, f"the cluster did not start: {''.join(lines)}{process.stderr.read()}"
            lines.append(line)
        [node_url] = re.findall(r"node1: (http://\S+)", "".join(lines))
        assert urllib.request.urlopen(f"{node_url}daemonstatus.json", timeout=30).status == 200
        nodes = children_of(process.pid)
        assert len(nodes) == 1  # the node's twistd
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal (the nodes have sessions of their own)
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Stopping ..." in out
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in nodes), 30, "the node process gone")


def test_the_command_line_starts_without_importing_scrapyd_or_scrapy():
    """Every ``scrapyd-pgqueue`` command starts in a few hundred milliseconds: the parser imports neither Scrapyd nor
    Scrapy (0.4 s of imports), which only the commands that need them import."""
    loaded = subprocess.run([sys.executable, "-c", "import sys; from scrapyd_pgqueue.cli.entry import build_parser; "
                             "build_parser(); print(sorted({m.split('.')[0] for m in sys.modules} & {'scrapy', 'scrapyd', "
                             "'twisted'}))"], capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert loaded == "[]"
