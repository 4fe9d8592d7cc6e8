"""One cluster, one truth, end to end: three real Scrapyd nodes on one Postgres, real HTTP, real crawls.

Behind a load balancer a client's requests land on any node. What a user checks here: every node answers the same
for a job wherever it runs (status.json, listjobs.json, daemonstatus.json, its log); cancel.json on any node stops
the job on the node running it; an egg deployed once (scrapyd-deploy) runs on every node; the operator command
shows the same state; and the real clients (scrapyd-client, python-scrapyd-api) work against it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import zoneinfo
from pathlib import Path

import psycopg2
import pytest
from scrapyd_api import ScrapydAPI
from scrapyd_client.pyclient import ScrapydClient

from helpers import query, runs_of, skewed_clock, wait_for
from scrapyd_pgqueue.local.cluster import LocalCluster

NODES = 3
BIN = Path(sys.executable).parent
# One crawl per node, so that a few long "blocker" crawls fill the cluster and a job can be held pending, or
# steered to the one node whose blocker is cancelled. A heartbeat each second: the cancel floor is quick to test.
NODE_CONFIG = {"max_proc": "1", "heartbeat_interval": "1"}
BLOCKER_SECONDS = "300"


# --- helpers ---------------------------------------------------------------------------------------------------




def without_node_name(answer: dict) -> dict:
    """A web service's answer without the answering node's name (the one key that must differ)."""
    return {key: value for key, value in answer.items() if key != "node_name"}


def answers_about(node, job: str) -> dict:
    """Everything a client asks a node about the cluster: the job's status, the jobs list, the cluster counts."""
    return {
        "status": without_node_name(node.get("status.json", job=job)),
        "listjobs": without_node_name(node.get("listjobs.json")),
        "cluster": node.get("daemonstatus.json")["cluster"],
    }


def job_entry(listed: dict, state: str, job: str) -> dict | None:
    return next((entry for entry in listed[state] if entry["id"] == job), None)


def schedule(node, project: str, spider: str, **args) -> str:
    answer = node.post("schedule.json", project=project, spider=spider, **args)
    assert answer["status"] == "ok", answer
    return answer["jobid"]


