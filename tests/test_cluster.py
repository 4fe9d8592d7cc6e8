"""End to end: real Scrapyd nodes on one Postgres queue, scheduled through real HTTP, running real crawls.

Every crawl of the example project appends one line to ``runs.jsonl`` (EXAMPLE_RECORD_DIR): which job, on
which node, when the spider started. That file and each node's ``listjobs.json`` are what a user would look at.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
from pathlib import Path

from helpers import wait_for
from scrapyd_pgqueue.local.cluster import LocalCluster

NODES = 3
MAX_PROC = 2
SLOTS = NODES * MAX_PROC
# poll_interval is Scrapyd's default: NOTIFY, not polling, is what makes these tests quick.
NODE_CONFIG = {"max_proc": str(MAX_PROC), "poll_interval": "5", "finished_to_keep": "1000"}
EGG_PROJECT = "eggproject"  # the example project once more, deployed as an egg to every node


# --- helpers ---------------------------------------------------------------------------------------------------




def read_runs(record_dir: Path) -> list[dict]:
    """Every crawl that started so far, one record each (see example_project/example/recording.py)."""
    try:
        text = (record_dir / "runs.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def runs_by_job(record_dir: Path, jobs) -> dict[str, list[dict]]:
    runs = collections.defaultdict(list)
    for run in read_runs(record_dir):
        if run["job"] in jobs:
            runs[run["job"]].append(run)
    return runs


def wait_until_started(record_dir: Path, jobs, timeout: float = 120) -> dict[str, list[dict]]:
    """Wait until every job of ``jobs`` has started at least once; return their runs by job id."""
    jobs = set(jobs)

    def all_started():
        runs = runs_by_job(record_dir, jobs)
        return runs if runs.keys() == jobs else None

    return wait_for(all_started, timeout, f"{len(jobs)} jobs to start")


def finished_everywhere(cluster: LocalCluster, jobs) -> bool:
    """Whether every node's listjobs.json lists all of ``jobs`` as finished, and nothing pending or running."""
    for node in cluster.nodes:
        listed = node.get("listjobs.json")
        if listed["pending"] or listed["running"] or not set(jobs) <= {job["id"] for job in listed["finished"]}:
            return False
    return True


def wait_until_finished_everywhere(cluster: LocalCluster, jobs, timeout: float = 120) -> None:
    # Not too often: listjobs.json on every node costs the nodes (and the 2 shared cores) more than a file read.
    wait_for(lambda: finished_everywhere(cluster, jobs), timeout, f"{len(jobs)} jobs finished on every node", 1.0)


def schedule(node, project: str, spider: str, priority: float = 0, **spider_args) -> str:
    """POST schedule.json to ``node``; return the job id."""
    answer = node.post("schedule.json", project=project, spider=spider, priority=str(priority), **spider_args)
    assert answer["status"] == "ok", answer
    return answer["jobid"]


@contextlib.contextmanager
def running_cluster(database_url: str, directory: Path, record_dir: Path, egg: Path | None = None):
    """A running cluster knowing the baked-in ``example`` project, and ``eggproject`` when given its egg."""
    env = {"EXAMPLE_RECORD_DIR": str(record_dir)}
    with LocalCluster(database_url, NODES, directory=directory, config=NODE_CONFIG, env=env) as cluster:
        if egg is not None:
            # To every node: needed where each node keeps its own eggs (Scrapyd's egg storage), harmless else.
            for node in cluster.nodes:
                answer = node.post("addversion.json", project=EGG_PROJECT, version="1", egg=egg.read_bytes())
                assert answer["status"] == "ok", answer
        yield cluster


def warm_up(nodes, projects) -> None:
    """Have each node list each project's spiders now rather than at its first schedule.json.

    schedule.json runs `scrapy list` the first time a node sees a project (seconds, on a busy machine, with
    the node's reactor blocked), so tests that depend on timing pay it before they start the clock.
    """
    for node, project in itertools.product(nodes, projects):
        assert node.get("listspiders.json", project=project)["spiders"] == ["quotes", "site", "sleeper", "stubborn", "ticker"]


def assert_every_node_takes_jobs(cluster: LocalCluster, record_dir: Path) -> None:
    """As many jobs as the cluster has slots, each long enough that all run at once: every node takes its share.

    A node whose poller had died would take none, and the others cannot take more than their own slots.
    """
    warm_up(cluster.nodes, ["example"])
    nodes = itertools.cycle(cluster.nodes)
    # Long enough that none ends before the last starts, also on a loaded machine (2 s was not: a node that finished
    # one took the next job before a peer's claim).
    jobs = [schedule(next(nodes), "example", "sleeper", seconds="8") for _ in range(SLOTS)]
    runs = wait_until_started(record_dir, jobs)
    assert collections.Counter(run[0]["node"] for run in runs.values()) == {
        node.name: MAX_PROC for node in cluster.nodes
    }
    wait_until_finished_everywhere(cluster, jobs)


# --- tests -----------------------------------------------------------------------------------------------------


