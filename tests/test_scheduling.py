"""Scheduling: delayed, unique, retried and limited jobs, on a real Postgres and through three real nodes.

What the crawls record (runs.jsonl) and what the table holds are the measures; the API's answers are checked
as a client reads them.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest

from helpers import jobs, query, runs_of, schedule, wait_for
from scrapyd_pgqueue import cli
from scrapyd_pgqueue.job_rules.job_requests import RefusedJob, job_from_json, options_from_fields, parse_run_at
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store import AllJobsStore, DuplicateJobError, JobStore
from scrapyd_pgqueue.store.statuses import FAILED

# --- what a client may ask (pure functions) ----------------------------------------------------------------------


def test_run_at_takes_iso_8601_with_an_offset_or_unix_seconds():
    assert parse_run_at("2026-11-23T14:00:00+01:00") == parse_run_at("2026-11-23T13:00:00Z") == 1795438800.0
    assert parse_run_at("1795438800") == parse_run_at(1795438800) == 1795438800.0
    with pytest.raises(RefusedJob, match="needs a UTC offset"):
        parse_run_at("2026-11-23T14:00:00")
    with pytest.raises(RefusedJob, match="ISO 8601"):
        parse_run_at("tomorrow")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"_run_at": "1795438800", "_delay": "5"}, "not both"),
        ({"_on_conflict": "merge"}, "on_conflict must be one of"),
        ({"_retries": "1.5"}, "retries must be an integer"),
        ({"_retries": "-1"}, "retries must be between"),
        ({"_delay": "nan"}, "delay must be a finite number"),
        ({"_retry_delay": "-3"}, "retry_delay must be between"),
        ({"_unique_scope": "tree"}, "unique_scope tree needs a unique_key"),
    ],
)
def test_bad_scheduling_fields_are_refused_with_the_reason(fields, message):
    with pytest.raises(RefusedJob, match=message):
        options_from_fields(fields)


def test_a_root_may_carry_a_tree_scoped_key():
    options = options_from_fields({"_unique_key": "home", "_unique_scope": "tree"})
    assert (options.parent, options.unique_key, options.unique_scope) == (None, "home", "tree")


def test_a_batch_job_takes_the_same_options_and_they_never_reach_the_spider():
    request = job_from_json({"spider": "s", "delay": 5, "unique_key": "k", "on_conflict": "keep", "retries": 2,
                             "retry_delay": 1.5, "args": {"page": "1"}}, default_retries=1)
    assert request.options == JobOptions(delay=5.0, unique_key="k", on_conflict="keep", retries=2, retry_delay=1.5)
    assert set(request.message) == {"page", "name", "_job", "settings"}
    assert job_from_json({"spider": "s"}, default_retries=3).options.retries == 3


# --- the store on a real Postgres ------------------------------------------------------------------------------


def claim(store, limit=10, projects=("p",)):
    return store.claim_next_jobs(list(projects), limit, node="n", worker="w")


def test_a_delayed_job_waits_for_its_time_and_the_claim_says_when(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "later"}, options=JobOptions(delay=1.5))
    first = claim(store)
    assert first.jobs == [] and 1.0 < first.next_due_in <= 1.5
    assert store.count_pending("p") == 1  # ISpiderQueue counts it as waiting
    due = wait_for(lambda: (result := claim(store)).became_due and result, 10, "the job to become due")
    assert due.became_due == 1
    assert [job.job for job in due.jobs] == ["later"]  # promoted and claimed by the same call


def test_a_claim_that_fills_its_slots_at_once_still_says_when_the_next_delayed_job_is_due(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "later"}, priority=9, options=JobOptions(delay=3600))
    for n in range(3):
        store.enqueue("p", {"name": "s", "_job": f"now-{n}"}, priority=n)
    full = claim(store, limit=2)  # the one-statement claim: no summary row, the next due time on the jobs' rows
    assert [job.job for job in full.jobs] == ["now-2", "now-1"]
    assert full.became_due == 0 and 3590 < full.next_due_in <= 3600
    short = claim(store, limit=5)  # fewer jobs than slots: the whole claim, with its summary row
    assert [job.job for job in short.jobs] == ["now-0"]
    assert short.became_due == 0 and 3590 < short.next_due_in <= 3600
    store.enqueue("p", {"name": "s", "_job": "ranked-below-the-due-one"}, priority=0)
    # Its time comes: the claim promotes it before it claims, and it ranks first.
    query(database_url, "UPDATE spider_job SET run_at = now() - interval '1 second' WHERE job = 'later'")
    due = claim(store, limit=1)
    assert [job.job for job in due.jobs] == ["later"] and due.became_due == 1 and due.next_due_in is None


def test_ten_concurrent_schedules_of_one_unique_key_leave_one_waiting_job(database_url, admin_connection):
    store = JobStore.for_url(database_url)
    barrier = threading.Barrier(10)
    answers = []

    def schedule_once(i):
        barrier.wait()
        answers.append(store.enqueue("p", {"name": "s", "_job": f"try{i}", "n": str(i)}, priority=i,
                                     options=JobOptions(unique_key="page-1", delay=100 + i)))

    threads = [threading.Thread(target=schedule_once, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = query(database_url, "SELECT job, status, priority, message->>'n' FROM spider_job")
    assert len(rows) == 1, rows
    [(job, status, priority, n)] = rows
    assert status == "delayed" and {answer.job for answer in answers} == {job}
    assert sum(not answer.existing for answer in answers) == 1
    assert priority == float(n)  # the last writer's priority and arguments together: one replace, not a mix

    moved = store.enqueue("p", {"name": "s", "_job": "again"}, options=JobOptions(unique_key="page-1"))
    assert moved.existing and moved.job == job
    assert [c.job for c in claim(store).jobs] == [job]  # replace moved it to now


def test_keep_error_and_a_running_job_with_the_same_key(database_url):
    store = JobStore.for_url(database_url)
    first = store.enqueue("p", {"name": "s", "_job": "a", "v": "1"}, options=JobOptions(unique_key="k", delay=60))
    kept = store.enqueue("p", {"name": "s", "_job": "b", "v": "2"}, options=JobOptions(unique_key="k", on_conflict="keep"))
    assert (kept.job, kept.existing) == ("a", True)
    assert query(database_url, "SELECT status, message->>'v' FROM spider_job") == [("delayed", "1")]
    with pytest.raises(DuplicateJobError, match="unique_key 'k' is held by waiting job 'a'"):
        store.enqueue("p", {"name": "s", "_job": "c"}, options=JobOptions(unique_key="k", on_conflict="error"))
    store.enqueue("p", {"name": "s", "_job": "x"}, options=JobOptions(unique_key="k"))  # replace: due now
    assert [c.job for c in claim(store).jobs] == [first.job]
    running_too = store.enqueue("p", {"name": "s", "_job": "d"}, options=JobOptions(unique_key="k"))
    assert (running_too.job, running_too.existing) == ("d", False)  # a running job does not hold its key


def test_keep_and_error_in_a_batch_beside_jobs_without_a_key(database_url):
    """A held key with keep or error, batched with jobs that have no key: kept, or refused with the reason."""
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "a", "v": "1"}, options=JobOptions(unique_key="k", delay=60))
    keep = JobOptions(unique_key="k", on_conflict="keep")
    kept, plain = store.enqueue_many("p", [({"name": "s", "_job": "b", "v": "2"}, 0, keep),
                                           ({"name": "s", "_job": "plain"}, 0)])
    assert (kept.job, kept.existing, plain.job, plain.existing) == ("a", True, "plain", False)
    with pytest.raises(DuplicateJobError, match="job 1: unique_key 'k' is held by waiting job 'a'"):
        store.enqueue_many("p", [({"name": "s", "_job": "other"}, 0),
                                 ({"name": "s", "_job": "c"}, 0, JobOptions(unique_key="k", on_conflict="error"))])
    assert query(database_url, "SELECT job, message->>'v' FROM spider_job ORDER BY id") == [("a", "1"), ("plain", None)]


def test_a_failing_job_is_retried_with_backoff_then_dead_and_requeued(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "flaky"}, options=JobOptions(retries=2, retry_delay=0.2))
    backoffs = []
    for attempt in range(3):
        [claimed] = wait_for(lambda: claim(store).jobs, 10, f"attempt {attempt + 1}")
        now, before = datetime.datetime.now(), time.time()
        store.finish_job(project="p", spider="s", job="flaky", start_time=now, end_time=now, outcome=FAILED,
                         exit_code=1, claimed=claimed, worker="w")
        after = time.time()
        [(run_at, failures)] = query(database_url, "SELECT extract(epoch FROM run_at), failures FROM spider_job")
        if run_at is None:  # out of retries: dead, no next run
            backoffs.append((None, None, failures))
        else:
            backoffs.append((float(run_at) - after, float(run_at) - before, failures))
    assert [failures for *_, failures in backoffs] == [1, 2, 3]
    # run_at = the finish's time + 0.2 s, then + 0.4 s (the finish happened between before and after)
    assert backoffs[0][0] <= 0.2 <= backoffs[0][1] and backoffs[1][0] <= 0.4 <= backoffs[1][1]
    assert backoffs[2][:2] == (None, None)
    assert jobs(database_url, "flaky")["flaky"][:2] == ("terminated", "dead")
    store.prune_terminated(0)
    assert AllJobsStore.for_url(database_url).requeue_dead(spider="s") == [("p", "flaky")]  # dead letters stay
    assert [c.job for c in claim(store).jobs] == ["flaky"]


def test_a_cancelled_job_is_never_retried(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "stopped"}, options=JobOptions(retries=3))
    [claimed] = claim(store).jobs
    now = datetime.datetime.now()
    store.finish_job(project="p", spider="s", job="stopped", start_time=now, end_time=now, outcome="cancelled",
                     exit_code=-2, claimed=claimed, worker="w")
    assert jobs(database_url, "stopped")["stopped"][:2] == ("terminated", "cancelled")


def test_a_limited_spider_never_runs_more_than_its_limit_under_concurrent_claims(database_url, admin_connection):
    store = JobStore.for_url(database_url)
    with admin_connection.cursor() as cursor:
        cursor.execute("INSERT INTO spider_limit (project, spider, max_running) VALUES ('p', 'slow', 2)")
    store.enqueue_many("p", [({"name": "slow", "_job": f"slow{i}"}, 10) for i in range(40)])  # ahead in order
    store.enqueue_many("p", [({"name": "fast", "_job": f"fast{i}"}, 0) for i in range(40)])
    barrier = threading.Barrier(8)
    claimed = []

    def claimer(i):
        barrier.wait()
        for _ in range(10):
            claimed.extend(store.claim_next_jobs(["p"], 1, node=f"n{i}", worker=f"w{i}").jobs)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    spiders = [job.message["name"] for job in claimed]
    assert spiders.count("slow") == 2, spiders  # the limit, though slow's jobs rank first
    assert spiders.count("fast") == 40  # no head-of-line blocking: every other job was claimed
    assert len({job.id for job in claimed}) == len(claimed)


def test_a_finish_reported_for_a_job_id_that_waits_is_recorded(database_url):
    """Scrapyd's own test_status: IJobStorage.add of a job that never went through the queue is a fact."""
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "same"})
    now = datetime.datetime.now()
    store.finish_job(project="p", spider="s", job="same", start_time=now, end_time=now, node="n", worker="w")
    assert query(database_url, "SELECT status FROM spider_job WHERE job = 'same' ORDER BY id") == [
        ("pending",), ("terminated",)
    ]


