"""A crawl holds no keys: a real node running as an unprivileged user (as crawls of a container or a bare-metal node
do: the same user as their node, not root), its secrets in its environment, and the intruder project's ``probe``
spider looking for them in its own environment, its node's ``/proc/<pid>/environ`` (and its warm process's), the
files of the node's directory, and in ``scrapy list``'s and the warm process's environments. Its token dies with
its job."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sqlalchemy import make_url

from conftest import FAST
from helpers import SYSTEM_PYTHON, jobs, unprivileged_path, wait_for
from scrapyd_pgqueue.local.cluster import NODE_CONFIG, ScrapydNode
from scrapyd_pgqueue.node.copy_writer import COPY_MIN_JOBS
from scrapyd_pgqueue.node.crawl_keys import crawl_environment

NOBODY = 65534
DATABASE_PASSWORD = "db-s3cret-keys-pw"
HTTP_PASSWORD = "http-s3cret-keys-pw"
INTRUDER_CONFIG = NODE_CONFIG.read_text().rstrip("\n") + "\nintruder = example.intruder_settings\n"
SECRET_NAMES = ("SCRAPYD_DATABASE_URL", "SCRAPYD_PGQUEUE_DATABASE_URL", "SCRAPYD_PASSWORD", "SCRAPYD_USERNAME",
                "DATABASE_PASSWORD", "MOUNTED_SECRET")


def unprivileged_user() -> tuple[int, str]:
    """The uid a node of this test runs as, with its interpreter: ``nobody``, where this checkout and its libraries
    are readable by it; else root's uid stripped of every capability (a checkout under a private home), which is
    what the test needs: a crawl of the node's own uid that cannot trace it or read its /proc past the kernel's
    checks."""
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
                            "-c", "import scrapyd_pgqueue, scrapy, scrapyd"], env={"PYTHONPATH": unprivileged_path()},
                           capture_output=True, timeout=60)
    return (NOBODY, SYSTEM_PYTHON) if probe.returncode == 0 else (0, sys.executable)


def records(directory: Path, name: str) -> list[dict]:
    path = directory / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(params=["cold", "warm"])
def unprivileged_node(request, database_url):
    """A node running as ``nobody`` with secrets in its environment (the chart's and a Secret mounted under a name
    of the operator's choosing), in a directory of its own outside the tests' (root-only) temporary directory."""
    uid, python = unprivileged_user()
    directory = Path(tempfile.mkdtemp(prefix="crawl-keys-"))
    (directory / "node").mkdir()
    (directory / "records").mkdir()
    for path in (directory, directory / "node", directory / "records"):
        shutil.chown(path, uid, uid)
    url = make_url(database_url).set(password=DATABASE_PASSWORD).render_as_string(hide_password=False)
    env = {"EXAMPLE_RECORD_DIR": str(directory / "records"), "SCRAPYD_USERNAME": "operator",
           "SCRAPYD_PASSWORD": HTTP_PASSWORD, "DATABASE_PASSWORD": DATABASE_PASSWORD,
           "MOUNTED_SECRET": f"password={DATABASE_PASSWORD}", "USER_SETTING": "kept"}
    config = {**FAST, "warm_start": "on" if request.param == "warm" else "off"}
    node = ScrapydNode("keys", directory / "node", url, config, {**env, "PYTHONPATH": unprivileged_path()},
                       base_config=INTRUDER_CONFIG, user=uid, python=python)
    node.start()
    try:
        node.wait_ready()
        yield node, directory / "records", url, request.param
    finally:
        node.stop()
        node.end_crawls()
        shutil.rmtree(directory, ignore_errors=True)


def run_probe(node, database_url, record_dir, job="probe") -> dict:
    """Run the probe spider as job ``job`` (warm, once the node has a warm process of its project): its record."""
    answer = node.post("schedule.json", project="intruder", spider="probe", jobid=job)  # runs `scrapy list` once
    assert answer["status"] == "ok", answer
    wait_for(lambda: jobs(database_url).get(job, ("",))[0] == "terminated", 60, f"job {job} to end")
    assert jobs(database_url)[job][:2] == ("terminated", "finished")
    [probe] = [record for record in records(record_dir, "probes.jsonl") if record["job"] == job]
    return probe


def test_a_crawl_finds_no_key_of_its_node(unprivileged_node, database_url):
    node, record_dir, url, start = unprivileged_node
    if start == "warm":  # the first crawl starts cold while its warm process imports the project
        run_probe(node, database_url, record_dir, "first")
        wait_for(lambda: "of project intruder ready" in node.logfile.read_text(), 60, "the warm process")
    # A big batch (delayed: it stays waiting) starts the node's COPY helper, which the crawl will look at too.
    batch = [{"spider": "probe", "jobid": f"later-{i}", "delay": 3600} for i in range(COPY_MIN_JOBS)]
    assert node.post_json("schedule_batch.json", {"project": "intruder", "jobs": batch})["status"] == "ok"
    probe = run_probe(node, database_url, record_dir)
    imports = records(record_dir, "imports.jsonl")
    seen = json.dumps([records(record_dir, "probes.jsonl"), imports])
    assert not [secret for secret in [DATABASE_PASSWORD, HTTP_PASSWORD, url] if secret in seen]
    for environment in [probe["environ"], *(record["environ"] for record in imports)]:
        assert not set(SECRET_NAMES) & set(environment)
        assert environment["USER_SETTING"] == "kept" and environment["PATH"]  # what spiders may need stays
    # `scrapy list` ran with the same environment (and its egg from the node); a warm process too, when warm.
    assert any(record["argv"][1:] == ["-s", "LOG_STDOUT=0"] for record in imports)  # `scrapy list`, as Scrapyd runs it
    warm_processes = [record for record in imports if record["argv"][0].endswith("warm_process.py")]
    assert len(warm_processes) == (1 if start == "warm" else 0)

    # The node (the crawl's grandparent when cold, under its spawner; further up when forked from a warm process)
    # cannot be read, nor the warm process, nor the COPY helper; nor this crawl by another crawl: none is dumpable.
    node_pid = str(node.process.pid)
    assert probe["ancestors"][node_pid]["environ"].startswith("unreadable: PermissionError")
    # Its directory and home are its own: none of the node's files (its configuration) is there to read.
    assert not [path for path in probe["files"] if "scrapyd.conf" in path or path.endswith(".scrapy.cfg")]
    assert probe["cwd"] != str(node.directory) and not probe["cwd"].startswith(str(node.directory) + "/logs")
    if start == "warm":
        [warm] = [pid for pid, seen in probe["ancestors"].items() if "warm_process" in seen["cmdline"]]
        assert probe["ancestors"][warm]["environ"].startswith("unreadable: PermissionError")
    [helper] = [seen for seen in probe["relatives"].values() if "copy_helper" in seen["cmdline"]]
    assert helper["environ"].startswith("unreadable: PermissionError")  # nor the helper that holds the URL
    assert probe["dumpable"] == 0
    # Neither its token nor its arguments are in its environment or on its command line.
    assert probe["node"][1] and probe["node"][1] not in json.dumps(probe["environ"]) + probe["cmdline"]


def test_a_token_dies_with_its_job(unprivileged_node, database_url):
    node, record_dir, _, _ = unprivileged_node
    probe = run_probe(node, database_url, record_dir)
    address, token = probe["node"]
    assert address.startswith("unix:")
    status, answer = post_schedule(address[5:], token, {"jobs": [{"spider": "probe"}]})
    assert (status, answer["status"]) == (401, "error"), answer
    assert "unknown token" in answer["message"]
    assert set(jobs(database_url)) == {"probe"}


def post_schedule(path: str, token: str, body: dict) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("localhost", timeout=30)
    connection.sock = socket.socket(socket.AF_UNIX)
    connection.sock.connect(path)
    connection.request("POST", "/schedule", json.dumps(body), {"Authorization": f"Bearer {token}",
                                                               "Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


# --- what a crawl's environment keeps (crawl_keys.crawl_environment) -----------------------------------------------


def test_the_crawl_environment_drops_secrets_by_name_and_by_value():
    secrets = {"postgresql://node:pa%40ss-word@db/q", "pa%40ss-word", "pa@ss-word", "tiny"}
    environment = {
        "PATH": "/usr/bin", "HOME": "/home/scrapyd", "PYTHONPATH": "/app", "SCRAPY_PROJECT": "p",
        "SCRAPYD_DATABASE_URL": "anything", "SCRAPYD_PASSWORD": "x", "DATABASE_PASSWORD": "y",
        "API_URL": "postgresql://node:pa%40ss-word@db/q", "MOUNTED": "key=pa@ss-word;", "SHORT": "tiny",
        "HOLDS_TINY": "destiny", "USER_SETTING": "kept",
    }
    assert crawl_environment(environment, secrets) == {
        "PATH": "/usr/bin", "HOME": "/home/scrapyd", "PYTHONPATH": "/app", "SCRAPY_PROJECT": "p",
        "HOLDS_TINY": "destiny", "USER_SETTING": "kept",  # a short secret is matched whole, not inside words
    }


def test_in_one_user_mode_a_spider_plants_nothing_and_the_node_says_so(unprivileged_node, database_url):
    """Where the node cannot switch users, its projects share its user: it says so at start, and Landlock and the
    isolated children still keep a spider from planting code in the node's directory or home, or from having what it
    leaves in its own directory imported by any other process."""
    node, record_dir, _, start = unprivileged_node
    assert node.get("daemonstatus.json")["crawl_boundary"] == ["one user", "landlock"]
    assert "its projects share one trust domain" in node.logfile.read_text()
    answer = node.post("schedule.json", project="intruder", spider="attacker", jobid="attacker",
                       node_dir=str(node.directory))
    assert answer["status"] == "ok", answer
    wait_for(lambda: jobs(database_url).get("attacker", ("",))[0] == "terminated", 60, "the attacker to end")
    [attack] = records(record_dir, "attacks.jsonl")
    results = attack["results"]
    assert results["plant_in_own_directory"] == results["plant_in_own_home"] == "ok"
    for attempt in ("plant_in_node_directory", "plant_in_node_home", "write_node_eggs"):
        assert results[attempt].startswith("PermissionError"), (attempt, results[attempt])
    assert results["read_node_config"] == "unreadable: PermissionError"
    assert results["remote_control"] is results["telnet_console"] is False
    # A COPY helper, a new crawl (and, warm, a forked one) and `scrapy list` of the project start after it.
    batch = [{"spider": "probe", "jobid": f"later-{i}", "delay": 3600} for i in range(COPY_MIN_JOBS)]
    assert node.post_json("schedule_batch.json", {"project": "intruder", "jobs": batch})["status"] == "ok"
    run_probe(node, database_url, record_dir, "after")
    assert not (record_dir / "planted.jsonl").exists()
