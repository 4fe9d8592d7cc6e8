"""Nothing lost, nothing stuck: real nodes, real crawls, and a database that goes away.

Each test does something bad to a running cluster (SIGKILL a node, stop or restart Postgres, kill every session,
SIGTERM a node with crawls running) and then counts what a user would count: jobs finished, runs of each job
(the example spiders append one line per run to runs.jsonl), jobs left running. Nodes connect as a role with a
password, which no log line may show.
"""

from __future__ import annotations

import datetime
import time

from helpers import SECRET, claim_in_processes, jobs, query, runs, runs_of, schedule, timed, wait_for
from scrapyd_pgqueue.store import JobStore

# --- faults -----------------------------------------------------------------------------------------------------


def test_a_node_killed_mid_crawl_has_its_job_run_again_elsewhere_and_recorded_once(database, start_cluster, tmp_path):
    url, admin_url = database
    cluster = start_cluster(url, 2, max_proc="1")
    schedule(cluster.nodes[0], "victim", seconds="4")
    [first] = wait_for(lambda: runs_of(tmp_path, "victim"), 60, "the crawl to start")
    victim = next(node for node in cluster.nodes if node.name == first["node"])
    survivor = next(node for node in cluster.nodes if node is not victim)

    victim.kill()  # SIGKILL: no goodbye; its crawl goes on as an orphan whose result nobody records
    killed_at = time.monotonic()
    wait_for(lambda: jobs(admin_url, "victim")["victim"][2:] == (survivor.name, 2), 30, "the job to be claimed again")
    rerun_after = time.monotonic() - killed_at
    status = wait_for(lambda: jobs(admin_url, "victim")["victim"][0] == "terminated" and jobs(admin_url), 30,
                      "the job to finish")

    print(f"job claimed again {rerun_after:.1f}s after its node was killed (lease 4s)")
    assert rerun_after < 4 + 5  # the lease, then a heartbeat and a poll
    assert status == {"victim": ("terminated", "finished", survivor.name, 2)}  # one row, finished once
    assert [run["node"] for run in runs_of(tmp_path, "victim")] == [victim.name, survivor.name]
    finished = survivor.get("listjobs.json")["finished"]
    assert [job["id"] for job in finished] == ["victim"]


