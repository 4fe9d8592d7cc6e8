"""Leases under stalls and cuts: a database that stops answering, or one node cut off from it, while crawls run.

A stall (every Postgres process stopped with SIGSTOP, as a storage stall or a VM pause looks from the nodes) is
not a death: no job is taken over and none runs twice. A node cut off from the database (a TCP forwarder in front
of Postgres that stops forwarding, without closing anything) loses its jobs to the others after the lease; with
``on_lease_lost = stop`` its crawls are gone before the others start theirs. What counts is what the crawls
record themselves (runs.jsonl) and which of their processes are alive, sampled by the test. During a stall a node's
HTTP never freezes: daemonstatus.json and alive.json answer within a second while other requests wait.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

import pytest

from helpers import health, jobs, query, runs, runs_of, schedule, timed, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.local.devdb import free_port
from scrapyd_pgqueue.store import AllJobsStore, JobStore
from scrapyd_pgqueue.web.offload import WEB_THREADS

# Short leases and timings, so that a stall or cut of two leases takes seconds: with a lease of 6 s, stop sends
# SIGTERM after 6 - 2 - 1 = 3 s without a renewed lease, SIGKILL 1 s later, 2 s before the lease expires on the
# database's clock. The same tests measure the documented figures (docs/explanation/leases.md) at real scale (lease 30 s, a 45 s outage, the
# default database_timeout), given these variables:
#   SCRAPYD_PGQUEUE_STALL_LEASE=30 SCRAPYD_PGQUEUE_STALL_OUTAGE=45 SCRAPYD_PGQUEUE_STALL_TIMEOUT=30 \
#   python -m pytest tests/test_stalls.py -s
LEASE = float(os.environ.get("SCRAPYD_PGQUEUE_STALL_LEASE", "6"))
OUTAGE = float(os.environ.get("SCRAPYD_PGQUEUE_STALL_OUTAGE", str(2 * LEASE)))
DATABASE_TIMEOUT = float(os.environ.get("SCRAPYD_PGQUEUE_STALL_TIMEOUT", "3"))
FAST = {
    "lease_seconds": f"{LEASE:g}", "heartbeat_interval": f"{LEASE / 6:g}", "poll_interval": "1",
    "stop_timeout": f"{LEASE / 6:g}", "database_timeout": f"{DATABASE_TIMEOUT:g}", "max_proc": "2",
}


class PidWatch(threading.Thread):
    """Samples every crawl process that recorded a run: when each was last seen alive (crawls run on this host)."""

    def __init__(self, tmp_path):
        super().__init__(daemon=True)
        self.tmp_path = tmp_path
        self.last_alive: dict[int, float] = {}
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(0.05):
            for run in runs(self.tmp_path):
                if _alive(run["pid"]):
                    self.last_alive[run["pid"]] = time.time()

    def overlaps(self, job_runs: list[dict]) -> list[float]:
        """Seconds each later run of one job started before the previous run's process was last seen alive."""
        ordered = sorted(job_runs, key=lambda run: run["started"])
        return [
            self.last_alive.get(earlier["pid"], earlier["started"]) - later["started"]
            for earlier, later in zip(ordered, ordered[1:])
            if self.last_alive.get(earlier["pid"], earlier["started"]) > later["started"]
        ]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


class Forwarder(threading.Thread):
    """A TCP forwarder to Postgres that can be cut: it then stops accepting and moving bytes, closing nothing, as a
    path that went silent does (the kernel still completes handshakes and acknowledges what was sent)."""

    def __init__(self, target_port: int):
        super().__init__(daemon=True)
        self.target_port = target_port
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.flowing = threading.Event()
        self.flowing.set()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []

    @property
    def url_for(self):
        return lambda url: url.replace(f":{self.target_port}/", f":{self.port}/")

    def cut(self):
        self.flowing.clear()

    def heal(self):
        self.flowing.set()

    def run(self):
        while True:
            self.flowing.wait()
            readable = [self.listener] + [end for pair in self.pairs for end in pair]
            for sock in select.select(readable, [], [], 0.05)[0]:
                if not self.flowing.is_set():
                    break
                if sock is self.listener:
                    client, _ = self.listener.accept()
                    try:
                        self.pairs.append((client, socket.create_connection(("127.0.0.1", self.target_port))))
                    except OSError:
                        client.close()
                    continue
                pair = next((pair for pair in self.pairs if sock in pair), None)
                if pair is None:  # closed earlier in this round, with its other end
                    continue
                other = pair[1] if sock is pair[0] else pair[0]
                try:
                    data = sock.recv(65536)
                    if data:
                        other.sendall(data)
                        continue
                except OSError:
                    pass
                self.pairs.remove(pair)
                for end in pair:
                    end.close()


