"""Webhooks: events written with what caused them (an outbox), delivered by real nodes to a real HTTP receiver, at
least once, signed, through an outage of the receiver and the death of the node that was delivering.

``SCRAPYD_PGQUEUE_WEBHOOK_JOBS`` (default 200, about 25 s here) failed crawls are delivered with no outage;
``SCRAPYD_PGQUEUE_WEBHOOK_OUTAGE`` (default 60) seconds is how long the receiver stays down in the
outage test.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import random
import time
import urllib.request

import pytest

from helpers import WebhookReceiver, finish, query, run, run_json, schedule, wait_for
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.node.webhooks import event_body, retry_delay, slack_text
from scrapyd_pgqueue.store import AllJobsStore, ScheduleStore
from scrapyd_pgqueue.store.webhooks import Attempt, WebhookStore

FAILED_JOBS = int(os.environ.get("SCRAPYD_PGQUEUE_WEBHOOK_JOBS", "200"))
OUTAGE_SECONDS = float(os.environ.get("SCRAPYD_PGQUEUE_WEBHOOK_OUTAGE", "60"))
SECRET = "hook-s3cret"
# Small backoff and timeout, so that retries and leases take seconds.
FAST_HOOKS = {"webhook_timeout": "3", "webhook_backoff": "0.5", "webhook_backoff_max": "2"}


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "hook-secret"
    path.write_text(SECRET + "\n")
    return str(path)


@pytest.fixture
def receiver():
    """A real HTTP receiver for the hooks, stopped after the test."""
    with WebhookReceiver() as receiver:
        yield receiver


def add_hook(url, hook_url, events, *extra):
    return run_json(url, "webhook", "add", hook_url, "--on", events, *extra)["id"]


def valid_signature(headers, body: bytes) -> bool:
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers.get("x-scrapyd-pgqueue-signature", ""), expected)


# --- pure functions ----------------------------------------------------------------------------------------------


def test_the_backoff_doubles_up_to_its_cap_with_half_of_it_random():
    rng = random.Random(1)
    delays = [retry_delay(attempt, 10, 3600, rng) for attempt in range(1, 12)]
    for attempt, delay in zip(range(1, 12), delays):
        full = min(3600, 10 * 2 ** (attempt - 1))
        assert full / 2 <= delay <= full
    assert len(set(delays)) == len(delays)


def test_a_job_event_body_has_every_key_and_the_log_url_listjobs_gives():
    fields = {"project": "p", "spider": "s", "job": "j1", "node": "n1", "outcome": "failed", "reason": "exit code 1",
              "exit_code": 1, "start_time": "2026-11-27T11:00:00+01:00", "end_time": "2026-11-27T10:00:02+00:00",
              "stats": None}
    body = event_body(7, "failed", fields, "http://n2:6800/")
    assert (body["start_time"], body["end_time"]) == ("2026-11-27T10:00:00+00:00", "2026-11-27T10:00:02+00:00")
    assert {key: body[key] for key in ("id", "event", "project", "spider", "job", "node", "outcome", "finish_reason",
                                       "stats", "log_url")} == {
        "id": 7, "event": "failed", "project": "p", "spider": "s", "job": "j1", "node": "n1", "outcome": "failed",
        "finish_reason": None, "stats": {"items": None, "requests": None, "errors": None, "finish_reason": None},
        "log_url": "/logs/p/s/j1.log"}
    stats = {"item_scraped_count": 3, "downloader/request_count": 4, "log_count/ERROR": 2, "finish_reason": "finished"}
    body = event_body(8, "ended", {**fields, "stats": stats})
    assert body["finish_reason"] == "finished"
    assert body["stats"] == {"items": 3, "requests": 4, "errors": 2, "finish_reason": "finished"}
    text = slack_text(event_body(9, "failed", {**fields, "job": "<j&1>"}, "http://n2:6800/"))
    assert "&lt;j&amp;1&gt;" in text and text.endswith("http://n2:6800/logs/p/s/%3Cj%261%3E.log")  # quoted: a link that works


# --- the outbox, in the transactions that cause events ------------------------------------------------------------


def test_events_are_written_only_for_the_hooks_that_want_them(store, database_url, admin_connection):
    store.register_node(worker="w1", name="node1", url=None, max_proc=4)
    store.enqueue("p", {"name": "s", "_job": "quiet"})
    finish(store, store.claim_next_jobs(None, 1, node="node1", worker="w1").jobs[0], outcome="failed")
    assert query(database_url, "SELECT count(*) FROM webhook_event") == [(0,)]  # no hooks: no rows

    hooks = WebhookStore.for_url(database_url)
    failed_only = hooks.add_webhook("http://x/1", ["failed"], None, "json", None)
    any_end = hooks.add_webhook("http://x/2", ["ended"], "p", "json", None)
    other_project = hooks.add_webhook("http://x/3", ["ended"], "q", "json", None)
    for job, outcome in (("bad", "failed"), ("good", "finished")):
        store.enqueue("p", {"name": "s", "_job": job})
        finish(store, store.claim_next_jobs(None, 1, node="node1", worker="w1").jobs[0], outcome=outcome)
    store.enqueue("p", {"name": "s", "_job": "never-run"})
    assert AllJobsStore.for_url(database_url).cancel_job("p", "never-run") == "pending"
    events = query(database_url, "SELECT webhook_id, event, fields->>'job' FROM webhook_event ORDER BY id")
    assert sorted(events) == sorted([(failed_only, "failed", "bad"), (any_end, "ended", "bad"),
                                     (any_end, "ended", "good"), (any_end, "ended", "never-run")])
    assert other_project not in {hook for hook, _, _ in events}


def test_recovery_of_a_dead_node_and_retries_used_up_write_lost_and_dead_events(store, database_url):
    hooks = WebhookStore.for_url(database_url)
    hook = hooks.add_webhook("http://x/1", ["lost", "dead"], None, "json", None)
    for worker in ("w-dead", "w-live"):
        store.register_node(worker=worker, name=worker, url=None, max_proc=4)
    store.enqueue("p", {"name": "s", "_job": "orphan"})
    store.claim_next_jobs(None, 1, node="w-dead", worker="w-dead")
    query(database_url, "UPDATE scrapyd_node SET heartbeat_time = now() - interval '1 hour' WHERE id = 'w-dead'")
    tick = store.node_tick(worker="w-live", lease_seconds=30, max_attempts=1, recover=True, release=False,
                           known_ids=[], claimed_before=datetime.datetime.now(), prompt_seconds=60)
    assert [job.job for job in tick.recovered] == ["orphan"] and tick.webhooks_due_in is None  # read before it
    store.enqueue("p", {"name": "s", "_job": "flaky"}, options=JobOptions(retries=1))
    for _ in range(2):
        query(database_url, "UPDATE spider_job SET run_at = now() WHERE job = 'flaky'")
        [claimed] = store.claim_next_jobs(None, 1, node="w-live", worker="w-live").jobs
        finish(store, claimed, outcome="failed", worker="w-live")
    events = query(database_url, "SELECT webhook_id, event, fields->>'job', fields->>'outcome' FROM webhook_event")
    assert sorted(events) == [(hook, "dead", "flaky", "dead"), (hook, "lost", "orphan", "lost")]
    tick = store.node_tick(worker="w-live", lease_seconds=30, max_attempts=1, recover=False, release=False,
                           known_ids=[], claimed_before=datetime.datetime.now(), prompt_seconds=60)
    assert tick.webhooks_due_in is not None and tick.webhooks_due_in <= 0  # the tick tells the node


def test_a_cancelled_tree_writes_ended_events_for_its_waiting_jobs_and_then_its_tree_done(database_url, store):
    hooks = WebhookStore.for_url(database_url)
    hooks.add_webhook("http://x/1", ["ended", "tree_done"], "p", "json", None)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = store.claim_next_jobs(None, 1, node="n", worker="w1").jobs
    store.enqueue_many("p", [({"name": "child", "_job": job}, 0.0, JobOptions(parent="r")) for job in ("a", "b")])
    assert AllJobsStore.for_url(database_url).cancel_tree("p", "r") == {"cancelled": 2, "signalled": 1}
    store.enqueue_many("p", [({"name": "child", "_job": "late"}, 0.0, JobOptions(parent="r"))])  # cancelled at once
    finish(store, root, outcome="cancelled")
    events = query(database_url, "SELECT event, fields->>'job', fields->>'outcome', fields->>'root' FROM webhook_event")
    assert sorted(events) == [("ended", "a", "cancelled", None), ("ended", "b", "cancelled", None),
                              ("ended", "late", "cancelled", None), ("ended", "r", "cancelled", None),
                              ("tree_done", None, None, "r")]


def test_a_periodic_skip_writes_its_event_in_the_same_transaction(database_url, store):
    from scrapyd_pgqueue.job_rules.periodic_jobs import PeriodicJob
    from scrapyd_pgqueue.job_rules.timing import Timing

    hooks = WebhookStore.for_url(database_url)
    hook = hooks.add_webhook("http://x/1", ["periodic_skipped"], None, "json", None)
    schedules = ScheduleStore.for_url(database_url)
    schedules.add_periodic(PeriodicJob("slow", "p", "s", Timing(every_seconds=3600)))
    query(database_url, "UPDATE periodic_job SET next_fire_time = now() - interval '1 second'")
    assert schedules.fire_due().fired
    query(database_url, "UPDATE periodic_job SET next_fire_time = now() - interval '1 second'")
    assert schedules.fire_due().skipped == ["slow"]  # the first firing's job still waits
    [(webhook_id, fields)] = query(database_url, "SELECT webhook_id, fields FROM webhook_event")
    assert webhook_id == hook and fields["periodic"] == "slow" and fields["running_job"]


def test_a_late_record_after_another_node_took_the_event_over_is_dropped(database_url):
    hooks = WebhookStore.for_url(database_url)
    hook = hooks.add_webhook("http://x/1", ["ended"], None, "json", "s")
    query(database_url, "INSERT INTO webhook_event (webhook_id, event, fields) VALUES (%s, 'ended', '{}')", (hook,))
    [first] = hooks.claim_due_events(worker="a", limit=8, lease_seconds=0)
    assert "secret" not in repr(first) and first.secret == "s"
    [second] = hooks.claim_due_events(worker="b", limit=8, lease_seconds=60)  # a's lease expired
    assert hooks.claim_due_events(worker="c", limit=8, lease_seconds=60) == []  # b holds it: nobody else
    hooks.record_attempts([Attempt(first, "HTTP 500", 1.0)], worker="a", retry_seconds=3600)  # too late: dropped
    hooks.record_attempts([Attempt(second)], worker="b", retry_seconds=3600)
    [row] = hooks.list_webhooks()
    assert (row.deliveries, row.failures, row.waiting, row.last_error) == (1, 0, 0, None)


# --- real nodes, real crawls, a real receiver ---------------------------------------------------------------------


def test_failed_crawls_are_each_delivered_once_signed_and_in_slack_format(database, start_cluster, secret_file,
                                                                          receiver):
    url, _ = database  # the nodes' role owns the schema (whoever migrates first does)
    with WebhookReceiver() as slack:
        add_hook(url, receiver.url, "failed", "--secret-file", secret_file)
        add_hook(url, slack.url, "failed", "--format", "slack", "--project", "example", "--secret-file",
                 secret_file)
        cluster = start_cluster(url, 2, max_proc="4", **FAST_HOOKS)
        started = time.monotonic()
        jobs = {f"fail-{i}" for i in range(FAILED_JOBS)}
        for i, job in enumerate(sorted(jobs)):
            schedule(cluster.nodes[i % 2], job, fail="1")
        wait_for(lambda: len(receiver.received) >= FAILED_JOBS and len(slack.received) >= FAILED_JOBS,
                 60 + FAILED_JOBS, "every failed job's deliveries")
        print(f"{FAILED_JOBS} failed crawls delivered to two hooks in {time.monotonic() - started:.1f}s")
        wait_for(lambda: query(url, "SELECT count(*) FROM webhook_event") == [(0,)], 30, "an empty outbox")
        bodies = receiver.bodies()
        assert len(bodies) == FAILED_JOBS  # exactly once each with no outage
        assert {body["job"] for body in bodies} == jobs and len({body["id"] for body in bodies}) == FAILED_JOBS
        assert all(valid_signature(headers, body) for headers, body in receiver.received)
        assert all(body["event"] == body["outcome"] == "failed" and body["spider"] == "sleeper" for body in bodies)
        assert all(body["log_url"] == f"/logs/example/sleeper/{body['job']}.log" for body in bodies)
        assert len(slack.received) == FAILED_JOBS
        for headers, raw in slack.received:
            assert list(json.loads(raw)) == ["text"] and valid_signature(headers, raw)
            assert "ended failed" in json.loads(raw)["text"]
        listed = run_json(url, "webhook", "list")["webhooks"]
        assert [(hook["deliveries"], hook["failures"], hook["waiting"]) for hook in listed] == [
            (FAILED_JOBS, 0, 0)] * 2
        assert "secret" not in json.dumps(listed) and SECRET not in run(url, "webhook", "list").stdout
        metrics = "".join(urllib.request.urlopen(f"{node.url}metrics", timeout=30).read().decode()
                          for node in cluster.nodes)
        delivered = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                        if line.startswith('scrapyd_pgqueue_webhook_deliveries_total{outcome="delivered"}'))
        assert delivered == 2 * FAILED_JOBS


def test_a_receiver_down_gets_every_event_once_it_is_up(database, start_cluster, receiver):
    url, _ = database  # the nodes' role owns the schema (whoever migrates first does)
    add_hook(url, receiver.url, "ended")
    receiver.stop()  # down: connections refused
    cluster = start_cluster(url, 2, max_proc="4", **FAST_HOOKS)
    down_at = time.monotonic()
    jobs = {f"job-{i}" for i in range(10)}
    for i, job in enumerate(sorted(jobs)):
        schedule(cluster.nodes[i % 2], job, **({"fail": "1"} if i % 2 else {}))
    [hook] = wait_for(lambda: [h for h in run_json(url, "webhook", "list")["webhooks"] if h["last_error"]],
                      60, "the failed attempts' last error")
    assert "Connection refused" in hook["last_error"] and hook["deliveries"] == 0
    listing = run(url, "webhook", "list").stdout
    assert "Connection refused" in listing
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))  # the outage itself, not a race
    assert not receiver.received
    receiver.start()
    up_at = time.monotonic()
    wait_for(lambda: {body["job"] for body in receiver.bodies()} == jobs, 30, "every event after the outage")
    print(f"outage {OUTAGE_SECONDS:g}s; every event delivered {time.monotonic() - up_at:.1f}s after it ended")
    outcomes = {body["job"]: body["outcome"] for body in receiver.bodies()}
    assert sorted(outcomes.values()) == ["failed"] * 5 + ["finished"] * 5


def test_a_node_killed_during_a_delivery_loses_no_event(database, start_cluster, receiver):
    url, _ = database  # the nodes' role owns the schema (whoever migrates first does)
    receiver.hold.set()  # the first delivery is taken in and never answered
    add_hook(url, receiver.url, "ended")
    cluster = start_cluster(url, 2, max_proc="2", **FAST_HOOKS)
    schedule(cluster.nodes[0], "held-job")
    wait_for(lambda: receiver.held, 60, "the delivery to be in progress")
    [(worker,)] = query(url, "SELECT claimed_by FROM webhook_event")
    [(name,)] = query(url, "SELECT name FROM scrapyd_node WHERE id = %s", (worker,))
    sender = next(node for node in cluster.nodes if node.name == name)
    sender.kill()
    killed_at = time.monotonic()
    [body] = wait_for(receiver.bodies, 60, "the event delivered by the other node")
    print(f"delivered by the survivor {time.monotonic() - killed_at:.1f}s after the kill")
    assert body["job"] == "held-job" and body["id"] == json.loads(receiver.held[0][1])["id"]
    wait_for(lambda: query(url, "SELECT count(*) FROM webhook_event") == [(0,)], 30, "an empty outbox")


def test_a_tree_done_and_a_skipped_periodic_firing_arrive(database, start_cluster, receiver):
    url, _ = database  # the nodes' role owns the schema (whoever migrates first does)
    add_hook(url, receiver.url, "tree_done,periodic_skipped")
    cluster = start_cluster(url, 2, max_proc="2", **FAST_HOOKS)
    schedule(cluster.nodes[0], "root-job", seconds="0", _on_complete="sleeper")
    run(url, "periodic", "add", "slow", "--project", "example", "--spider", "sleeper", "--every", "1", "-a",
        "seconds=6")

    def arrived(event):
        return [body for body in receiver.bodies() if body["event"] == event]

    [tree] = wait_for(lambda: arrived("tree_done"), 60, "the tree_done event")
    assert (tree["project"], tree["root"], tree["jobs"], tree["cancelled"]) == ("example", "root-job", 1, False)
    assert tree["completion_job"]
    skipped = wait_for(lambda: arrived("periodic_skipped"), 60, "a periodic_skipped event")
    assert skipped[0]["periodic"] == "slow" and skipped[0]["spider"] == "sleeper" and skipped[0]["running_job"]


def test_bad_webhook_input_gets_a_clear_error(database_url, tmp_path):
    assert "not an http or https URL" in run(database_url, "webhook", "add", "ftp://x/", "--on", "failed",
                                             expect=2).stderr
    assert "unknown event 'exploded'" in run(database_url, "webhook", "add", "http://x/", "--on", "failed,exploded",
                                             expect=2).stderr
    assert "no webhook 42" in run(database_url, "webhook", "remove", "42", expect=1).stderr
    empty = tmp_path / "empty"
    empty.write_text("")
    assert "secret file is empty" in run(database_url, "webhook", "add", "http://x/", "--on", "failed",
                                         "--secret-file", str(empty), expect=1).stderr
    hook = run_json(database_url, "webhook", "add", "https://x/", "--on", "dead,timeout,stalled,lost")["id"]
    assert run_json(database_url, "webhook", "list")["webhooks"][0]["events"] == ["dead", "timeout", "stalled", "lost"]
    run(database_url, "webhook", "remove", str(hook))
    assert run_json(database_url, "webhook", "list")["webhooks"] == []
