"""Webhook delivery on a node: the event's body, its signature, and a thread that sends due events.

Every node delivers. It learns that events are due from its tick (``JobStore.node_tick``: in how many seconds the
next one is due), so an idle node sends no statement of its own for webhooks; when one is due the launcher's
``learn`` wakes ``WebhookSender``, which claims a batch (``WebhookStore.claim_due_events``: one node at a time per
event, under a lease), posts each one with a timeout from a few threads, and records how each went in one
statement: a failed one is tried again after an exponential backoff with jitter, until ``webhook_retry_hours``.
At least once: a node killed after posting and before recording leaves the event to be posted again after its
lease; receivers dedupe by the body's ``id``.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import hashlib
import hmac
import json
import math
import random
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from twisted.logger import Logger

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.crawl_process.job_stats import stats_summary
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.store.webhooks import JOB_EVENTS, Attempt, DueEvent, WebhookStore
from scrapyd_pgqueue.web import metrics

log = Logger()

SIGNATURE_HEADER = "X-Scrapyd-Pgqueue-Signature"
SENDERS = 4  # attempts at once per node
BATCH = 2 * SENDERS  # events claimed at once: two rounds of attempts
LEASE_MARGIN = 5.0  # seconds a claim's lease adds to the rounds' timeouts (the claim's and the record's statements)


# --- the body --------------------------------------------------------------------------------------------------


def _utc(value: Any) -> Any:
    """A time from the event's row (ISO 8601 in the database session's zone) in UTC, as the body gives times."""
    if not isinstance(value, str):
        return value
    return datetime.datetime.fromisoformat(value).astimezone(datetime.timezone.utc).isoformat()


def event_body(event_id: int, event: str, fields: dict[str, Any], node_url: str | None = None) -> dict[str, Any]:
    """The JSON body of one event, from what its cause's row gave (``fields``, store/webhooks.py): ``id`` for
    dedupe, then the job's keys (None where the event has none), then the event's own (a tree's, a periodic job's).
    ``node_url``: a node that serves the job's log at ``log_url`` (every node serves stored logs)."""
    body = {"id": event_id, "event": event, "project": fields.get("project"), "spider": fields.get("spider"),
            "job": None, "node": None, "outcome": None, "finish_reason": None, "stats": {}, "start_time": None,
            "end_time": None, "log_url": None, "node_url": node_url}
    if event in JOB_EVENTS:
        summary = stats_summary(fields.get("stats"))
        body.update({key: fields.get(key) for key in ("job", "node", "outcome", "reason", "exit_code", "start_time",
                                                       "end_time")})
        body.update(finish_reason=summary.get("finish_reason"), stats=summary,
                    log_url="/logs/{}/{}/{}.log".format(*(quote(fields[key], safe="") for key in (
                        "project", "spider", "job"))))  # as listjobs.json gives it, its segments quoted
    else:
        body.update(fields)
    for key in ("start_time", "end_time", "due_time"):
        if key in body:
            body[key] = _utc(body[key])
    return body


def _slack_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(body: dict[str, Any]) -> str:
    """One line (and the log's link) a person reads in a Slack channel."""
    event = body["event"]
    if event == "tree_done":
        text = f"Crawl tree {body['root']} of project {body['project']} is done: {body['jobs']} jobs"
        text += " (cancelled)" if body.get("cancelled") else ""
    elif event == "periodic_skipped":
        text = (f"Periodic job {body['periodic']} ({body['project']}/{body['spider']}) skipped its firing due "
                f"{body['due_time']}: job {body['running_job']} still waits or runs")
    else:
        text = f"Job {body['job']} ({body['project']}/{body['spider']}) ended {body['outcome']} on {body['node']}"
        text += f": {body['reason']}" if body.get("reason") else ""
        stats = body.get("stats") or {}
        if stats.get("items") is not None:
            text += f"; {stats['items']} items, {stats.get('errors') or 0} errors"
    text = _slack_escaped(text)
    if body.get("log_url") and body.get("node_url"):
        text += f"\n{body['node_url'].rstrip('/')}{body['log_url']}"
    return text


