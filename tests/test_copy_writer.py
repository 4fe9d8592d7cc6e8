"""A node's big batches stored by its COPY helper (``node/copy_writer.py``): real nodes, a real Postgres, the helper a
real process of the node's. (Its refusals, word for word the node's own, are in test_bad_input.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import requests
from sqlalchemy import make_url

from helpers import SECRET, ConnectionSampler, query, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.job_rules.options import NO_OPTIONS
from scrapyd_pgqueue.node.copy_writer import COPY_MIN_JOBS, LEFT_IDLE, CopyWriter

QUIET = {"poll_interval": "3600", "listen_notify": "off"}  # the node claims nothing: every job stays pending
BIG = COPY_MIN_JOBS + 50


def post_batch(node, prefix: str, count: int = BIG, timeout: float = 60) -> dict:
    jobs = [{"spider": "sleeper", "jobid": f"{prefix}-{i}", "args": {"seconds": "1"}} for i in range(count)]
    return post_jobs(node, jobs, timeout)


def post_jobs(node, jobs: list[dict], timeout: float = 60) -> dict:
    response = requests.post(f"{node.url}schedule_batch.json", json={"project": "example", "jobs": jobs},
                             timeout=timeout)
    assert response.status_code == 200, response.text
    return response.json()


def stored(url, prefix: str) -> list[str]:
    """The job ids of ``prefix``'s batch in the queue, in row order."""
    return [row[0] for row in query(url, "SELECT job FROM spider_job WHERE job LIKE %s ORDER BY id", (f"{prefix}-%",))]


