"""Webhooks: the operator's hooks (``WebhookStore``) and the delivery's claim and record.

An event is written in the same transaction as what caused it, one row of ``webhook_event`` per hook that wants it
(none without hooks: the insert joins the hooks table, empty then): a job's end by the trigger spider_job_ended (or
spider_job_recorded), a tree's completion by spider_tree_count (both in schema.sql), a periodic firing passed over
by ``schedules.SKIPPED_PERIODIC``. Any node delivers it: it claims due events with
``FOR UPDATE SKIP LOCKED`` and moves each one a lease ahead (``due_time``), so one node at a time sends it, and one
killed mid-delivery loses nothing: the event is due again after the lease. A delivered event is deleted; a failed
one is due again after a backoff, until ``webhook_retry_hours`` have passed since it was written (then given up).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import StorePerEngine, database_errors, read_rows

# The outcomes a hook may ask for by name (the watchdog's timeout and stalled among them), and ``ended``: any
# outcome. Then the events that are not a job's end.
JOB_EVENTS = ("failed", "dead", "timeout", "stalled", "lost", "ended")
OTHER_EVENTS = ("tree_done", "periodic_skipped")
EVENTS = JOB_EVENTS + OTHER_EVENTS
FORMATS = ("json", "slack")
MAX_ERROR_CHARS = 500  # of an attempt's error, as kept


class WebhookNotFoundError(LookupError):
    """No webhook with this id."""


# --- queries ---------------------------------------------------------------------------------------------------

ADD_WEBHOOK = text("""
    INSERT INTO webhook (url, events, project, format, secret)
    VALUES (:url, CAST(:events AS text[]), :project, :format, :secret)
    RETURNING id
""")

# The hooks, for webhook list: never the secret, only whether there is one; waiting: its events not yet delivered.
LIST_WEBHOOKS = text("""
    SELECT w.id, w.url, w.events, w.project, w.format, w.secret IS NOT NULL AS signed, w.deliveries, w.failures,
           w.last_error, w.last_error_time, w.created_time,
           (SELECT count(*) FROM webhook_event AS e WHERE e.webhook_id = w.id) AS waiting
    FROM webhook AS w ORDER BY w.id
""")

# Remove a hook; its undelivered events go with it (ON DELETE CASCADE).
REMOVE_WEBHOOK = text("DELETE FROM webhook WHERE id = :id RETURNING id")

# Claim up to :limit due events for this worker: SKIP LOCKED passes over those another node is claiming; each one
# moves :lease_seconds ahead, so no other node sends it meanwhile, and it is due again if this node dies.
CLAIM_DUE_EVENTS = text("""
    UPDATE webhook_event AS e
    SET due_time = now() + make_interval(secs => :lease_seconds), attempts = e.attempts + 1, claimed_by = :worker
    FROM webhook AS w
    WHERE w.id = e.webhook_id AND e.id = ANY(ARRAY(
        SELECT id FROM webhook_event WHERE due_time <= now() ORDER BY due_time LIMIT :limit FOR UPDATE SKIP LOCKED))
    RETURNING e.id, e.event, e.fields, e.attempts, w.id AS webhook_id, w.url, w.format, w.secret