def log_count(node, text: str) -> int:
    return node.logfile.read_text().count(text)


@pytest.fixture
def watch(tmp_path):
    pids = PidWatch(tmp_path)
    pids.start()
    yield pids
    pids.stopping.set()


def test_a_stall_longer_than_the_lease_runs_nothing_twice_and_a_schedule_during_it_is_an_answer_in_bounds(
    stoppable_database, start_cluster, tmp_path, watch
):
    url, admin_url, server = stoppable_database
    cluster = start_cluster(url, 3, **FAST)
    names = [f"job{i}" for i in range(6)]
    for i, job in enumerate(names):  # they end during the stall: their finishes wait in the nodes
        schedule(cluster.nodes[i % 3], job, seconds=f"{LEASE + OUTAGE / 2 + i % 2:g}")
    wait_for(lambda: {run["job"] for run in runs(tmp_path)} == set(names), 60, "every crawl to start")
    time.sleep(LEASE)  # every node has beaten promptly for a whole lease: recovery is armed everywhere

    with server.paused():
        stalled_at = time.monotonic()
        seconds, answer = timed(cluster.nodes[0], "post", "schedule.json", timeout=DATABASE_TIMEOUT + 10,
                                project="example", spider="sleeper", jobid="during-stall")
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - stalled_at)))
    print(f"stall of {OUTAGE:g}s, lease {LEASE:g}s: schedule.json during it answered in {seconds:.1f}s: {answer}")

    wait_for(lambda: {state[0] for state in jobs(admin_url, *names).values()} == {"terminated"}, 60,
             "every job to be recorded")
    time.sleep(LEASE + 2)  # a lease of prompt heartbeats later, recovery would have run: nothing may be taken over
    table = jobs(admin_url)
    assert seconds < DATABASE_TIMEOUT + 2  # and the request's own way
    if answer["status"] == "ok":  # a job runs if and only if its schedule was answered "ok"
        names.append("during-stall")
        wait_for(lambda: jobs(admin_url, "during-stall")["during-stall"][0] == "terminated", 60, "it to finish")
        table = jobs(admin_url)
    else:
        assert "did not answer" in answer["message"] or "no answer" in answer["message"], answer
    assert sorted(table) == sorted(names)
    assert {job: state[:2] + state[3:] for job, state in table.items()} == {
        job: ("terminated", "finished", 1) for job in names
    }
    assert sorted(run["job"] for run in runs(tmp_path)) == sorted(names)  # each crawl ran exactly once


# Requests that wait for the database, more than the node's web threads: the pool is full during the stall.
WAITING_REQUESTS = [
    ("listjobs.json", {}), ("status.json", {"job": "nope"}), ("listversions.json", {"project": "example"}),
    ("listperiodic.json", {}), ("tree.json", {"project": "example", "job": "nope"}),
    ("listjobs.json", {"project": "example"}),
]


