"""Leases: a node that stops heart-beating loses its running jobs to recovery, and no late writer wins.

Store-level tests drive the statements directly with made-up process ids; the last tests use real ``scrapyd``
processes and real crawls.
"""

import contextlib
import dataclasses
import datetime
import json
import threading
import time

from helpers import ConnectionSampler, connect, jobs, query, runs_of, schedule, wait_for
from scrapyd_pgqueue import store as store_module
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.local.cluster import LocalCluster
from scrapyd_pgqueue.store import AllJobsStore, JobStore, nodes

NOW = datetime.datetime.now


def register(store, *workers):
    for worker in workers:
        store.register_node(worker=worker, name=f"node-{worker}", url=None, max_proc=1)


def silence(admin_connection, worker, seconds=60):
    """Make ``worker``'s last heartbeat ``seconds`` old, as if its process died then."""
    with admin_connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scrapyd_node SET heartbeat_time = now() - make_interval(secs => %s) WHERE id = %s",
            (seconds, worker),
        )


def rows(admin_connection):
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT job, status, outcome, worker, attempts, reason FROM spider_job ORDER BY job")
        return {row[0]: row[1:] for row in cursor.fetchall()}


def enqueue(store, *jobs, project="p"):
    for job in jobs:
        store.enqueue(project, {"name": "s", "_job": job})


def recover(store, worker="w-live", lease=30, max_attempts=3):
    """The node tick of ``worker`` with lease recovery (and nothing else to hand back): what it recovered."""
    return store.node_tick(worker=worker, lease_seconds=lease, max_attempts=max_attempts, recover=True,
                           release=False, known_ids=[], claimed_before=NOW(), prompt_seconds=60).recovered


def tick(store, worker="w-live", recover=False, release=False, known_ids=()):
    return store.node_tick(worker=worker, lease_seconds=30, max_attempts=3, recover=recover, release=release,
                           known_ids=known_ids, claimed_before=NOW() - datetime.timedelta(minutes=1),
                           prompt_seconds=60)


def finish(store, claimed, worker):
    now = NOW()
    return store.finish_job(project="p", spider="s", job=claimed.job, start_time=now, end_time=now,
                            claimed=claimed, worker=worker)


def test_an_expired_lease_sends_its_jobs_back_to_pending_with_the_attempt_counted(store, admin_connection):
    register(store, "w1", "w2", "w-live")
    enqueue(store, "a", "b", "c")
    store.claim_next_jobs(None, 2, node="node-w1", worker="w1")
    store.claim_next_jobs(None, 1, node="node-w2", worker="w2")
    silence(admin_connection, "w1")

    recovered = recover(store)

    assert sorted((job.job, job.status) for job in recovered) == [("a", "pending"), ("b", "pending")]
    after = rows(admin_connection)
    assert after["a"][:1] == after["b"][:1] == ("pending",)
    assert after["a"][3] == after["b"][3] == 1  # the lost claim stays counted
    assert after["c"][:2] == ("ongoing", None) and after["c"][2] == "w2"  # a live node keeps its job
    again = store.claim_next_jobs(None, 5, node="node-w-live", worker="w-live").jobs
    assert sorted((job.job, job.attempt) for job in again) == [("a", 2), ("b", 2)]
    assert recover(store) == []  # nothing expired any more


def test_live_nodes_and_the_recovering_node_itself_keep_their_jobs(store, admin_connection):
    register(store, "w1", "w-live")
    enqueue(store, "a", "b")
    store.claim_next_jobs(None, 1, node="node-w1", worker="w1")
    store.claim_next_jobs(None, 1, node="node-w-live", worker="w-live")
    silence(admin_connection, "w-live")  # its own heartbeat is old: still never its own jobs

    assert recover(store) == []
    assert recover(store, lease=120) == []  # a lease longer than the silence: nobody expired
    assert {job: row[0] for job, row in rows(admin_connection).items()} == {"a": "ongoing", "b": "ongoing"}


def test_a_job_out_of_attempts_ends_as_lost_with_the_reason(store, admin_connection):
    register(store, "w1", "w2", "w-live")
    enqueue(store, "a")
    for worker in ("w1", "w2"):
        store.claim_next_jobs(None, 1, node=f"node-{worker}", worker=worker)
        silence(admin_connection, worker)
        [recovered] = recover(store, max_attempts=2)

    assert recovered.status == "terminated"
    status, outcome, worker, attempts, reason = rows(admin_connection)["a"]
    assert (status, outcome, worker, attempts) == ("terminated", "lost", "w2", 2)
    assert reason == "node node-w2 stopped heart-beating during attempt 2 of 2"
    [listed] = store.list_terminated(10)  # listjobs.json shows it finished, with its outcome
    assert (listed.job, listed.outcome, listed.end_time is not None) == ("a", "lost", True)
    assert store.claim_next_jobs(None, 1, node="n", worker="w-live").jobs == []  # never run again