# --- through three real nodes ------------------------------------------------------------------------------------


def test_delayed_retried_and_unique_jobs_on_three_nodes(database, start_cluster, tmp_path):
    url, admin_url = database
    cluster = start_cluster(url, 3, max_proc="2", poll_interval="5")
    first, second, third = cluster.nodes

    # Delayed: starts not before its time, and within 2 s after it (a 5 s poll interval: the claim's timer, not
    # the tick, starts it). The first schedule.json of a node lists the spiders (seconds): _run_at, not _delay.
    run_at = round(time.time() + 8, 3)
    answer = schedule(first, "delayed", _run_at=datetime.datetime.fromtimestamp(run_at).astimezone().isoformat())
    assert second.get("status.json", job="delayed")["currstate"] == "pending"
    [waiting] = [job for job in third.get("listjobs.json")["pending"] if job["id"] == "delayed"]
    assert abs(datetime.datetime.fromisoformat(waiting["run_at"]).timestamp() - run_at) < 0.01
    assert "_run_at" not in waiting["args"]
    [run] = wait_for(lambda: runs_of(tmp_path, "delayed"), 30, "the delayed job to start")
    late = run["started"] - run_at
    print(f"delayed job started {late:+.2f}s after its time")
    assert answer["jobid"] == "delayed" and -0.5 < late < 2  # the crawl's clock is the test's: same machine
    assert "_run_at" not in run["args"]

    # Retried: a crawl that fails runs 3 times with _retries=2, then ends dead; requeue --dead runs it again.
    schedule(second, "failing", fail="1", _retries="2", _retry_delay="0.5")
    wait_for(lambda: jobs(admin_url, "failing")["failing"][:2] == ("terminated", "dead"), 60, "the job to die")
    assert len(runs_of(tmp_path, "failing")) == 3
    assert cli.main(["requeue", "--dead", "--spider", "sleeper", "--database-url", admin_url]) == 0
    wait_for(lambda: len(runs_of(tmp_path, "failing")) > 3, 30, "the requeued job to run again")

    # Unique: ten schedules of one key at once, through all three nodes, leave one waiting job; replace moves it.
    barrier = threading.Barrier(10)
    answers = []

    def schedule_page(i):
        barrier.wait()
        node = cluster.nodes[i % 3]
        answers.append(node.post("schedule.json", project="example", spider="sleeper", jobid=f"page{i}",
                                 _unique_key="page", _delay="600"))

    threads = [threading.Thread(target=schedule_page, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answer["status"] == "ok" for answer in answers), answers
    assert len({answer["jobid"] for answer in answers}) == 1 and sum("existing" in a for a in answers) == 9
    [job] = {answer["jobid"] for answer in answers}
    assert query(admin_url, "SELECT job FROM spider_job WHERE unique_key = 'page'") == [(job,)]
    moved = third.post("schedule.json", project="example", spider="sleeper", jobid="later", _unique_key="page")
    assert moved == {**moved, "jobid": job, "existing": True}
    wait_for(lambda: runs_of(tmp_path, job), 30, "the moved job to run now")
    assert len(runs_of(tmp_path, job)) == 1


def test_counts_tell_delayed_past_due_and_dead_jobs(database_url):
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "late"}, options=JobOptions(run_at=time.time() - 120))
    store.enqueue("p", {"name": "s", "_job": "fresh"})
    store.enqueue("p", {"name": "s", "_job": "later"}, options=JobOptions(delay=600))
    counts = cluster.cluster_counts(lease_seconds=30, past_due_seconds=60)
    assert (counts.pending, counts.delayed, counts.past_due, counts.dead) == (2, 1, 1, 0)
    [by_spider] = cluster.counts_by_spider(past_due_seconds=60)
    assert by_spider == {"project": "p", "spider": "s", "delayed": 1, "pending": 2, "past_due": 1, "running": 0,
                         "dead": 0}