def test_during_a_stall_daemonstatus_and_the_liveness_check_answer_within_a_second_and_other_requests_wait(
    stoppable_database, start_cluster
):
    url, admin_url, server = stoppable_database
    [node] = start_cluster(url, 1, username="operator", password="stall-s3cret", **FAST).nodes
    assert len(WAITING_REQUESTS) > WEB_THREADS
    waited = []  # (endpoint, seconds, answer, answered after the stall)
    quick = []  # (endpoint, seconds, answer)
    checks = {}

    def wait_for_the_database(endpoint, params):
        seconds, answer = timed(node, "get", endpoint, timeout=2 * OUTAGE + 60, **params)
        waited.append((endpoint, seconds, answer, not stalled.is_set()))

    def run_health_checks():
        checks["alive"], checks["ready"] = health(node), health(node, "--ready")

    stalled = threading.Event()
    with server.paused():
        stalled.set()
        stalled_at = time.monotonic()
        threads = [threading.Thread(target=wait_for_the_database, args=request) for request in WAITING_REQUESTS]
        threads.append(threading.Thread(target=run_health_checks))
        for thread in threads:
            thread.start()
        while time.monotonic() - stalled_at < OUTAGE:
            for endpoint in ("daemonstatus.json", "alive.json"):
                quick.append((endpoint, *timed(node, "get", endpoint, timeout=10)))
        stalled.clear()
    for thread in threads:
        thread.join(2 * OUTAGE + 60)
    slowest = {endpoint: max(seconds for name, seconds, _ in quick if name == endpoint)
               for endpoint in ("daemonstatus.json", "alive.json")}
    print(f"stall of {OUTAGE:g}s, database_timeout {DATABASE_TIMEOUT:g}s: {len(quick)} quick answers, slowest "
          f"{slowest}; waiting requests answered in {sorted(round(seconds, 1) for _, seconds, _, _ in waited)} s")

    for endpoint, seconds, answer in quick:
        assert seconds < 1.0, (endpoint, seconds, answer)
        if endpoint == "alive.json":
            assert answer == {"status": "ok", "node_name": "node1"}
        else:  # said, not hung: not ready, and why
            assert answer["status"] == "error" and answer["message"].startswith("the job queue is unavailable: ")
            assert answer["database"] == "unreachable" and answer["running"] == 0, answer
    assert checks["alive"].returncode == 0, checks["alive"].stderr
    assert checks["ready"].returncode == 1 and "unavailable" in checks["ready"].stderr

    assert len(waited) == len(WAITING_REQUESTS)
    for endpoint, seconds, answer, after_the_stall in waited:
        assert seconds > 1.0, (endpoint, seconds, answer)  # they did wait for the database
        assert answer["status"] == "error" or after_the_stall, (endpoint, answer)

    # After the stall, everything answers normally.
    wait_for(lambda: node.get("daemonstatus.json", timeout=5)["status"] == "ok", DATABASE_TIMEOUT + 10,
             "daemonstatus.json to be ok again")
    for endpoint, params in WAITING_REQUESTS:
        answer = node.get(endpoint, timeout=10, **params)
        assert answer["status"] == "ok" or answer["message"] == "job 'nope' not found in project 'example'", answer
    assert health(node, "--ready").returncode == 0


def test_with_stop_a_stall_longer_than_the_lease_stops_the_crawls_and_runs_them_again_never_two_at_once(
    stoppable_database, start_cluster, tmp_path, watch
):
    url, admin_url, server = stoppable_database
    cluster = start_cluster(url, 3, on_lease_lost="stop", **FAST)
    names = [f"job{i}" for i in range(3)]
    for i, job in enumerate(names):  # would end after the stall: stopped during it
        schedule(cluster.nodes[i], job, seconds=f"{LEASE + OUTAGE:g}")
    wait_for(lambda: {run["job"] for run in runs(tmp_path)} == set(names), 60, "every crawl to start")
    time.sleep(LEASE)
    with server.paused():
        time.sleep(OUTAGE)
    wait_for(lambda: {state[0] for state in jobs(admin_url, *names).values()} == {"terminated"},
             2 * LEASE + OUTAGE + 60, "every job to run again and finish")

    table = jobs(admin_url, *names)
    overlaps = {job: watch.overlaps(runs_of(tmp_path, job)) for job in names}
    stopped = sum(log_count(node, "sending SIGTERM") for node in cluster.nodes)
    print(f"stop, stall of {OUTAGE:g}s, lease {LEASE:g}s: runs {[len(runs_of(tmp_path, job)) for job in names]}; "
          f"crawls stopped {stopped}; overlaps (s) {overlaps}")
    assert stopped == 3
    assert overlaps == {job: [] for job in names}  # never two copies at once
    assert {job: [len(runs_of(tmp_path, job)), *state[:2], state[3]] for job, state in table.items()} == {
        job: [2, "terminated", "finished", 2] for job in names  # stopped once, run again to the end, nothing lost
    }


