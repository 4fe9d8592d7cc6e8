"""``scrapyd-pgqueue cluster``, the README's command, as a user runs it: real nodes until Ctrl-C, then none left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from helpers import COMMAND, wait_for


def processes_in_group(group: int) -> list[int]:
    """Pids of the live processes of a process group (what a terminal's Ctrl-C reaches)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()  # after the command's name, which may hold spaces
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == group and fields[0] != "Z":
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
        assert len(processes_in_group(process.pid)) >= 2  # the command, and the node it started
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal: to the command and every node it started
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Stopping ..." in out
    wait_for(lambda: processes_in_group(process.pid) == [], 30, "every node process gone")