def test_a_cancelled_running_job_is_never_handed_back_to_run_again(store, database_url, admin_connection):
    register(store, "w1", "w2", "w-live")
    enqueue(store, "dead-node", "stopping-node")
    [on_dead] = store.claim_next_jobs(["p"], 1, node="node-w1", worker="w1").jobs
    [on_stopping] = store.claim_next_jobs(["p"], 1, node="node-w2", worker="w2").jobs
    cluster = AllJobsStore.for_url(database_url)
    assert cluster.cancel_job("p", "dead-node") == cluster.cancel_job("p", "stopping-node") == "running"
    silence(admin_connection, "w1")

    [recovered] = recover(store)
    [handed_back] = store.hand_back([on_stopping], worker="w2", node="node-w2", max_attempts=3)

    assert (recovered.job, recovered.status) == ("dead-node", "terminated")
    assert (handed_back.job, handed_back.status) == ("stopping-node", "terminated")
    after = rows(admin_connection)
    assert after["dead-node"][:2] == after["stopping-node"][:2] == ("terminated", "cancelled")
    assert store.claim_next_jobs(None, 5, node="node-w-live", worker="w-live").jobs == []


def test_a_late_node_never_overwrites_a_newer_attempt_nor_finishes_twice(store, admin_connection):
    register(store, "w1", "w2")
    enqueue(store, "a")
    [first] = store.claim_next_jobs(None, 1, node="node-w1", worker="w1").jobs
    silence(admin_connection, "w1")
    recover(store, worker="w2")
    [second] = store.claim_next_jobs(None, 1, node="node-w2", worker="w2").jobs

    assert not store.mark_started(first, worker="w1", pid=1, start_time=NOW())
    assert not finish(store, first, "w1")
    assert rows(admin_connection)["a"][:4] == ("ongoing", None, "w2", 2)
    assert store.mark_started(second, worker="w2", pid=2, start_time=NOW())
    assert finish(store, second, "w2")
    assert not finish(store, second, "w2")  # a retried finish of the same claim changes nothing
    assert not finish(store, first, "w1")
    assert rows(admin_connection)["a"][:4] == ("terminated", "finished", "w2", 2)


def test_a_late_finish_is_kept_while_nobody_claimed_the_job_again(store, admin_connection):
    register(store, "w1", "w2")
    enqueue(store, "pending-again", "given-up")
    claims = {job.job: job for job in store.claim_next_jobs(None, 2, node="node-w1", worker="w1").jobs}
    silence(admin_connection, "w1")
    with admin_connection.cursor() as cursor:  # "given-up" has used its last attempt
        cursor.execute("UPDATE spider_job SET attempts = 3 WHERE job = 'given-up'")
    store_claims = {**claims, "given-up": dataclasses.replace(claims["given-up"], attempt=3)}
    recover(store, worker="w2")
    assert {job: row[:2] for job, row in rows(admin_connection).items()} == {
        "given-up": ("terminated", "lost"),
        "pending-again": ("pending", None),
    }

    # The node was only slow: its crawls ended, and nobody has run the jobs since.
    assert finish(store, store_claims["pending-again"], "w1")
    assert finish(store, store_claims["given-up"], "w1")
    assert {job: row[:2] for job, row in rows(admin_connection).items()} == {
        "given-up": ("terminated", "finished"),
        "pending-again": ("terminated", "finished"),
    }
    assert store.claim_next_jobs(None, 2, node="node-w2", worker="w2").jobs == []


def test_a_stopped_node_jobs_are_recovered_without_waiting_for_the_lease(store, admin_connection):
    register(store, "w1", "w2")
    enqueue(store, "a")
    store.claim_next_jobs(None, 1, node="node-w1", worker="w1")
    store.stop_node("w1")  # stopped without handing its job back (the database went away meanwhile, say)
    assert [(job.job, job.status) for job in recover(store, worker="w2")] == [("a", "pending")]