def read_records(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A crawl that exited but is not reaped yet by its node is a zombie: it no longer runs.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def fill_every_slot(cluster: LocalCluster) -> dict[str, str]:
    """One long sleeper crawl per node (one slot each); return node name -> its blocker's job id."""
    jobs = {schedule(cluster.nodes[0], "example", "sleeper", seconds=BLOCKER_SECONDS) for _ in cluster.nodes}

    def running_with_pids():
        running = cluster.nodes[0].get("listjobs.json")["running"]
        if {entry["id"] for entry in running} == jobs and all(entry["pid"] for entry in running):
            return {entry["node_name"]: entry["id"] for entry in running}
        return None

    blockers = wait_for(running_with_pids, 90, "a blocker crawl on every node")
    assert sorted(blockers) == [node.name for node in cluster.nodes]
    return blockers


def cancel_and_wait(cluster: LocalCluster, project: str, job: str) -> None:
    """Cancel a job (SIGKILL if it runs: no graceful shutdown to wait for) and wait until it is finished."""
    answer = cluster.nodes[0].post("cancel.json", project=project, job=job, signal="KILL")
    assert answer["prevstate"] in ("pending", "running"), answer
    wait_for(lambda: cluster.nodes[0].get("status.json", job=job)["currstate"] == "finished", 30, f"{job} to end")


def operator_status(database_url: str) -> dict:
    result = subprocess.run(
        [str(BIN / "scrapyd-pgqueue"), "status", "--json", "--database-url", database_url],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


RANGES = [None, "bytes=-1000", "bytes=100-", "bytes=100-199", "bytes=0-0", "bytes=-99999999", "bytes=10-99999999",
          "bytes=99999999-", "bytes=5-2", "lines=0-9"]


def ranged(url: str, byte_range: str | None) -> tuple:
    """(status, Content-Range, Content-Length, body) of a GET with that Range."""
    request = urllib.request.Request(url, headers={} if byte_range is None else {"Range": byte_range})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, headers, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as e:
        status, headers, body = e.code, e.headers, e.read()
    return status, headers["Content-Range"], headers["Content-Length"], body


@pytest.fixture
def cluster(database_url, tmp_path, record_dir):
    env = {"EXAMPLE_RECORD_DIR": str(record_dir)}
    with LocalCluster(database_url, NODES, directory=tmp_path / "nodes", config=NODE_CONFIG, env=env) as cluster:
        yield cluster


# --- one truth -------------------------------------------------------------------------------------------------


def test_every_node_reports_a_job_identically_while_pending_running_and_finished(cluster, database_url, record_dir):
    node1, node2, node3 = cluster.nodes
    blockers = fill_every_slot(cluster)
    job = schedule(node1, "example", "sleeper", seconds="8", colour="blue")

    # Pending: scheduled through node 1, every node reports it, the same way, with Scrapyd's pending fields.
    pending = [answers_about(node, job) for node in cluster.nodes]
    assert pending[0] == pending[1] == pending[2]
    assert pending[0]["status"] == {"currstate": "pending", "status": "ok", "parent": None, "root": job,
                                    "tags": []}  # a root, which any node may run
    assert pending[0]["listjobs"]["pending"] == [
        {"id": job, "project": "example", "spider": "sleeper", "version": None, "settings": {},
         "args": {"seconds": "8", "colour": "blue"}, "run_at": None, "tags": [], "crawl": None}
    ]
    assert pending[0]["cluster"] == {"pending": 1, "pending_exact": True, "running": 3, "finished": 0, "nodes": 3,
                                     "delayed": 0, "past_due": 0, "dead": 0, "unroutable": 0}
    # daemonstatus.json's own keys stay Scrapyd's: "running" counts this node's crawls.
    assert [node.get("daemonstatus.json")["running"] for node in cluster.nodes] == [1, 1, 1]
    # Scrapyd's clients read the same answer from any node.
    assert ScrapydAPI(node3.url).job_status("example", job) == "pending"
    # (ScrapydClient appends "/status.json" to the URL itself: give it none of its own.)
    assert ScrapydClient(node2.url.rstrip("/")).status(job, "example")["currstate"] == "pending"

    # Running: free node 2's slot; node 2 takes the job, and nodes 1 and 3 report it running there.
    cancel_and_wait(cluster, "example", blockers["node2"])
    running_entry = wait_for(
        lambda: (entry := job_entry(node3.get("listjobs.json"), "running", job)) and entry["pid"] and entry,
        30, "the job to run with its pid",
    )
    running = [answers_about(node, job) for node in cluster.nodes]
    assert running[0] == running[1] == running[2]
    assert running[0]["status"]["currstate"] == "running"
    assert running_entry["node_name"] == "node2"
    assert set(running_entry) == {"id", "project", "spider", "pid", "start_time", "log_url", "items_url", "node_name",
                                  "items", "requests", "errors", "finish_reason", "tags", "crawl"}  # Scrapyd's, ours
    assert running_entry["log_url"] == f"/logs/example/sleeper/{job}.log"
    assert pid_alive(running_entry["pid"])
    assert ScrapydAPI(node1.url).job_status("example", job) == "running"
    # The operator command sees what the nodes report.
    operator = operator_status(database_url)
    assert operator["pending"]["total"] == 0
    assert {(entry["job"], entry["node"]) for entry in operator["running"]["jobs"]} == {
        (entry["id"], entry["node_name"]) for entry in running[0]["listjobs"]["running"]
    }
    assert {node["name"]: (node["state"], node["running"]) for node in operator["nodes"]} == {
        "node1": ("live", 1), "node2": ("live", 1), "node3": ("live", 1)
    }

    # Finished: every node reports it, and its log_url gives the same log from every node.
    wait_for(lambda: node1.get("status.json", job=job)["currstate"] == "finished", 60, "the job to finish")
    finished = [answers_about(node, job) for node in cluster.nodes]
    assert finished[0] == finished[1] == finished[2]
    entry = job_entry(finished[0]["listjobs"], "finished", job)
    assert entry["node_name"] == "node2" and entry["outcome"] == "finished"
    assert entry["start_time"] == running_entry["start_time"]
    logs = []
    for node in cluster.nodes:
        with urllib.request.urlopen(node.url.rstrip("/") + entry["log_url"], timeout=30) as response:
            logs.append(response.read().decode())
    assert logs[0] == logs[1] == logs[2]
    assert "Spider closed (finished)" in logs[0] and job in logs[0]
    # Gerapy's poll of the log's end: 206 with the last 1000 bytes from node2's file and from the database alike.
    tail = logs[0].encode()[-1000:]
    for node in cluster.nodes:
        assert ranged(node.url.rstrip("/") + entry["log_url"], "bytes=-1000")[::3] == (206, tail), node.name
    assert [run["node"] for run in read_records(record_dir / "runs.jsonl") if run["job"] == job] == ["node2"]
    assert ScrapydAPI(node3.url).job_status("example", job) == "finished"
    assert operator_status(database_url)["finished"]["by_outcome"] == {"cancelled": 1, "finished": 1}

    for blocker in (blockers["node1"], blockers["node3"]):
        cancel_and_wait(cluster, "example", blocker)


def test_a_log_served_from_the_database_honours_range_as_the_log_file_does(database_url, start_cluster):
    (node,) = start_cluster(database_url, 1).nodes
    job = schedule(node, "example", "sleeper", seconds="0")
    wait_for(lambda: node.get("status.json", job=job)["currstate"] == "finished", 60, "the job to finish")
    url = f"{node.url}logs/example/sleeper/{job}.log"
    log_file = node.directory / "logs" / "example" / "sleeper" / f"{job}.log"
    log = log_file.read_bytes()
    assert len(log) > 1000
    from_file = {byte_range: ranged(url, byte_range) for byte_range in RANGES}
    log_file.unlink()  # now this node serves the log stored in the database, as the other nodes do
    from_database = {byte_range: ranged(url, byte_range) for byte_range in RANGES}
    assert from_database == from_file
    # What Gerapy polls: the last 1000 bytes, 206.
    assert from_database["bytes=-1000"] == (206, f"bytes {len(log) - 1000}-{len(log) - 1}/{len(log)}", "1000",
                                            log[-1000:])
    assert from_database[None] == (200, None, str(len(log)), log)
    assert from_database["bytes=99999999-"][:2] == (416, f"bytes */{len(log)}")
    # A suffix longer than the log is the whole log (Twisted's own File answered 500 to it).
    assert from_database["bytes=-99999999"] == (206, f"bytes 0-{len(log) - 1}/{len(log)}", str(len(log)), log)
    status, _, _, parts = ranged(url, "bytes=0-9,20-29")  # several ranges: multipart/byteranges, as for the file
    assert status == 206 and f"Content-range: bytes 20-29/{len(log)}\r\n\r\n".encode() + log[20:30] in parts


def test_cancel_sent_to_one_node_stops_the_job_running_on_another(cluster, record_dir):
    blockers = fill_every_slot(cluster)
    job = blockers["node2"]
    node1, node2, node3 = cluster.nodes
    running = job_entry(node3.get("listjobs.json"), "running", job)
    assert running["node_name"] == "node2" and pid_alive(running["pid"])

    def crawl_log():
        """The crawl's log as node 3 hands it out: by sending the client to node 2, which writes it."""
        try:
            with urllib.request.urlopen(node3.url.rstrip("/") + running["log_url"], timeout=30) as response:
                assert response.url == node2.url.rstrip("/") + running["log_url"]
                return response.read().decode()
        except urllib.error.HTTPError as e:
            assert e.code == 404 and e.url == node2.url.rstrip("/") + running["log_url"], e
            return ""  # Scrapy has not created it yet

    wait_for(lambda: "Spider opened" in crawl_log(), 30, "the crawl to open its spider")

    # python-scrapyd-api's cancel, sent to node 3: node 2 signals its crawl (SIGINT), which begins Scrapy's
    # graceful shutdown; the sleeping callback keeps it alive, as with Scrapyd's own cancel.json.
    requested = time.monotonic()
    assert ScrapydAPI(node3.url).cancel("example", job) == "running"
    wait_for(lambda: "Received SIGINT, shutting down gracefully" in crawl_log(), 10, "node 2 to signal its crawl")
    signalled_after = time.monotonic() - requested
    assert signalled_after < 3, f"node 2 signalled its crawl {signalled_after:.1f}s after cancel.json"
    # A second cancel.json, as with Scrapyd, forces the shutdown: this one sent to node 1.
    requested = time.monotonic()
    assert node1.post("cancel.json", project="example", job=job)["prevstate"] == "running"
    wait_for(lambda: not pid_alive(running["pid"]), 10, "node 2's crawl to stop")
    stopped_after = time.monotonic() - requested
    assert stopped_after < 3, f"the crawl stopped {stopped_after:.1f}s after the second cancel.json"
    wait_for(lambda: node1.get("status.json", job=job)["currstate"] == "finished", 30, "the job to be finished")
    for node in cluster.nodes:
        entry = job_entry(node.get("listjobs.json"), "finished", job)
        assert (entry["node_name"], entry["outcome"]) == ("node2", "cancelled")
    # Finished, its log is served by node 3 itself now (from the database), with both signals in it.
    with urllib.request.urlopen(node3.url.rstrip("/") + running["log_url"], timeout=30) as response:
        assert response.url == node3.url.rstrip("/") + running["log_url"]
        assert "Received SIGINT twice, forcing unclean shutdown" in response.read().decode()

    # Cancelling it again: nothing is pending or running under that id any more.
    assert node1.post("cancel.json", project="example", job=job)["prevstate"] is None

    # A pending job cancelled through node 1 never runs: the job scheduled after it runs in its place.
    blockers["node2"] = schedule(node3, "example", "sleeper", seconds=BLOCKER_SECONDS)  # the cluster is full again
    wait_for(lambda: node3.get("status.json", job=blockers["node2"])["currstate"] == "running", 30, "a new blocker")
    doomed = schedule(node3, "example", "sleeper", seconds="0")
    assert node1.post("cancel.json", project="example", job=doomed)["prevstate"] == "pending"
    assert node2.get("status.json", job=doomed)["currstate"] == "finished"
    successor = schedule(node3, "example", "sleeper", seconds="0")
    cancel_and_wait(cluster, "example", blockers["node2"])
    wait_for(lambda: node3.get("status.json", job=successor)["currstate"] == "finished", 60, "the next job to run")
    assert doomed not in {run["job"] for run in read_records(record_dir / "runs.jsonl")}
    assert job_entry(node3.get("listjobs.json"), "finished", doomed)["outcome"] == "cancelled"

    for blocker in (blockers["node1"], blockers["node3"]):
        cancel_and_wait(cluster, "example", blocker)


def test_a_cancel_whose_notify_was_missed_is_delivered_by_the_heartbeat(cluster, database_url):
    """The floor: a cancel request written without NOTIFY (as if the node's listener was reconnecting)."""
    blockers = fill_every_slot(cluster)
    job = blockers["node3"]
    pid = job_entry(cluster.nodes[0].get("listjobs.json"), "running", job)["pid"]
    with psycopg2.connect(database_url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "UPDATE spider_job SET cancel_requested = true, cancel_requests = 1, cancel_signal = 'KILL' "
            "WHERE job = %s", (job,),
        )
    wait_for(lambda: not pid_alive(pid), 10, "the heartbeat to deliver the cancel request")
    wait_for(lambda: cluster.nodes[1].get("status.json", job=job)["currstate"] == "finished", 30, "the job to end")
    with psycopg2.connect(database_url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT outcome, reason FROM spider_job WHERE job = %s", (job,))
        outcome, reason = cursor.fetchone()
    assert outcome == "cancelled" and reason.startswith("cancelled (signal KILL)")

    for blocker in (blockers["node1"], blockers["node2"]):
        cancel_and_wait(cluster, "example", blocker)


def running_with_pids(node, jobs: set[str]) -> dict[str, int] | None:
    """{job: pid} once every one of ``jobs`` runs on ``node`` with its pid known, else None."""
    running = {entry["id"]: entry["pid"] for entry in node.get("listjobs.json")["running"] if entry["pid"]}
    return running if jobs <= running.keys() else None


def outcomes(database_url: str, jobs) -> dict[str, tuple]:
    with psycopg2.connect(database_url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT job, status, outcome, reason FROM spider_job WHERE job = ANY(%s)", (list(jobs),))
        return {job: (status, outcome, reason) for job, status, outcome, reason in cursor.fetchall()}


def test_cancel_takes_a_signal_by_number_or_by_name(start_cluster, database_url):
    [node] = start_cluster(database_url, 1, max_proc="2").nodes
    signals = {"by-number": "9", "by-name": "sigkill"}
    for job in signals:
        schedule(node, "example", "sleeper", jobid=job, seconds="300")
    wait_for(lambda: running_with_pids(node, set(signals)), 60, "both crawls to run")
    for job, signal in signals.items():
        assert node.post("cancel.json", project="example", job=job, signal=signal)["prevstate"] == "running"
    wait_for(lambda: {state[0] for state in outcomes(database_url, signals).values()} == {"terminated"}, 30,
             "both crawls to end")
    ended = outcomes(database_url, signals)
    assert ended["by-number"][1:] == ("cancelled", "cancelled (signal 9); killed by signal 9")
    assert ended["by-name"][1:] == ("cancelled", "cancelled (signal KILL); killed by signal 9")


def test_cancel_requests_delivered_together_where_some_are_no_signal_break_no_other(start_cluster, database_url):
    """Rows written another way (an older node, SQL) may carry what cancel.json refuses: 0 signals nothing, 99 is
    no signal. Delivered in one go by the heartbeat, with a good one: that one stops its crawl, the others are
    logged and their crawls run to their end, finished."""
    [node] = start_cluster(database_url, 1, max_proc="3").nodes
    seconds = {"zero": "8", "ninety-nine": "8", "good": "300"}
    for job, duration in seconds.items():
        schedule(node, "example", "sleeper", jobid=job, seconds=duration)
    pids = wait_for(lambda: running_with_pids(node, set(seconds)), 60, "the three crawls to run")
    with psycopg2.connect(database_url) as connection, connection.cursor() as cursor:
        cursor.execute(
            "UPDATE spider_job SET cancel_requested = true, cancel_requests = 1, cancel_signal = CASE job "
            "WHEN 'zero' THEN '0' WHEN 'ninety-nine' THEN '99' ELSE 'KILL' END WHERE job = ANY(%s)", (list(seconds),),
        )
    wait_for(lambda: not pid_alive(pids["good"]), 10, "the heartbeat to deliver the good cancel request")
    wait_for(lambda: {state[0] for state in outcomes(database_url, seconds).values()} == {"terminated"}, 60,
             "the three crawls to end")
    ended = outcomes(database_url, seconds)
    assert ended["good"][1:] == ("cancelled", "cancelled (signal KILL); killed by signal 9")
    assert ended["zero"][1:] == ended["ninety-nine"][1:] == ("finished", None)
    log = node.logfile.read_text()
    assert "Not cancelling job zero of project example: signal must be" in log
    assert "Not cancelling job ninety-nine of project example: signal must be" in log
    assert "Reading cancel requests and eggs failed" not in log


# --- deploy once -----------------------------------------------------------------------------------------------

MARKER_SPIDER = '''
import json
import os

import scrapy

VERSION = "{version}"


class MarkerSpider(scrapy.Spider):
    """Appends which version of the project ran, on which node, to the file given as -a record=PATH."""

    name = "marker"

    async def start(self):
        line = json.dumps({{"job": self._job, "version": VERSION, "node": os.environ.get("SCRAPYD_NODE_NAME")}})
        with open(self.record, "a") as record:
            record.write(line + "\\n")
        return
        yield
'''


def write_marker_project(directory: Path, cluster: LocalCluster, version: str) -> Path:
    """A Scrapy project found on no node's path, with scrapy.cfg deploy targets node1..node3 (project 'deployed')."""
    package = directory / "marker_project"
    (package / "spiders").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "spiders" / "__init__.py").write_text("")
    (package / "settings.py").write_text(textwrap.dedent("""
        BOT_NAME = "marker_project"
        SPIDER_MODULES = ["marker_project.spiders"]
        ROBOTSTXT_OBEY = False
        TELNETCONSOLE_ENABLED = False
        REMOTE_CONTROL_ENABLED = False
    """))
    (package / "spiders" / "marker.py").write_text(MARKER_SPIDER.format(version=version))
    # No trailing slash: scrapyd-client's commands append "/listprojects.json" (scrapyd-deploy joins either way).
    targets = "".join(
        f"\n[deploy:{node.name}]\nurl = {node.url.rstrip('/')}\nproject = deployed\n" for node in cluster.nodes
    )
    (directory / "scrapy.cfg").write_text(f"[settings]\ndefault = marker_project.settings\n{targets}")
    return directory


def run_client(command: list[str], project_dir: Path) -> subprocess.CompletedProcess:
    """Run a scrapyd-client command in the project, as a user would, with a HOME of its own."""
    env = {"PATH": os.environ["PATH"], "HOME": str(project_dir.parent), "LANG": "C.UTF-8"}
    result = subprocess.run(command, cwd=project_dir, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def test_an_egg_deployed_once_through_node1_runs_on_node3(cluster, tmp_path, record_dir):
    node1, node2, node3 = cluster.nodes
    project_dir = write_marker_project(tmp_path / "client" / "marker", cluster, version="1")
    record = record_dir / "marker-runs.jsonl"  # where crawls may write (crawl_paths)

    # scrapyd-deploy builds the egg and uploads it to node 1 only, twice: versions 1 and 2.
    deployed = run_client([str(BIN / "scrapyd-deploy"), "node1", "--version", "1"], project_dir)
    assert json.loads(deployed.stdout)["status"] == "ok", deployed.stdout
    write_marker_project(project_dir, cluster, version="2")
    assert json.loads(run_client([str(BIN / "scrapyd-deploy"), "node1", "--version", "2"], project_dir).stdout)[
        "spiders"] == 1

    # Every node knows the project and both versions, without a restart.
    for node in cluster.nodes:
        wait_for(lambda: "deployed" in node.get("listprojects.json")["projects"], 15, f"{node.name} to learn it")
        assert node.get("listversions.json", project="deployed")["versions"] == ["1", "2"]
    # scrapyd-client's own commands, against nodes 2 and 3.
    assert run_client([str(BIN / "scrapyd-client"), "projects", "-t", "node2"], project_dir).stdout.split() == [
        "deployed", "example"]
    assert run_client([str(BIN / "scrapyd-client"), "spiders", "-t", "node3", "-p", "deployed"],
                      project_dir).stdout.split() == ["deployed:", "marker"]

    # Version 1, scheduled through node 2 with scrapyd-client, runs on node 3: the only node with a free slot.
    blockers = fill_every_slot(cluster)
    scheduled = run_client([str(BIN / "scrapyd-client"), "schedule", "-t", "node2", "-p", "deployed", "marker",
                            "--arg", f"record={record}", "--arg", "_version=1"], project_dir)
    first = scheduled.stdout.split("=>")[-1].strip()
    assert node3.get("listjobs.json")["pending"][0]["version"] == "1"
    cancel_and_wait(cluster, "example", blockers["node3"])
    wait_for(lambda: node1.get("status.json", job=first)["currstate"] == "finished", 60, "version 1 to run")
    # Without _version, the newest version runs (node 3 again: the others are still busy).
    latest = schedule(node1, "deployed", "marker", record=str(record))
    wait_for(lambda: node2.get("status.json", job=latest)["currstate"] == "finished", 60, "version 2 to run")
    assert read_records(record) == [
        {"job": first, "version": "1", "node": "node3"},
        {"job": latest, "version": "2", "node": "node3"},
    ]
    outcomes = {entry["id"]: entry["outcome"] for entry in node2.get("listjobs.json")["finished"]}
    assert outcomes[first] == outcomes[latest] == "finished"

    # Version 2 deployed again, new code under the same version, through node 1: node 3, which keeps version 2's
    # egg as a file, runs the new one.
    write_marker_project(project_dir, cluster, version="2-again")
    run_client([str(BIN / "scrapyd-deploy"), "node1", "--version", "2"], project_dir)
    again = schedule(node2, "deployed", "marker", record=str(record))
    wait_for(lambda: node1.get("status.json", job=again)["currstate"] == "finished", 60, "the new version 2 to run")
    assert read_records(record)[-1] == {"job": again, "version": "2-again", "node": "node3"}

    # Deleting through one node deletes for all.
    assert node3.post("delversion.json", project="deployed", version="1")["status"] == "ok"
    assert node1.get("listversions.json", project="deployed")["versions"] == ["2"]
    assert node2.post("delproject.json", project="deployed")["status"] == "ok"
    for node in cluster.nodes:
        wait_for(lambda: "deployed" not in node.get("listprojects.json")["projects"], 15, f"{node.name} to forget it")
        assert node.post("schedule.json", project="deployed", spider="marker") == {
            "status": "error", "message": "project 'deployed' not found", "node_name": node.name}

    for blocker in (blockers["node1"], blockers["node2"]):
        cancel_and_wait(cluster, "example", blocker)


# --- a huge backlog --------------------------------------------------------------------------------------------


def test_listjobs_pages_a_large_backlog_in_claim_order(database_url, tmp_path, admin_connection):
    backlog = 20_000
    with LocalCluster(database_url, 1, directory=tmp_path / "nodes", config={"max_proc": "1"}) as cluster:
        (node,) = cluster.nodes
        # Enough pending jobs that listing them all would be slow; the node runs one (a long sleeper) at a time.
        with admin_connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO spider_job (project, spider, job, priority, message, status, created_time)
                SELECT 'example', 'sleeper', 'backlog-' || i, i %% 3,
                       jsonb_build_object('name', 'sleeper', '_job', 'backlog-' || i, 'seconds', '300'),
                       'pending', now()
                FROM generate_series(1, %s) AS i
                """,
                (backlog,),
            )
        wait_for(lambda: node.get("listjobs.json", pending_limit=0)["running"], 30, "the node to start one")

        started = time.monotonic()
        first_page = node.get("listjobs.json")
        default_page_seconds = time.monotonic() - started
        assert len(first_page["pending"]) == 1000 and first_page["pending_next_offset"] == 1000
        assert default_page_seconds < 2, f"listjobs.json took {default_page_seconds:.2f}s"
        # daemonstatus.json counts up to 10,000 pending jobs; beyond, it says so and gives Postgres's estimate. It
        # answers within a second whatever the database does: "unreachable" when the counts take longer (a loaded
        # machine), so the counts are read from its first answer that has them.
        def counted():
            answer = node.get("daemonstatus.json")
            assert answer["status"] == "ok" or answer.get("database") == "unreachable", answer
            return answer if answer["status"] == "ok" else None

        daemonstatus = wait_for(counted, 30, "daemonstatus.json with the counts")
        assert daemonstatus["cluster"]["pending_exact"] is False
        assert daemonstatus["pending"] == daemonstatus["cluster"]["pending"] >= 10_000
        with admin_connection.cursor() as cursor:
            cursor.execute("ANALYZE spider_job")  # what autovacuum does on a busy queue
        estimated = wait_for(counted, 30, "daemonstatus.json with the counts")["pending"]
        assert abs(estimated - (backlog - 1)) < backlog * 0.05

        listed, offset = [], 0
        while offset is not None:
            page = node.get("listjobs.json", project="example", pending_limit=7000, pending_offset=offset)
            listed += [entry["id"] for entry in page["pending"]]
            offset = page["pending_next_offset"]
        with admin_connection.cursor() as cursor:
            cursor.execute("SELECT job FROM spider_job WHERE status = 'pending' ORDER BY priority DESC, id")
            assert listed == [row[0] for row in cursor.fetchall()]
        assert listed[:1000] == [entry["id"] for entry in first_page["pending"]]
        assert node.get("listjobs.json", pending_limit=-1)["message"] == (
            "pending_limit and pending_offset may not be negative")
        with admin_connection.cursor() as cursor:
            cursor.execute("DELETE FROM spider_job WHERE status = 'pending'")
        cancel_and_wait(cluster, "example", node.get("listjobs.json")["running"][0]["id"])


# --- one clock -------------------------------------------------------------------------------------------------

# Three nodes whose clocks disagree: one in UTC, one fourteen hours ahead (its zone), one ten hours behind (its zone)
# and two more (its clock, through Debian's libfaketime).
CLOCKS = {
    "utc": {"TZ": "UTC"},
    "kiritimati": {"TZ": "Pacific/Kiritimati"},
    "skewed": {"TZ": "America/Adak", **skewed_clock("-2h")},
}


def page_rows(node, section: str) -> dict[str, dict[str, str]]:
    """The rows of one section (Running, Finished) of the node's /jobs, in page order: {job: {header: cell}}."""
    with urllib.request.urlopen(f"{node.url}jobs", timeout=30) as response:
        page = response.read().decode()
    headers = re.findall(r"<th>(.*?)</th>", page.split("</thead>")[0])
    section_html = page.split(f"<th colspan=\"{len(headers)}\">{section}</th>")[1].split("</tbody>")[0]
    rows = [dict(zip(headers, re.findall(r"<td>(.*?)</td>", row, re.S)))
            for row in re.findall(r"<tr>\n(.*?)</tr>", section_html, re.S)]
    return {row["Job"]: row for row in rows if "Job" in row}


def test_nodes_in_other_time_zones_or_with_skewed_clocks_keep_finished_jobs_in_true_order(
    database_url, start_cluster, tmp_path
):
    nodes = {name: start_cluster(database_url, 1, name_prefix=name, env=env, max_proc="1", finished_to_keep="2")
             .nodes[0] for name, env in CLOCKS.items()}
    # One crawl per node (one slot each), ending in this order whichever node runs which.
    durations = {"first": 2, "second": 10, "third": 18}
    for job, seconds in durations.items():
        schedule(nodes["utc"], "example", "sleeper", jobid=job, seconds=str(seconds))
    ran = wait_for(lambda: {job: runs_of(tmp_path, job)[0]["node"] for job in durations if runs_of(tmp_path, job)}
                   if all(runs_of(tmp_path, job) for job in durations) else None, 60, "the three crawls")
    assert sorted(ran.values()) == sorted(f"{name}1" for name in CLOCKS)  # every clock ran one

    # While the last one runs, the skewed node measures its runtime on the database's clock, not two hours off.
    running = wait_for(lambda: page_rows(nodes["skewed"], "Running").get("third"), 30, "the third on the page")
    assert running["Runtime"].startswith("0:00:"), running

    database_times = "SELECT job, start_time, end_time, now() - end_time FROM spider_job ORDER BY end_time DESC"
    finished = wait_for(lambda: len(query(database_url, database_times)) == 2
                        and query(database_url, "SELECT bool_and(status = 'terminated') FROM spider_job") == [(True,)]
                        and query(database_url, database_times), 60, "the last two finished, the first pruned")
    # The table: true order, each time a moment ago on the database's clock; finished_to_keep pruned the oldest
    # (and its stored log).
    assert [row[0] for row in finished] == ["third", "second"]
    assert all(datetime.timedelta(0) <= ago < datetime.timedelta(seconds=30) for *_, ago in finished), finished
    assert query(database_url, "SELECT count(*) FROM job_log AS l JOIN spider_job AS j ON j.id = l.job_id "
                               "WHERE j.job = 'first'") == [(0,)]
    ends = {job: end for job, _, end, _ in finished}
    for name, env in CLOCKS.items():
        # Every node lists them in that order, in its own local time as Scrapyd does (str of a naive datetime).
        listed = nodes[name].get("listjobs.json", project="example")["finished"]
        zone = zoneinfo.ZoneInfo(env["TZ"])
        assert [(entry["id"], entry["end_time"]) for entry in listed] == [
            (job, str(ends[job].astimezone(zone).replace(tzinfo=None))) for job in ("third", "second")]
        page = page_rows(nodes[name], "Finished")
        assert list(page) == ["third", "second"]
        assert page["third"]["Finish"] == str(ends["third"].astimezone(zone).replace(tzinfo=None, microsecond=0))
