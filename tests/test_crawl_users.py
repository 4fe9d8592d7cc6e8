"""Crawls under their project's own user: a real node started as root (``crawl_users = on``) with two projects baked
in, ``intruder`` and ``victim`` (the same spiders), and the ``attacker`` spider of one trying, while a crawl of the
other runs with a secret argument, what a hostile egg did to a node whose crawls shared its user: plant code where
another process would import it, write into the node's and the other project's directories, read every process's
command line and environment, and use the other crawl's token. Cold and warm (forked) crawls alike."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import make_url

from conftest import FAST
from helpers import SYSTEM_PYTHON, children_of, jobs, query, spawner_pid, unprivileged_path, wait_for
from scrapyd_pgqueue.local.cluster import NODE_CONFIG, ScrapydNode
from scrapyd_pgqueue.node.copy_writer import COPY_MIN_JOBS

PROJECTS_CONFIG = NODE_CONFIG.read_text().rstrip("\n") + (
    "\nintruder = example.intruder_settings\nvictim = example.intruder_settings\n")
SECRET_ARGUMENT = "api_key-0f9e8d7c6b5a"
DATABASE_PASSWORD = "db-s3cret-users-pw"
FIRST_UID, LAST_UID = 20000, 29999
RECORDS = ("attacks.jsonl", "runs.jsonl", "ends.jsonl", "probes.jsonl", "imports.jsonl", "planted.jsonl")


def records(directory: Path, name: str) -> list[dict]:
    path = directory / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


@pytest.fixture(params=["cold", "warm"])
def separated_node(request, database_url):
    """A node started as root, in a directory other users may pass through, on the system's Python (the tests' own
    may be under root's home); the records' files writable by every crawl user."""
    directory = Path(tempfile.mkdtemp(prefix="crawl-users-"))
    directory.chmod(0o711)
    record_dir = directory / "records"
    record_dir.mkdir(mode=0o777)
    record_dir.chmod(0o1777)
    for name in RECORDS[:-1]:  # planted.jsonl is left for a planted module to make
        (record_dir / name).touch(mode=0o666)
        (record_dir / name).chmod(0o666)
    url = make_url(database_url).set(password=DATABASE_PASSWORD).render_as_string(hide_password=False)
    config = {**FAST, "crawl_users": "on", "warm_start": "on" if request.param == "warm" else "off"}
    node = ScrapydNode("users", directory / "node", url, config,
                       {"EXAMPLE_RECORD_DIR": str(record_dir), "PYTHONPATH": unprivileged_path()},
                       base_config=PROJECTS_CONFIG, python=SYSTEM_PYTHON)
    node.start()
    try:
        node.wait_ready()
        yield node, record_dir, request.param
    finally:
        node.stop()
        node.end_crawls()
        shutil.rmtree(directory, ignore_errors=True)


def schedule(node, project, spider, job, **args):
    answer = node.post("schedule.json", project=project, spider=spider, jobid=job, **args)
    assert answer["status"] == "ok", answer


def ended(database_url, job, timeout=60):
    wait_for(lambda: jobs(database_url).get(job, ("",))[0] == "terminated", timeout, f"job {job} to end")
    assert jobs(database_url)[job][:2] == ("terminated", "finished"), jobs(database_url)[job]


def attack_of(record_dir, job) -> dict:
    return wait_for(lambda: [r for r in records(record_dir, "attacks.jsonl") if r["job"] == job], 60,
                    f"the attack record of {job}")[0]


def test_a_spider_cannot_reach_past_its_own_project(separated_node, database_url):
    node, record_dir, start = separated_node
    assert node.get("daemonstatus.json")["crawl_boundary"] == ["separate users", "landlock"]
    node_dir = str(node.directory)
    if start == "warm":  # the first crawl of each project starts cold while its warm process imports it
        for project in ("victim", "intruder"):
            schedule(node, project, "probe", f"first-{project}")
            ended(database_url, f"first-{project}")
            wait_for(lambda: f"of project {project} ready" in node.logfile.read_text(), 60, "the warm process")

    # The victim runs with a secret argument; the attacker, of the other project, gets its token as if stolen.
    schedule(node, "victim", "attacker", "victim", node_dir=node_dir, other="intruder", linger="30",
             secret=SECRET_ARGUMENT)
    victim = attack_of(record_dir, "victim")
    address, token = victim["node"]
    schedule(node, "intruder", "attacker", "attacker", node_dir=node_dir, other="victim", secret=SECRET_ARGUMENT,
             address=address, token=token)
    ended(database_url, "attacker")
    attacker = attack_of(record_dir, "attacker")
    results = attacker["results"]

    # Each project's crawls run under a uid of their own, in no other group, in a directory of their own.
    for crawl, project in ((attacker, "intruder"), (victim, "victim")):
        assert FIRST_UID <= crawl["uid"] <= LAST_UID and crawl["gid"] == crawl["uid"] and crawl["groups"] == []
        assert crawl["cwd"].startswith(f"{node_dir}/crawls/{project}/") and crawl["home"] == crawl["cwd"]
    assert attacker["uid"] != victim["uid"]
    assert query(database_url, "SELECT project, uid FROM project_user WHERE project IN ('intruder', 'victim') "
                               "ORDER BY project") == [
        ("intruder", attacker["uid"]), ("victim", victim["uid"])]  # the same on every node
    # What it may write is its own; nothing of the node's or of the other project's.
    assert results["plant_in_own_directory"] == results["plant_in_own_home"] == "ok"
    for attempt in ("plant_in_node_directory", "plant_in_node_home", "write_node_eggs", "write_other_logs",
                    "list_other_crawls"):
        assert results[attempt].startswith("PermissionError"), (attempt, results[attempt])
    assert results["read_node_config"] == "unreadable: PermissionError"
    assert results["remote_control"] is results["telnet_console"] is False  # whatever the project's settings say
    assert SECRET_ARGUMENT not in node.logfile.read_text()  # a crawl's arguments are not in the node's log
    # No process shows the other crawl's argument, and no process of the node, of its spawner or of the other
    # project shows its environment.
    assert results["processes_showing_secret"] == []
    node_processes = {node.process.pid, spawner_pid(node), *children_of(spawner_pid(node))}
    assert not {str(pid) for pid in node_processes} & set(results["readable_environs"])
    # The other crawl's token is worth nothing from this process.
    assert results["stolen_token"][0] == 401 and "not the calling process's" in results["stolen_token"][1]
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE parent IS NOT NULL") == [(0,)]

    # What it planted is never imported: not by the node's COPY helper, a `scrapy list`, a new crawl or warm process.
    batch = [{"spider": "probe", "jobid": f"later-{i}", "delay": 3600} for i in range(COPY_MIN_JOBS)]
    assert node.post_json("schedule_batch.json", {"project": "intruder", "jobs": batch})["status"] == "ok"
    schedule(node, "intruder", "probe", "after")
    ended(database_url, "after")
    assert not (record_dir / "planted.jsonl").exists()
    if start == "warm":  # the warm processes run as their project's user, not as the node's or root
        warm = children_of(spawner_pid(node), b"warm_process")
        assert sorted(uid_of(pid) for pid in warm) == sorted([attacker["uid"], victim["uid"]])
    assert uid_of(node.process.pid) not in (0, attacker["uid"], victim["uid"])  # the node itself gave up root
    assert uid_of(spawner_pid(node)) == 0  # the one part that may switch users


def test_the_project_directories_belong_to_their_users(separated_node, database_url):
    node, record_dir, start = separated_node
    schedule(node, "victim", "probe", "one")
    ended(database_url, "one")
    [(uid,)] = query(database_url, "SELECT uid FROM project_user WHERE project = 'victim'")
    node_uid = uid_of(node.process.pid)
    logs = node.directory / "logs" / "victim"
    info = logs.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, node_uid, 0o2770)
    crawls = (node.directory / "crawls" / "victim").stat()
    assert (crawls.st_uid, stat.S_IMODE(crawls.st_mode)) == (uid, 0o700)
    # A crawl's own directory goes with it; a warm process keeps its own while it lives.
    warm = [os.path.basename(os.readlink(f"/proc/{pid}/cwd")) for pid in children_of(spawner_pid(node), b"warm")]
    assert os.listdir(node.directory / "crawls" / "victim") == warm and len(warm) == (start == "warm")
    # The node serves the crawl's log, which the crawl wrote as its own user.
    [log] = (logs / "probe").glob("one.log")
    assert log.stat().st_uid == uid
    with urllib.request.urlopen(f"{node.url}logs/victim/probe/one.log", timeout=30) as response:
        assert b"Spider opened" in response.read()