def test_recovery_is_one_statement_that_reads_the_running_jobs_index(store, admin_connection):
    register(store, "w1")
    with admin_connection.cursor() as cursor:  # a big table: many finished and pending jobs, a few running
        cursor.execute("""
            INSERT INTO spider_job (project, spider, job, message, status, outcome, created_time, end_time)
            SELECT 'p', 's', 'j' || i, '{"name": "s"}', CASE WHEN i % 2 = 0 THEN 'pending' ELSE 'terminated' END,
                   CASE WHEN i % 2 = 1 THEN 'finished' END, now(), now()
            FROM generate_series(1, 20000) AS i
        """)
    store.claim_next_jobs(None, 3, node="node-w1", worker="w1")
    with admin_connection.cursor() as cursor:
        cursor.execute("ANALYZE spider_job")
        cursor.execute("ANALYZE scrapyd_node")
    params = {"worker": "w2", "lease_seconds": 30.0, "max_attempts": 3, "recover": True, "release": False,
              "known_ids": [], "claimed_before": NOW(), "channel": store_module.NOTIFY_CHANNEL, "prompt_seconds": 60.0,
              "stats": "[]"}
    with store.engine.connect() as connection:
        # The tick's statement, after its SET LOCAL lock_timeout.
        statement = nodes.NODE_TICK.text.partition(";")[2]
        plan = "\n".join(connection.execute(text("EXPLAIN " + statement), params).scalars())
    assert "spider_job_ongoing_worker_idx" in plan, plan


def test_the_tick_writes_the_stats_of_its_own_current_claims_and_the_finish_replaces_them(store, admin_connection):
    register(store, "w1", "w2")
    enqueue(store, "mine", "theirs")
    claims = {job.job: job for job in store.claim_next_jobs(None, 2, node="node-w1", worker="w1").jobs}
    stale = dataclasses.replace(claims["theirs"], attempt=7)  # not the current attempt
    running = {"item_scraped_count": 3, "start_time": "2026-11-27T10:00:00"}

    written = store.node_tick(worker="w1", lease_seconds=30, max_attempts=3, recover=False, release=False,
                              known_ids=[c.id for c in claims.values()], claimed_before=NOW(), prompt_seconds=60,
                              stats=[(claims["mine"], running), (stale, {"item_scraped_count": 99})])
    assert tick(store, worker="w2").stats_written == 0  # nothing to write: the statement is the same

    def stats():
        return dict(query_rows(admin_connection, "SELECT job, stats FROM spider_job"))

    assert written.stats_written == 1 and stats() == {"mine": running, "theirs": None}
    final = {**running, "item_scraped_count": 5, "finish_reason": "finished"}
    now = NOW()
    assert store.finish_job(project="p", spider="s", job="mine", start_time=now, end_time=now,
                            claimed=claims["mine"], worker="w1", stats=final)
    assert finish(store, claims["theirs"], "w1")  # no stats reported: none stored
    assert stats() == {"mine": final, "theirs": None}


def query_rows(admin_connection, sql):
    with admin_connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def test_a_stopping_node_hands_back_only_its_own_current_claims(store, admin_connection):
    register(store, "w1", "w2")
    enqueue(store, "a", "b", "last-try")
    claims = {job.job: job for job in store.claim_next_jobs(None, 3, node="node-w1", worker="w1").jobs}
    with admin_connection.cursor() as cursor:
        cursor.execute("UPDATE spider_job SET attempts = 3 WHERE job = 'last-try'")
    last_try = dataclasses.replace(claims["last-try"], attempt=3)
    stale_b = dataclasses.replace(claims["b"], attempt=7)  # not the current attempt

    handed_back = store.hand_back([claims["a"], stale_b, last_try], worker="w1", node="node-w1", max_attempts=3)
    assert store.hand_back([claims["a"]], worker="w2", node="node-w2", max_attempts=3) == []  # not w2's

    assert sorted((job.job, job.status) for job in handed_back) == [("a", "pending"), ("last-try", "terminated")]
    after = rows(admin_connection)
    assert after["a"][:1] == ("pending",) and after["a"][3] == 1
    assert after["b"][:1] == ("ongoing",)
    assert after["last-try"][:2] == ("terminated", "interrupted")
    assert after["last-try"][4] == "node node-w1 stopped during attempt 3 of 3"


def test_claims_whose_reply_was_lost_go_back_to_pending(store, admin_connection):
    enqueue(store, "known", "lost-reply", "just-claimed")
    claims = {job.job: job for job in store.claim_next_jobs(None, 3, node="n1", worker="w1").jobs}
    with admin_connection.cursor() as cursor:
        cursor.execute("UPDATE spider_job SET start_time = start_time - interval '5 minutes' WHERE job <> 'just-claimed'")

    released = tick(store, worker="w1", release=True, known_ids=[claims["known"].id]).released

    assert [job.job for job in released] == ["lost-reply"]
    assert {job: row[0] for job, row in rows(admin_connection).items()} == {
        "known": "ongoing", "lost-reply": "pending", "just-claimed": "ongoing",
    }


