"""The store's claim under real concurrency: separate OS processes against one table."""

import datetime

from helpers import claim_in_processes
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store import JobStore

CLAIMERS = 8
JOBS = 5000


def test_concurrent_processes_claim_every_job_exactly_once(database_url, admin_connection):
    store = JobStore.for_url(database_url)
    for i in range(JOBS):
        store.enqueue(f"project{i % 3}", {"name": "s", "_job": f"job{i}"}, priority=i % 7)

    per_worker, elapsed = claim_in_processes(database_url, CLAIMERS, "spawn")

    claimed = [job for jobs in per_worker for job, _ in jobs]
    print(f"{CLAIMERS} processes claimed {len(claimed)} jobs in {elapsed:.2f}s ({len(claimed) / elapsed:.0f}/s)")
    assert len(claimed) == JOBS  # no loss
    assert len(set(claimed)) == JOBS  # no duplicate
    assert sum(1 for jobs in per_worker if jobs) >= 2  # they really competed
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM spider_job GROUP BY status")
        assert cursor.fetchall() == [("ongoing", JOBS)]


def test_claim_takes_global_priority_order_across_projects(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("a", {"name": "s", "_job": "a-low"}, priority=0)
    store.enqueue("b", {"name": "s", "_job": "b-high"}, priority=10)
    store.enqueue("c", {"name": "s", "_job": "c-mid"}, priority=5)
    store.enqueue("a", {"name": "s", "_job": "a-mid"}, priority=5)
    claimed = store.claim_next_jobs(["a", "b", "c"], 3, node="n", worker="w").jobs
    assert [job.job for job in claimed] == ["b-high", "c-mid", "a-mid"]
    assert store.claim_next_jobs(["b", "c"], 5, node="n", worker="w").jobs == []
    assert [job.job for job in store.claim_next_jobs(None, 5, node="n", worker="w").jobs] == ["a-low"]


def test_a_recovered_claim_cannot_be_finished_by_its_late_owner(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "j"})
    [first] = store.claim_next_jobs(None, 1, node="n1", worker="w1").jobs
    # Another node now holds a newer attempt of the same job (as after a lease recovery).
    with db.transaction(store.engine) as connection:
        connection.execute(text("UPDATE spider_job SET status = 'pending'"))
    [second] = store.claim_next_jobs(None, 1, node="n2", worker="w2").jobs
    assert second.attempt == first.attempt + 1
    now = datetime.datetime.now()
    assert not store.finish_job(project="p", spider="s", job="j", start_time=now, end_time=now, claimed=first, worker="w1")
    assert store.finish_job(project="p", spider="s", job="j", start_time=now, end_time=now, claimed=second, worker="w2")


def test_a_small_project_behind_a_large_backlog_is_claimed_from_its_own_index(database_url, admin_connection):
    store = JobStore.for_url(database_url)
    with admin_connection.cursor() as cursor:  # a backlog of another project, all ranked above the small one
        cursor.execute(
            "INSERT INTO spider_job (project, spider, job, priority, message, status, created_time) "
            "SELECT 'big', 's', 'b' || i, 10, jsonb_build_object('name', 's', '_job', 'b' || i), 'pending', now() "
            "FROM generate_series(1, 50000) AS i"
        )
        cursor.execute("ANALYZE spider_job")
    store.enqueue("small", {"name": "s", "_job": "mine"}, priority=-1)
    # The plans of the claim function's statements, as auto_explain sends them to this client; the claim rolled back.
    with admin_connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; "
                       "SET auto_explain.log_nested_statements = on; SET client_min_messages = log")
        cursor.execute("BEGIN")
        cursor.execute("SELECT * FROM claim_spider_jobs(ARRAY['small'], 1, 'n', 'w', 'c')")
        cursor.execute("ROLLBACK")
    [plan] = [notice for notice in admin_connection.notices if "UPDATE spider_job" in notice]
    assert "spider_job_pending_project_idx" in plan, plan
    [claimed] = store.claim_next_jobs(["small"], 1, node="n", worker="w").jobs
    assert claimed.job == "mine"