@pytest.mark.parametrize("on_lease_lost", ["stop", "keep"])
def test_a_node_cut_off_longer_than_the_lease(database, start_cluster, tmp_path, watch, on_lease_lost):
    url, admin_url = database
    forwarder = Forwarder(int(url.rsplit(":", 1)[1].split("/")[0]))
    forwarder.start()
    config = {**FAST, "on_lease_lost": on_lease_lost}
    [cut] = start_cluster(forwarder.url_for(url), 1, name_prefix="cut", **config).nodes
    names = ["long0", "long1"]
    for job in names:  # still running when the cut heals
        schedule(cut, job, seconds=f"{2 * LEASE + OUTAGE:g}")
    wait_for(lambda: {run["job"] for run in runs(tmp_path)} == set(names), 60, "both crawls to start on the cut node")
    others = start_cluster(url, 2, name_prefix="other", **config)
    time.sleep(LEASE)  # the others have beaten promptly for a whole lease: they recover expired leases

    forwarder.cut()
    cut_at = time.monotonic()
    seconds, answer = timed(cut, "post", "schedule.json", timeout=DATABASE_TIMEOUT + 10, project="example",
                             spider="sleeper", jobid="during-cut")
    wait_for(lambda: all(len(runs_of(tmp_path, job)) == 2 for job in names), 2 * LEASE + 20,
             "both jobs to run on another node")
    taken_over_after = time.monotonic() - cut_at
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - cut_at)))
    forwarder.heal()

    wait_for(lambda: {state[0] for state in jobs(admin_url, *names).values()} == {"terminated"},
             2 * LEASE + OUTAGE + 60, "both jobs to finish")
    overlaps = {job: watch.overlaps(runs_of(tmp_path, job)) for job in names}
    print(f"{on_lease_lost}, cut of {OUTAGE:g}s, lease {LEASE:g}s: taken over {taken_over_after:.1f}s after the "
          f"cut; runs {[len(runs_of(tmp_path, job)) for job in names]}; overlaps (s) {overlaps}; crawls stopped "
          f"{log_count(cut, 'sending SIGTERM')}; schedule.json during the cut answered in {seconds:.1f}s: "
          f"{answer['status']}")
    assert seconds < DATABASE_TIMEOUT + 2
    assert answer["status"] == "error"
    assert "during-cut" not in jobs(admin_url)  # refused means not stored, even once the path heals
    for job in names:
        first, second = sorted(runs_of(tmp_path, job), key=lambda run: run["started"])
        assert (first["node"], second["node"]) == ("cut1", jobs(admin_url, job)[job][2])
        assert jobs(admin_url, job)[job][:2] == ("terminated", "finished")  # the run that owns the job
    log = cut.logfile.read_text()
    if on_lease_lost == "stop":
        assert overlaps == {job: [] for job in names}  # never two copies at once
        assert log_count(cut, "sending SIGTERM") == 2
    else:
        assert all(overlaps[job] for job in names)  # kept running: the price of keep
        for job in names:
            assert f"Job {job} of project example ran on cut1 after its lease expired" in log

    # The cut node takes new work again, without a restart.
    others.stop()
    schedule(cut, "after-heal", seconds="0")
    wait_for(lambda: runs_of(tmp_path, "after-heal"), 60, "the cut node to run a new job")
    assert runs_of(tmp_path, "after-heal")[0]["node"] == "cut1"


def test_a_cancel_answered_error_during_a_stall_never_takes_effect_later(stoppable_database):
    """As schedule.json's: the cancel reaches the server, which runs it once it resumes, after the caller's time."""
    url, admin_url, server = stoppable_database
    store, cluster = JobStore.for_url(url), AllJobsStore.for_url(url)
    store.enqueue("p", {"name": "s", "_job": "running"})
    store.claim_next_jobs(["p"], 1, node="n", worker="w")
    store.enqueue("p", {"name": "s", "_job": "waiting"})
    rows = "SELECT * FROM spider_job ORDER BY id"
    before = query(admin_url, rows)
    backends = "SELECT pid FROM pg_stat_activity WHERE application_name = 'scrapyd-pgqueue'"
    for job in ("waiting", "running"):
        cluster.job_status(job, "p")  # a pooled connection is open: the cancel is sent on it, into the stall
        open_before = len(query(admin_url, backends))
        with server.paused(), pytest.raises(db.DatabaseError, match="no answer within 2 s"), db.deadline(2):
            cluster.cancel_job("p", job, "KILL")
        # The client closed that connection; its server process ends once it has run what it received.
        wait_for(lambda: len(query(admin_url, backends)) < open_before, 30, "the late cancel to have run")
        assert query(admin_url, rows) == before, f"the cancel of job {job!r} answered an error, then took effect"
    assert cluster.cancel_job("p", "running", "KILL") == "running"  # in time, it does