def test_one_tick_renews_the_lease_recovers_releases_and_reads_cancels_eggs_and_periodic(store, admin_connection):
    from scrapyd_pgqueue.job_rules.periodic_jobs import PeriodicJob
    from scrapyd_pgqueue.job_rules.timing import Timing
    from scrapyd_pgqueue.store import EggStore, ScheduleStore

    register(store, "w1", "w-live")
    enqueue(store, "dead-node", "forgotten", "known", "cancelled")
    store.claim_next_jobs(None, 1, node="node-w1", worker="w1")
    mine = {job.job: job for job in store.claim_next_jobs(None, 3, node="node-w-live", worker="w-live").jobs}
    silence(admin_connection, "w1")
    silence(admin_connection, "w-live")
    with admin_connection.cursor() as cursor:
        cursor.execute("UPDATE spider_job SET start_time = start_time - interval '5 minutes' WHERE worker = 'w-live'")
    AllJobsStore.for_engine(store.engine).cancel_job("p", "cancelled", "TERM")
    EggStore.for_engine(store.engine).put_egg("p", "r1", b"egg")
    ScheduleStore.for_engine(store.engine).add_periodic(PeriodicJob("hourly", "p", "s", Timing(every_seconds=3600)))

    quiet = tick(store, known_ids=[mine["known"].id, mine["cancelled"].id])  # neither flag: reads, renews
    assert quiet.registered and quiet.recovered == [] and quiet.released == []
    assert [(request.job, request.signal) for request in quiet.cancels] == [("cancelled", "TERM")]
    assert quiet.eggs == {"p": (1, quiet.eggs["p"][1])}
    assert 3500 < quiet.periodic_due_in <= 3600
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT now() - heartbeat_time < interval '5 seconds' FROM scrapyd_node WHERE id = 'w-live'")
        assert cursor.fetchall() == [(True,)]

    full = tick(store, recover=True, release=True, known_ids=[mine["known"].id, mine["cancelled"].id])
    assert [(job.job, job.status) for job in full.recovered] == [("dead-node", "pending")]
    assert [(job.job, job.status) for job in full.released] == [("forgotten", "pending")]
    assert {job: row[0] for job, row in rows(admin_connection).items()} == {
        "dead-node": "pending", "forgotten": "pending", "known": "ongoing", "cancelled": "ongoing",
    }
    assert not tick(store, worker="w-gone").registered  # no node row: the caller registers again


# --- real nodes ---------------------------------------------------------------------------------------------

LEASE = {"lease_seconds": "4", "heartbeat_interval": "1", "poll_interval": "1", "max_proc": "1"}




def job_row(admin_connection, job):
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT status, outcome, node, worker, attempts FROM spider_job WHERE job = %s", (job,))
        return cursor.fetchall()


def test_a_node_restarted_under_the_same_name_recovers_its_old_jobs_through_the_old_lease(
    database_url, admin_connection, tmp_path
):
    records = tmp_path / "records"
    cluster = LocalCluster(database_url, 1, directory=tmp_path / "cluster", config=LEASE,
                           env={"EXAMPLE_RECORD_DIR": str(records)})
    [node] = cluster.nodes
    with cluster:
        node.post("schedule.json", project="example", spider="sleeper", jobid="long", seconds="3")
        wait_for(lambda: (records / "runs.jsonl").exists(), 60, "the crawl to start")
        [(_, _, _, first_worker, _)] = job_row(admin_connection, "long")
        node.kill()
        node.end_crawls()  # the crash takes the crawl with it
        killed_at = time.monotonic()
        node.start()
        node.wait_ready()

        [(status, outcome, name, worker, attempts)] = wait_for(
            lambda: [row for row in job_row(admin_connection, "long") if row[0] == "terminated"], 60,
            "the job to finish after the restart",
        )
        assert (status, outcome, name, attempts) == ("terminated", "finished", "node1", 2)
        assert worker != first_worker  # a new process: a new lease
        with admin_connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM scrapyd_node WHERE name = 'node1'")
            assert cursor.fetchone()[0] == 2
        runs = [json.loads(line) for line in (records / "runs.jsonl").read_text().splitlines()]
        assert [run["job"] for run in runs] == ["long", "long"]
        print(f"restarted node finished its old job {time.monotonic() - killed_at:.1f}s after the kill")