def test_postgres_restarted_and_sessions_killed_mid_run_every_job_finishes_exactly_once(
    stoppable_database, start_cluster, tmp_path
):
    url, admin_url, server = stoppable_database
    cluster = start_cluster(url, 3, max_proc="2")
    pids = [node.process.pid for node in cluster.nodes]
    names = [f"job{i:02}" for i in range(30)]
    for i, job in enumerate(names):
        schedule(cluster.nodes[i % 3], job, seconds="0.5")

    def finished():
        return sum(1 for status, *_ in jobs(admin_url).values() if status == "terminated")

    wait_for(lambda: finished() >= 8, 120, "a quarter of the jobs to finish")
    restarted_at = time.monotonic()
    server.restart()
    wait_for(lambda: finished() >= 18, 120, "more jobs to finish after the restart")
    back_after = time.monotonic() - restarted_at
    for _ in range(3):  # kill every session of the nodes, listeners included, while jobs run
        query(admin_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        time.sleep(0.5)  # let the nodes reconnect and claim between kills
    wait_for(lambda: finished() == 30, 120, "every job to finish")

    print(f"10 more jobs finished {back_after:.1f}s after the restart began")
    table = jobs(admin_url)
    assert sorted(table) == names  # one row per job: none lost, none duplicated
    assert {state[:2] for state in table.values()} == {("terminated", "finished")}
    ran = [run["job"] for run in runs(tmp_path)]
    assert sorted(ran) == names  # each crawl ran exactly once
    assert [node.process.pid for node in cluster.nodes] == pids
    assert all(node.process.poll() is None for node in cluster.nodes)  # no node restarted or died


def test_a_database_outage_longer_than_the_lease_loses_nothing_and_reruns_nothing(
    stoppable_database, start_cluster, tmp_path
):
    url, admin_url, server = stoppable_database
    cluster = start_cluster(url, 2, max_proc="2")
    long_jobs = [f"long{i}" for i in range(4)]
    queued = [f"queued{i}" for i in range(4)]
    for i, job in enumerate(long_jobs):
        schedule(cluster.nodes[i % 2], job, seconds="8")
    wait_for(lambda: {run["job"] for run in runs(tmp_path)} == set(long_jobs), 60, "the four long crawls to start")
    for job in queued:  # every slot is busy: these wait in the queue through the outage
        schedule(cluster.nodes[0], job, seconds="1")

    def long_crawls_ended():
        logs = [node.directory / "logs" / "example" / "sleeper" / f"{job}.log" for node in cluster.nodes
                for job in long_jobs]
        return sum("Spider closed (finished)" in log.read_text() for log in logs if log.exists()) == len(long_jobs)

    server.stop()
    down_at = time.monotonic()
    slowest = 0.0
    answers = []
    # At least three leases, and until the long crawls have ended (their finishes wait in the nodes' buffers).
    while time.monotonic() - down_at < 12 or not long_crawls_ended():
        assert time.monotonic() - down_at < 60, "the long crawls did not end"
        for node in cluster.nodes:
            for method, endpoint, params in [
                ("post", "schedule.json", {"project": "example", "spider": "sleeper"}),
                ("get", "listjobs.json", {}),
                ("get", "daemonstatus.json", {}),
                ("get", "status.json", {"job": "queued0"}),
            ]:
                seconds, answer = timed(node, method, endpoint, **params)
                slowest = max(slowest, seconds)
                answers.append((endpoint, answer))
        time.sleep(0.5)
    server.start()
    up_at = time.monotonic()
    up_clock = datetime.datetime.now().astimezone()  # start_time is the database's (timestamptz, same machine)

    print(f"slowest answer while the database was down: {slowest:.2f}s over {len(answers)} requests")
    assert slowest < 5
    for endpoint, answer in answers:
        assert answer["status"] == "error", (endpoint, answer)
        assert answer["message"].startswith("the job queue is unavailable: database at 127.0.0.1:"), answer
        assert answer["node_name"] in ("node1", "node2")
        assert SECRET not in answer["message"]

    first_claim = wait_for(
        lambda: min((row[0] for row in query(admin_url, "SELECT start_time FROM spider_job WHERE job LIKE 'queued%%' "
                                                        "AND start_time IS NOT NULL")), default=None),
        30, "a queued job to be claimed",
    )
    claimed_after = (first_claim - up_clock).total_seconds()
    wait_for(lambda: all(state[0] == "terminated" for state in jobs(admin_url, *long_jobs, *queued).values())
             and len(jobs(admin_url, *long_jobs, *queued)) == 8, 60, "every job to finish")
    print(f"first queued job claimed {claimed_after:.1f}s after Postgres was back "
          f"(all finished {time.monotonic() - up_at:.1f}s after)")
    assert claimed_after < 10
    table = jobs(admin_url, *long_jobs, *queued)
    # The long jobs ended during the outage: recorded once the database was back, by the node that ran them, and
    # not recovered although every heartbeat was older than the lease when the database came back.
    assert {job: state[:2] + state[3:] for job, state in table.items()} == {
        job: ("terminated", "finished", 1) for job in long_jobs + queued
    }
    ran = sorted(run["job"] for run in runs(tmp_path))
    assert ran == sorted(long_jobs + queued)  # nothing ran twice
    assert all(node.process.poll() is None for node in cluster.nodes)


def test_a_stopping_node_records_what_ends_in_time_and_hands_back_the_rest(database, start_cluster, tmp_path):
    url, admin_url = database
    cluster = start_cluster(url, 1, max_proc="2")
    [stopping] = cluster.nodes
    schedule(stopping, "short", seconds="1")  # ends within stop_timeout (5 s)
    schedule(stopping, "long", seconds="8")  # does not: handed back, run by another node
    logs = stopping.directory / "logs" / "example" / "sleeper"
    wait_for(lambda: all((logs / f"{job}.log").exists() and "Spider opened" in (logs / f"{job}.log").read_text()
                         for job in ("short", "long")), 60, "both spiders to open")
    worker = query(admin_url, "SELECT worker FROM spider_job WHERE job = 'long'")[0][0]

    stopping.process.terminate()  # SIGTERM, as docker stop
    term_at = time.monotonic()
    other = start_cluster(url, 1, name_prefix="other", max_proc="2").nodes[0]
    stopping.wait_stopped(30)
    stopped_after = time.monotonic() - term_at

    print(f"node stopped {stopped_after:.1f}s after SIGTERM (stop_timeout 5s)")
    assert stopped_after < 5 + 3
    assert query(admin_url, "SELECT count(*) FROM spider_job WHERE worker = %s AND status = 'ongoing'", (worker,)) \
        == [(0,)]  # nothing stays running on a node that is gone
    assert query(admin_url, "SELECT stopped_time IS NOT NULL FROM scrapyd_node WHERE id = %s", (worker,)) == [(True,)]
    assert jobs(admin_url, "short")["short"] == ("terminated", "finished", "node1", 1)

    wait_for(lambda: jobs(admin_url, "long")["long"][0] == "terminated", 60, "the handed-back job to finish")
    assert jobs(admin_url, "long")["long"] == ("terminated", "finished", other.name, 2)
    assert sorted((run["job"], run["node"]) for run in runs(tmp_path)) == [
        ("long", "node1"), ("long", other.name), ("short", "node1")
    ]


# --- claims under contention ----------------------------------------------------------------------------------

CLAIMERS = 32
JOBS = 20_000


def test_32_claimer_processes_claim_each_of_20000_jobs_exactly_once(database):
    url, admin_url = database
    JobStore.for_url(url)  # the schema
    query(admin_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, created_time)
        SELECT 'p' || (i %% 5), 's', 'job' || i, i %% 11, jsonb_build_object('name', 's', '_job', 'job' || i),
               'pending', now()
        FROM generate_series(1, %s) AS i
    """, (JOBS,))

    # Forked: 32 fresh interpreters would spend longer importing than claiming. A child never touches the
    # parent's engine (engines are per process id) and leaves through os._exit, so the parent's sessions survive.
    per_worker, elapsed = claim_in_processes(url, CLAIMERS, "fork", largest_batch=8)

    claimed = [job for jobs_of_one in per_worker for job, _ in jobs_of_one]
    print(f"{CLAIMERS} processes claimed {len(claimed)} jobs in {elapsed:.1f}s ({len(claimed) / elapsed:.0f}/s)")
    assert len(claimed) == JOBS  # none lost
    assert len(set(claimed)) == JOBS  # none claimed twice
    assert {attempt for jobs_of_one in per_worker for _, attempt in jobs_of_one} == {1}
    assert sum(1 for jobs_of_one in per_worker if jobs_of_one) >= CLAIMERS // 2  # they really competed
    assert query(admin_url, "SELECT status, count(*) FROM spider_job GROUP BY status") == [("ongoing", JOBS)]