def encode(due: DueEvent, node_url: str | None) -> bytes:
    body = event_body(due.id, due.event, due.fields, node_url)
    if due.format == "slack":
        body = {"text": slack_text(body)}
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, body: bytes) -> str:
    """GitHub's scheme: ``sha256=`` and the hex HMAC-SHA256 of the raw body with the hook's secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def retry_delay(attempts: int, base: float, cap: float, rng: random.Random = random) -> float:
    """Seconds before the next try after ``attempts`` failed ones: base doubled per attempt, capped, with half of
    it random (many events that failed together do not come back together)."""
    delay = min(cap, base * math.pow(2, max(attempts - 1, 0)))
    return delay / 2 + rng.uniform(0, delay / 2)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a redirect is an answer that is not a delivery: the hook's URL is the operator's to fix


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> str | None:
    """POST the body; None when answered 2xx, else the error (never the URL: it may hold a token)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(64 * 1024)
        return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}"
    except urllib.error.URLError as e:
        return f"{type(e.reason).__name__}: {e.reason}" if not isinstance(e.reason, str) else e.reason
    except (OSError, ValueError) as e:  # a timeout while reading, a connection reset, a malformed answer
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


# --- the sender ------------------------------------------------------------------------------------------------


class WebhookSender(threading.Thread):
    """Delivers due events when ``due_in`` says some are (from the reactor, after each tick)."""

    def __init__(self, settings, node_url: str | None):
        super().__init__(name="pgqueue-webhooks", daemon=True)
        self.settings = settings
        self.node_url = node_url
        self.store = WebhookStore.for_settings(settings)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.trouble = ThrottledLog(lambda message: log.warn("{message}", message=message))
        self.senders = concurrent.futures.ThreadPoolExecutor(SENDERS, thread_name_prefix="pgqueue-webhook")
        self.lease_seconds = math.ceil(BATCH / SENDERS) * settings.webhook_timeout + LEASE_MARGIN

    def due_in(self, seconds: float | None) -> None:
        """Any thread: the tick's news; events due now wake the sender."""
        if seconds is not None and seconds <= 0:
            self.wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.senders.shutdown(wait=False, cancel_futures=True)

    def run(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.stopping.is_set():
                return
            try:
                self.deliver_due()
                self.trouble.clear("database")
            except Exception as e:  # noqa: BLE001 - the database is away: the next tick wakes it again
                self.trouble.report(f"Could not deliver webhook events: {e}", key="database")

    def deliver_due(self) -> None:
        """Claim and send batches until none is left due (or this node stops)."""
        while not self.stopping.is_set():
            events = self.store.claim_due_events(worker=pgconfig.WORKER_ID, limit=BATCH,
                                                 lease_seconds=self.lease_seconds)
            attempts = list(self.senders.map(self.attempt, events))
            given_up = self.store.record_attempts(attempts, worker=pgconfig.WORKER_ID,
                                                  retry_seconds=self.settings.webhook_retry_hours * 3600)
            failed = sum(1 for attempt in attempts if attempt.error is not None)
            metrics.WEBHOOK_DELIVERIES.labels("delivered").inc(len(attempts) - failed)
            metrics.WEBHOOK_DELIVERIES.labels("failed").inc(failed - given_up)
            metrics.WEBHOOK_DELIVERIES.labels("given_up").inc(given_up)
            if len(events) < BATCH:
                return

    def attempt(self, due: DueEvent) -> Attempt:
        body = encode(due, self.node_url)
        headers = {"Content-Type": "application/json", "User-Agent": "scrapyd-pgqueue",
                   "X-Scrapyd-Pgqueue-Event": due.event, "X-Scrapyd-Pgqueue-Delivery": str(due.id)}
        if due.secret:
            headers[SIGNATURE_HEADER] = signature(due.secret, body)
        error = post(due.url, body, headers, self.settings.webhook_timeout)
        if error is None:
            self.trouble.clear(f"hook {due.webhook_id}")
            return Attempt(due)
        self.trouble.report(f"Webhook {due.webhook_id}: a delivery failed ({error}); retried with backoff",
                            key=f"hook {due.webhook_id}")
        settings = self.settings
        return Attempt(due, error, retry_delay(due.attempts, settings.webhook_backoff, settings.webhook_backoff_max))