# on_lease_lost = stop with a heartbeat a second: a lease not renewed for lease_seconds - 2 - stop_timeout = 3 s
# stops the node's crawls.
STOP_ON_LOSS = {"on_lease_lost": "stop", "lease_seconds": "8", "heartbeat_interval": "1", "stop_timeout": "3",
                "poll_interval": "1", "max_proc": "2"}
FLOOD_SECONDS = 60


def test_a_node_whose_pool_is_held_by_its_own_work_for_a_minute_keeps_its_lease_and_its_crawl_with_3_connections(
    database, start_cluster, tmp_path
):
    url, admin_url = database
    nodes = start_cluster(url, 2, **STOP_ON_LOSS).nodes  # the other one would take the crawl over
    backlog = [({"name": "sleeper", "_job": f"later{i:05}"}, 0.0, JobOptions(delay=3600)) for i in range(5000)]
    JobStore.for_url(url).enqueue_many("example", backlog)  # a big backlog for listjobs.json, due in an hour
    schedule(nodes[0], "long", seconds=f"{FLOOD_SECONDS + 20}")
    [(name,)] = wait_for(lambda: query(admin_url, "SELECT node FROM spider_job WHERE job = 'long' AND pid IS NOT NULL"),
                         60, "the long crawl to run")
    busy = next(node for node in nodes if node.name == name)

    # The flood: every statement of the node's own work on spider_job (claims, web services) waits for a lock the
    # test holds, up to its lock_timeout (15 s) and again, so both connections of its pool stay taken; 8 clients
    # ask busy's listjobs.json and daemonstatus.json all along. Only the lease's table stays free.
    stopping = threading.Event()
    ages, waiting = [], []

    def flood():
        while not stopping.is_set():
            for endpoint in ("listjobs.json", "daemonstatus.json"):
                with contextlib.suppress(OSError):  # answered late, or an error: what the flood costs them
                    busy.get(endpoint, timeout=40, project="example")

    def sample_lease():
        while not stopping.wait(0.2):
            ages.append(query(admin_url, "SELECT extract(epoch FROM now() - heartbeat_time) FROM scrapyd_node "
                                         "WHERE name = %s AND stopped_time IS NULL", (busy.name,))[0][0])
            waiting.append(query(admin_url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                            "AND wait_event_type = 'Lock'", (f"scrapyd-pgqueue {busy.name}",))[0][0])

    with contextlib.closing(connect(admin_url)) as locker, locker.cursor() as cursor, \
            ConnectionSampler(admin_url, {busy.name: busy.process.pid}) as sampler:
        cursor.execute("BEGIN; LOCK TABLE spider_job IN ACCESS EXCLUSIVE MODE")
        threads = [threading.Thread(target=flood) for _ in range(8)] + [threading.Thread(target=sample_lease)]
        for thread in threads:
            thread.start()
        time.sleep(FLOOD_SECONDS)
        stopping.set()
        cursor.execute("ROLLBACK")
    for thread in threads:
        thread.join(60)

    print(f"{FLOOD_SECONDS} s of flood: {busy.name}'s lease at most {max(ages):.2f} s old; statements of the node "
          f"waiting on the lock at most {max(waiting)}, in {sum(map(bool, waiting))} of {len(waiting)} samples; connections held at most {sampler.held}, server backends by name "
          f"at most {sampler.peak}")
    # The node's own work held its pool: its statements waited on the lock for most of the minute (a snapshot at one
    # instant can fall between a lock_timeout and the next try).
    assert max(waiting) >= 1 and sum(map(bool, waiting)) > len(waiting) / 2
    # Its pool (2) and its listener, which carries the lease: 3 connections all along, none opened for the lease.
    assert sampler.held == {busy.name: 3}
    assert sampler.peak[f"scrapyd-pgqueue-listener {busy.name}"] == 1
    assert f"scrapyd-pgqueue-lease {busy.name}" not in sampler.peak
    assert max(ages) < 2  # renewed every heartbeat_interval (1 s), never near the 3 s that stop the crawls
    [(status, outcome, node, attempts)] = wait_for(
        lambda: [state for state in jobs(admin_url, "long").values() if state[0] == "terminated"], 60,
        "the long crawl to finish",
    )
    assert (status, outcome, node, attempts) == ("terminated", "finished", busy.name, 1)  # never stopped, never taken over
    assert [run["job"] for run in runs_of(tmp_path, "long")] == ["long"]
    assert "Lease not renewed" not in busy.logfile.read_text()