def helper_pids(node) -> list[int]:
    """The node's COPY helper processes (children of its process)."""
    found = subprocess.run(["pgrep", "-P", str(node.process.pid), "-f", "scrapyd_pgqueue.node.copy_helper"],
                           capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def test_a_big_batch_is_stored_by_the_helper_within_the_nodes_connections_and_no_secret_in_sight(
    database, start_cluster
):
    url, admin_url = database
    [node] = start_cluster(url, 1, **QUIET).nodes
    answer = post_batch(node, "first")
    assert answer["status"] == "ok" and answer["jobids"] == [f"first-{i}" for i in range(BIG)]
    assert stored(admin_url, "first") == answer["jobids"]

    [pid] = helper_pids(node)
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline, open(f"/proc/{pid}/environ", "rb") as environ:
        assert SECRET.encode() not in cmdline.read() + environ.read()
    # Its connection, named for the node, takes a slot of the node's pool while it stores a batch: the node's
    # connections stay database_pool_size in all (listen_notify off: its pool, and its lease's own).
    batches = iter(range(20))
    with ConnectionSampler(admin_url) as sampler:
        wait_for(lambda: post_batch(node, f"sampled-{next(batches)}", 5_000)["status"] == "ok"
                 and sampler.peak.get("scrapyd-pgqueue-copy node1"), 60, "the helper's connection to be seen")
    assert sampler.peak_total <= 2, sampler.peak
    assert helper_pids(node) == [pid]  # one helper, kept between batches
    assert "scrapyd-pgqueue-copy node1" not in dict(query(
        admin_url, "SELECT application_name, 1 FROM pg_stat_activity"))  # and its connection closed after each


def test_a_killed_helper_is_replaced_and_two_batches_at_once_are_both_stored(database, start_cluster):
    url, admin_url = database
    [node] = start_cluster(url, 1, **QUIET).nodes
    assert post_batch(node, "before")["status"] == "ok"
    [killed] = helper_pids(node)
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: killed not in helper_pids(node), 10, "the killed helper to be gone")
    assert post_batch(node, "after")["status"] == "ok"
    assert len(stored(admin_url, "after")) == BIG and helper_pids(node) != [killed]

    # The helper takes one batch at a time: the other is stored by the node's own statement.
    answers = {}
    threads = [threading.Thread(target=lambda prefix=prefix: answers.update({prefix: post_batch(node, prefix)}))
               for prefix in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert {prefix: answer["status"] for prefix, answer in answers.items()} == {"left": "ok", "right": "ok"}
    assert stored(admin_url, "left") == answers["left"]["jobids"] and len(answers["left"]["jobids"]) == BIG
    assert stored(admin_url, "right") == answers["right"]["jobids"] and len(answers["right"]["jobids"]) == BIG


def test_a_stalled_database_gets_an_error_within_the_nodes_time_and_no_job(stoppable_database, start_cluster):
    url, admin_url, server = stoppable_database
    timeout = 3.0
    [node] = start_cluster(url, 1, database_timeout=f"{timeout:g}", **QUIET).nodes
    assert post_batch(node, "warm")["status"] == "ok"  # the helper is started and connected
    with server.paused():
        started = time.monotonic()
        answer = post_batch(node, "stalled", timeout=60)
        seconds = time.monotonic() - started
    assert answer["status"] == "error", answer
    assert answer["message"].startswith("the job queue is unavailable: ") and "no answer" in answer["message"]
    assert seconds < timeout + 2, seconds  # as long as the node's own statement may wait
    assert SECRET not in answer["message"]
    # The killed helper's transaction rolled back; the next batch has a new helper.
    wait_for(lambda: post_batch(node, "later")["status"] == "ok", 30, "a batch to be stored again")
    assert stored(admin_url, "stalled") == [] and len(stored(admin_url, "later")) == BIG


def test_a_big_batch_off_the_fast_path_and_one_with_held_keys_are_stored_by_the_helper(database, start_cluster):
    url, admin_url = database
    [node] = start_cluster(url, 1, **QUIET).nodes
    # Numbers as arguments: not the common form, read by the node's general path, stored by the helper all the same.
    jobs = [{"spider": "sleeper", "jobid": f"general-{i}", "args": {"seconds": i}, "unique_key": f"key-{i}"}
            for i in range(BIG)]
    answer = post_jobs(node, jobs)
    assert answer["status"] == "ok" and "existing" not in answer, answer
    assert stored(admin_url, "general") == [job["jobid"] for job in jobs]
    assert query(admin_url, "SELECT message->>'seconds' FROM spider_job WHERE job = 'general-7'") == [("7",)]

    # The same keys again, replaced: each answer names the waiting job that holds the key, which now has the new
    # arguments; a new key among them is a new job.
    again = [{"spider": "sleeper", "jobid": f"again-{i}", "args": {"seconds": str(i + 1000)}, "unique_key": f"key-{i}"}
             for i in range(BIG + 1)]
    answer = post_jobs(node, again)
    assert answer["status"] == "ok", answer
    assert answer["jobids"] == [f"general-{i}" for i in range(BIG)] + [f"again-{BIG}"]
    assert answer["existing"] == [True] * BIG + [False]
    assert query(admin_url, "SELECT message->>'seconds' FROM spider_job WHERE job = 'general-7'") == [("1007",)]


def test_a_big_batch_is_copied_through_pgbouncer_in_transaction_pooling(database, pgbouncer, start_cluster):
    url, admin_url = database
    pgbouncer.allow(make_url(url).username)
    [node] = start_cluster(pgbouncer.url_for(url), 1, **QUIET).nodes
    answer = post_batch(node, "bounced")
    assert answer["status"] == "ok", answer
    assert stored(admin_url, "bounced") == answer["jobids"] and len(answer["jobids"]) == BIG
    assert helper_pids(node)  # its helper did it


def test_a_batch_sent_as_the_idle_helper_leaves_is_stored_once_by_the_next(database):
    url, admin_url = database
    config = {"database_url": url, "database_timeout": 10.0, "tree_max_jobs": 1000,
              "application_name": "scrapyd-pgqueue-copy test", "idle_seconds": 0.5}
    writer = CopyWriter(config, {"PATH": os.environ["PATH"]}, db.get_engine(url))
    jobs = [({"name": "sleeper", "_job": f"idle-{i}"}, 0.0, NO_OPTIONS) for i in range(2 * COPY_MIN_JOBS)]
    first, second = jobs[:COPY_MIN_JOBS], jobs[COPY_MIN_JOBS:]
    try:
        assert writer.enqueue_many("example", first, by_statement)[-1].job == f"idle-{COPY_MIN_JOBS - 1}"
        gone = writer._process
        assert gone.wait(10) == LEFT_IDLE  # it left, idle
        gone.poll = lambda: None  # as if it left between the writer's look and its batch: the batch finds no reader
        assert [job.job for job in writer.enqueue_many("example", second, by_statement)] == \
            [message["_job"] for message, _, _ in second]
        assert writer._process is not gone
    finally:
        writer.stop()
    assert stored(admin_url, "idle") == [message["_job"] for message, _, _ in jobs]  # once each, in order


def by_statement(project, jobs):
    raise AssertionError("stored by the node's statement: the helper should have")
