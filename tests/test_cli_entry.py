"""``scrapyd-pgqueue cluster``, the README's command, as a user runs it: real nodes until Ctrl-C, then none left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from helpers import COMMAND, wait_for


def processes_naming(directory) -> list[int]:
    """Pids of the live processes whose command line names ``directory``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(directory).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass  # gone meanwhile
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
        assert len(processes_naming(tmp_path)) >= 2  # the command, and the node it started in that directory
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in a terminal: to the command and every node it started
        out, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "Stopping ..." in out
    wait_for(lambda: processes_naming(tmp_path) == [], 30, "every node process gone")