""")

# Record this worker's attempts (error NULL: delivered) in one statement, only for events it still holds (same
# claim: a late node's record after another took the event over is dropped). Delivered ones are deleted; failed
# ones are due again :delay seconds later, or given up (deleted, counted a failure) when that is past
# :retry_seconds from the event. The hooks' counts and last error move with them.
RECORD_ATTEMPTS = text("""
    WITH attempt AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[]), CAST(:errors AS text[]),
                             CAST(:delays AS double precision[])) AS a(id, attempt, error, delay)
    ), mine AS (
        SELECT e.id, e.webhook_id, a.error, a.delay,
               a.error IS NOT NULL AND e.created_time + make_interval(secs => :retry_seconds)
                                       < now() + make_interval(secs => a.delay) AS given_up
        FROM webhook_event AS e JOIN attempt AS a ON a.id = e.id AND a.attempt = e.attempts
        WHERE e.claimed_by = :worker
        FOR UPDATE OF e
    ), done AS (
        DELETE FROM webhook_event AS e USING mine
        WHERE e.id = mine.id AND (mine.error IS NULL OR mine.given_up)
    ), retried AS (
        UPDATE webhook_event AS e
        SET due_time = now() + make_interval(secs => mine.delay), last_error = mine.error, claimed_by = NULL
        FROM mine WHERE e.id = mine.id AND mine.error IS NOT NULL AND NOT mine.given_up
    ), counted AS (
        UPDATE webhook AS w
        SET deliveries = w.deliveries + c.delivered, failures = w.failures + c.given_up,
            last_error = coalesce(c.last_error, w.last_error),
            last_error_time = CASE WHEN c.last_error IS NOT NULL THEN now() ELSE w.last_error_time END
        FROM (SELECT webhook_id, count(*) FILTER (WHERE error IS NULL) AS delivered,
                     count(*) FILTER (WHERE given_up) AS given_up, max(error) AS last_error
              FROM mine GROUP BY webhook_id) AS c
        WHERE w.id = c.webhook_id
    )
    SELECT count(*) FILTER (WHERE given_up) FROM mine
""")

# --- operations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookRow:
    """A hook as ``webhook list`` shows it (``signed``: it has a secret, never shown)."""

    id: int
    url: str
    events: list[str]
    project: str | None
    format: str
    signed: bool
    deliveries: int
    failures: int
    last_error: str | None
    last_error_time: datetime.datetime | None
    created_time: datetime.datetime
    waiting: int


@dataclass(frozen=True)
class DueEvent:
    """An event this node claimed, with its hook's address, format and secret (to sign it)."""

    id: int
    event: str
    fields: dict[str, Any]
    attempts: int
    webhook_id: int
    url: str
    format: str
    secret: str | None = None

    def __repr__(self) -> str:  # never the secret
        return f"DueEvent(id={self.id}, event={self.event!r}, webhook_id={self.webhook_id})"


@dataclass(frozen=True)
class Attempt:
    """How one delivery went: ``error`` None when delivered; ``delay``: seconds until the next try when not."""

    event: DueEvent
    error: str | None = None
    delay: float = 0.0


class WebhookStore(StorePerEngine):
    """The hooks (the operator's) and the delivery of their events (every node's)."""

    @database_errors
    def add_webhook(self, url: str, events: list[str], project: str | None, body_format: str,
                    secret: str | None) -> int:
        with db.autocommit(self.engine) as connection:
            params = {"url": url, "events": events, "project": project, "format": body_format, "secret": secret}
            return connection.execute(ADD_WEBHOOK, params).scalar_one()

    @database_errors
    def list_webhooks(self) -> list[WebhookRow]:
        return read_rows(self.engine, WebhookRow, LIST_WEBHOOKS)

    @database_errors
    def remove_webhook(self, webhook_id: int) -> None:
        with db.autocommit(self.engine) as connection:
            if connection.execute(REMOVE_WEBHOOK, {"id": webhook_id}).first() is None:
                raise WebhookNotFoundError(f"no webhook {webhook_id}")

    @database_errors
    def claim_due_events(self, *, worker: str, limit: int, lease_seconds: float) -> list[DueEvent]:
        params = {"worker": worker, "limit": limit, "lease_seconds": float(lease_seconds)}
        with db.autocommit(self.engine) as connection:
            return [DueEvent(**row._asdict()) for row in connection.execute(CLAIM_DUE_EVENTS, params)]

    @database_errors
    def record_attempts(self, attempts: list[Attempt], *, worker: str, retry_seconds: float) -> int:
        """Write how the attempts went; return how many events were given up."""
        if not attempts:
            return 0
        params = {
            "ids": [a.event.id for a in attempts], "attempts": [a.event.attempts for a in attempts],
            "errors": [None if a.error is None else a.error[:MAX_ERROR_CHARS] for a in attempts],
            "delays": [float(a.delay) for a in attempts], "worker": worker, "retry_seconds": float(retry_seconds),
        }
        with db.autocommit(self.engine) as connection:
            return connection.execute(RECORD_ATTEMPTS, params).scalar_one()