def test_every_job_of_two_projects_runs_exactly_once_across_the_nodes(database_url, tmp_path, record_dir, egg):
    with running_cluster(database_url, tmp_path / "nodes", record_dir, egg) as cluster:
        nodes = itertools.cycle(cluster.nodes)
        priorities = itertools.cycle([0, 3, -1, 1.5, 0, 10])
        kinds = itertools.cycle([
            ("example", "sleeper", {"seconds": "0"}),
            (EGG_PROJECT, "quotes", {}),
            (EGG_PROJECT, "sleeper", {"seconds": "0.2"}),
            ("example", "quotes", {}),
        ])
        scheduled = {}  # job id -> (project, spider)
        for _ in range(60):
            project, spider, spider_args = next(kinds)
            scheduled[schedule(next(nodes), project, spider, next(priorities), **spider_args)] = (project, spider)

        wait_until_started(record_dir, scheduled, timeout=300)
        wait_until_finished_everywhere(cluster, scheduled)

        runs = runs_by_job(record_dir, scheduled)
        assert {job: len(runs.get(job, [])) for job in scheduled} == {job: 1 for job in scheduled}
        assert {job: runs[job][0]["spider"] for job in scheduled} == {job: s for job, (_, s) in scheduled.items()}
        assert len({run[0]["node"] for run in runs.values()}) >= 2
        for node in cluster.nodes:
            finished = {job["id"]: (job["project"], job["spider"]) for job in node.get("listjobs.json")["finished"]}
            assert finished == scheduled, f"listjobs.json of {node.name}"


def test_high_priority_job_overtakes_a_backlog_of_another_project(database_url, tmp_path, record_dir, egg):
    with running_cluster(database_url, tmp_path / "nodes", record_dir, egg) as cluster:
        entry = cluster.nodes[0]  # where jobs are scheduled; any node would do
        warm_up([entry], ["example", EGG_PROJECT])
        # Hold every slot. One blocker ends 10 s before the others, so exactly one slot frees first: the job it
        # takes is the queue's choice alone, not a race between crawl start-ups (seconds on a busy machine).
        blockers = [schedule(entry, "example", "sleeper", seconds="5")]
        blockers += [schedule(entry, "example", "sleeper", seconds="15") for _ in range(SLOTS - 1)]
        wait_until_started(record_dir, blockers)

        backlog = [schedule(entry, EGG_PROJECT, "sleeper", priority=p) for p in (0, 2, -5, 0)]
        urgent = schedule(entry, "example", "sleeper", priority=10)
        pending = {job["id"] for job in entry.get("listjobs.json")["pending"]}
        assert pending == {*backlog, urgent}, "the blockers ended before the test could queue its jobs"

        runs = wait_until_started(record_dir, [*backlog, urgent])
        assert all(runs[urgent][0]["started"] < runs[job][0]["started"] for job in backlog)
        wait_until_finished_everywhere(cluster, [*blockers, *backlog, urgent])


def test_nodes_keep_scheduling_after_database_errors(database_url, admin_connection, tmp_path, record_dir):
    with running_cluster(database_url, tmp_path / "nodes", record_dir) as cluster:
        pids = [node.process.pid for node in cluster.nodes]
        with admin_connection.cursor() as cursor:
            # Every node connection (queue pool and NOTIFY listener) dies while the nodes are idle.
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchone()[0] >= NODES
        nodes = itertools.cycle(cluster.nodes)
        jobs = [schedule(next(nodes), "example", "sleeper") for _ in range(NODES)]
        wait_until_started(record_dir, jobs)
        wait_until_finished_everywhere(cluster, jobs)
        assert {job: len(runs) for job, runs in runs_by_job(record_dir, jobs).items()} == {job: 1 for job in jobs}

        # Then every node's claim fails outright (the table is gone) until the table is back.
        def claim_failures(node) -> int:
            return node.logfile.read_text().count("Claiming jobs failed")

        failures_before = [claim_failures(node) for node in cluster.nodes]
        with admin_connection.cursor() as cursor:
            cursor.execute("ALTER TABLE spider_job RENAME TO spider_job_away")
        try:
            for node, before in zip(cluster.nodes, failures_before):
                wait_for(lambda: claim_failures(node) > before, 30, f"{node.name} to fail a claim")
        finally:
            with admin_connection.cursor() as cursor:
                cursor.execute("ALTER TABLE spider_job_away RENAME TO spider_job")

        assert_every_node_takes_jobs(cluster, record_dir)
        assert [node.process.pid for node in cluster.nodes] == pids
        assert all(node.process.poll() is None for node in cluster.nodes)


def test_nodes_racing_for_one_job_at_a_time_all_keep_working(database_url, tmp_path, record_dir):
    with running_cluster(database_url, tmp_path / "nodes", record_dir) as cluster:
        # Each job wakes every node with a free slot; one claims it and the others find nothing (where
        # Scrapyd's own poller would stop for good). The next job is scheduled once this one is claimed.
        nodes = itertools.cycle(cluster.nodes)
        raced = []
        for _ in range(6):
            node = next(nodes)
            raced.append(schedule(node, "example", "sleeper"))
            wait_for(lambda: not node.get("listjobs.json")["pending"], 30, f"job {raced[-1]} to be claimed", 0.1)
        runs = wait_until_started(record_dir, raced)
        assert {job: len(runs[job]) for job in raced} == {job: 1 for job in raced}

        assert_every_node_takes_jobs(cluster, record_dir)
