"""Periodic jobs and per-spider limits: the operator's schedules (``ScheduleStore``), and the firing of due periodic
jobs that every node runs.

A periodic job fires exactly once per due time across the cluster, with no leader: the node that fires locks the
schedule's row (``FOR UPDATE SKIP LOCKED``: the others pass over it), enqueues the job and moves ``next_fire_time``
on, conditional on the value it read, all in one transaction. A node that dies meanwhile rolls it all back. When
each one is due is ``timing``'s pure functions.
"""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import IntegrityError, text
from scrapyd_pgqueue.job_rules.checks import InvalidJobError, check_name, check_priority, encode_message
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.job_rules.periodic_jobs import PeriodicJob
from scrapyd_pgqueue.job_rules.timing import (
    InvalidScheduleError,
    Timing,
    check_timing,
    first_due_after,
)
from scrapyd_pgqueue.store import enqueue
from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL, StorePerEngine, database_errors, read_rows
from scrapyd_pgqueue.tags import pool_key, pool_tags

# Channel of the NOTIFY sent when a periodic job is added, changed or resumed: nodes recompute when to wake up.
PERIODIC_CHANNEL = "scrapyd_pgqueue_periodic"
OVERLAP = ("skip", "queue")  # skip: no firing while the previous one still waits or runs; queue: fire anyway
FIRED_PER_TRANSACTION = 100  # due schedules fired in one transaction (their row locks are held until it ends)
BROKEN_RETRY_SECONDS = 60.0  # a schedule whose job cannot be built is tried again this much later


class DuplicateScheduleError(ValueError):
    """A periodic job of this name exists already."""


class ScheduleNotFoundError(LookupError):
    """No periodic job of this name, or no limit for this spider."""


# --- queries ---------------------------------------------------------------------------------------------------

# The database's clock: a new schedule's first due time is computed from it, as every firing's is.
DATABASE_NOW = text("SELECT now()")

# Add a periodic job; the primary key refuses a second one of the same name. Wakes the nodes, whose next wake-up
# may now be sooner (delivered on commit).
ADD_PERIODIC = text("""
    WITH added AS (
        INSERT INTO periodic_job (name, project, spider, cron, timezone, every_seconds, priority, args, settings,
                                  overlap, max_runtime, stall_timeout, pool, next_fire_time)
        VALUES (:name, :project, :spider, :cron, :timezone, :every_seconds, :priority, CAST(:args AS jsonb),
                CAST(:settings AS jsonb), :overlap, :max_runtime, :stall_timeout, :pool, :next_fire_time)
        RETURNING name
    )
    SELECT name, pg_notify(:channel, name) FROM added
""")

# Every periodic job (of :project, all when NULL) with its last firing's state (waiting, running, done or gone).
LIST_PERIODIC = text("""
    SELECT p.name, p.project, p.spider, p.cron, p.timezone, p.every_seconds, p.priority, p.args, p.settings,
           p.overlap, p.paused, p.next_fire_time, p.last_fire_time, p.last_job, p.fired, p.skipped, p.created_time,
           p.max_runtime, p.stall_timeout, p.pool,
           (SELECT j.status FROM spider_job AS j WHERE j.id = p.last_job_id) AS last_status
    FROM periodic_job AS p
    WHERE CAST(:project AS text) IS NULL OR p.project = :project
    ORDER BY p.name
""")

# Delete a periodic job; its jobs already queued or running stay.
REMOVE_PERIODIC = text("DELETE FROM periodic_job WHERE name = :name RETURNING name")

# Pause a periodic job: nodes pass over it; its due time stays (resume moves it on).
PAUSE_PERIODIC = text("UPDATE periodic_job SET paused = true WHERE name = :name RETURNING name")

# The schedule of a periodic job being resumed, locked so that no firing races the new due time.
LOCK_PERIODIC = text("""
    SELECT cron, timezone, every_seconds, paused, next_fire_time, now() AS now FROM periodic_job WHERE name = :name
    FOR UPDATE
""")

# Resume a periodic job at its next due time after now (due times missed while paused are not fired); wakes the
# nodes, which may now have to wake sooner.
RESUME_PERIODIC = text("""
    WITH resumed AS (
        UPDATE periodic_job SET paused = false, next_fire_time = :next_fire_time WHERE name = :name RETURNING name
    )
    SELECT name, pg_notify(:channel, name) FROM resumed
""")

# In how many seconds the next periodic job is due (database clock; negative: overdue), NULL when none is active.
# periodic_job holds the operator's schedules, a few rows: no index needed.
NEXT_FIRE_IN = text("""
    SELECT CAST(extract(epoch FROM min(next_fire_time) - now()) AS double precision) FROM periodic_job
    WHERE NOT paused
""")

# The due periodic jobs this node fires, locked until its transaction ends: SKIP LOCKED passes over those another
# node is firing, and a row another node fired meanwhile is re-read with its new due time (no longer due). busy: the
# last firing's job still waits or runs (overlap = skip holds the next firing).
LOCK_DUE_PERIODIC = text("""
    SELECT p.name, p.project, p.spider, p.cron, p.timezone, p.every_seconds, p.priority, p.args, p.settings,
           p.overlap, p.max_runtime, p.stall_timeout, p.pool, p.next_fire_time, now() AS now,
           EXISTS (SELECT 1 FROM spider_job AS j
                   WHERE j.id = p.last_job_id AND j.status IN ('delayed', 'pending', 'ongoing')) AS busy
    FROM periodic_job AS p
    WHERE NOT p.paused AND p.next_fire_time <= now()
    ORDER BY p.next_fire_time
    LIMIT :limit
    FOR UPDATE OF p SKIP LOCKED
""")

# The compare-and-set of a firing: move the due time on from the value this node read, recording the job it
# enqueued in the same transaction. No row: someone else moved it (the transaction is rolled back).
FIRED_PERIODIC = text("""
    UPDATE periodic_job
    SET next_fire_time = :next_fire_time, last_fire_time = now(), last_job_id = :job_id, last_job = :job,
        fired = fired + 1
    WHERE name = :name AND next_fire_time = :expected
""")

# The same compare-and-set for a due time passed over: the previous firing still waits or runs (overlap = skip),
# or the job could not be built (broken: tried again later, not counted). A counted skip (:counted = 1) writes its
# webhooks' events in the same statement, one per hook that wants it; :expected is the due time passed over.
SKIPPED_PERIODIC = text("""
    WITH skipped AS (
        UPDATE periodic_job SET next_fire_time = :next_fire_time, skipped = skipped + :counted
        WHERE name = :name AND next_fire_time = :expected
        RETURNING *
    ), skipped_events AS (
        INSERT INTO webhook_event (webhook_id, event, fields)
        SELECT w.id, 'periodic_skipped', jsonb_build_object(
                   'periodic', p.name, 'project', p.project, 'spider', p.spider,
                   'due_time', CAST(:expected AS timestamptz), 'running_job', p.last_job, 'skipped', p.skipped)
        FROM skipped AS p
        JOIN webhook AS w ON 'periodic_skipped' = ANY(w.events) AND (w.project IS NULL OR w.project = p.project)
        WHERE :counted = 1
    )
    SELECT name FROM skipped
""")

# Set a spider's cluster-wide limit (the claim honours it at once); a raised limit frees room: wake the nodes.
SET_LIMIT = text("""
    WITH limited AS (
        INSERT INTO spider_limit AS l (project, spider, max_running) VALUES (:project, :spider, :max_running)
        ON CONFLICT (project, spider) DO UPDATE SET max_running = EXCLUDED.max_running
        RETURNING l.project
    )
    SELECT project, pg_notify(:channel, '') FROM limited
""")

# Every limit, with how many crawls of the spider run now (the claim's own count).
LIST_LIMITS = text("""
    SELECT project, spider, max_running, spider_job_running(project, spider) AS running FROM spider_limit
    ORDER BY project, spider
""")

# Remove a spider's limit; its waiting jobs may all run now: wake the nodes.
REMOVE_LIMIT = text("""
    WITH removed AS (DELETE FROM spider_limit WHERE project = :project AND spider = :spider RETURNING project)
    SELECT project, pg_notify(:channel, '') FROM removed
""")

# --- rows ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicJobRow:
    name: str
    project: str
    spider: str
    cron: str | None
    timezone: str
    every_seconds: float | None
    priority: float
    args: dict[str, Any]
    settings: dict[str, Any]
    overlap: str
    paused: bool
    next_fire_time: datetime.datetime
    last_fire_time: datetime.datetime | None
    last_job: str | None
    last_status: str | None  # of the last firing's job: delayed, pending, ongoing, terminated; None: gone or none
    fired: int
    skipped: int
    created_time: datetime.datetime
    max_runtime: float | None = None
    stall_timeout: float | None = None
    pool: str | None = None  # each fired job's required tags, joined; None: its spider's route

    @property
    def tags(self) -> list[str] | None:
        return None if self.pool is None else pool_tags(self.pool)


@dataclass(frozen=True)
class SpiderLimitRow:
    project: str
    spider: str
    max_running: int
    running: int


@dataclass(frozen=True)
class FiredJob:
    name: str  # the periodic job's
    project: str
    spider: str
    job: str
    due: datetime.datetime


@dataclass
class Firing:
    """What one firing pass did, and in how many seconds the next periodic job is due (None: none is active)."""

    fired: list[FiredJob]
    skipped: list[str]  # names held by overlap = skip
    broken: list[tuple[str, str]]  # (name, why) of schedules whose job could not be built
    next_due_in: float | None


# --- operations ------------------------------------------------------------------------------------------------


class ScheduleStore(StorePerEngine):
    """Periodic jobs and per-spider limits over one database: the operator's changes, and the nodes' firing."""

    # --- periodic jobs ---

    @database_errors
    def add_periodic(self, job: PeriodicJob) -> datetime.datetime:
        """Store a new periodic job; return its first due time. InvalidScheduleError, DuplicateScheduleError."""
        params = _periodic_params(job)
        try:
            with db.transaction(self.engine) as connection:
                now = connection.execute(DATABASE_NOW).scalar_one()
                params["next_fire_time"] = first_due_after(job.timing, now)
                connection.execute(ADD_PERIODIC, params).one()
        except IntegrityError as e:
            if getattr(e.orig, "diag", None) and e.orig.diag.constraint_name == "periodic_job_pkey":
                raise DuplicateScheduleError(f"a periodic job named '{job.name}' exists already") from None
            raise
        return params["next_fire_time"]

    @database_errors
    def list_periodic(self, project: str | None = None) -> list[PeriodicJobRow]:
        return read_rows(self.engine, PeriodicJobRow, LIST_PERIODIC, {"project": project})

    @database_errors
    def remove_periodic(self, name: str) -> None:
        with db.autocommit(self.engine) as connection:
            _found(connection.execute(REMOVE_PERIODIC, {"name": name}).first(), name)

    @database_errors
    def pause_periodic(self, name: str) -> None:
        with db.autocommit(self.engine) as connection:
            _found(connection.execute(PAUSE_PERIODIC, {"name": name}).first(), name)

    @database_errors
    def resume_periodic(self, name: str) -> datetime.datetime:
        """Resume a paused periodic job at its next due time after now (the times missed while paused are not
        fired); return that time. An active one is left as it is."""
        with db.transaction(self.engine) as connection:
            row = _found(connection.execute(LOCK_PERIODIC, {"name": name}).first(), name)
            if not row.paused:
                return row.next_fire_time
            timing = Timing(row.cron, row.timezone, row.every_seconds)
            due = row.next_fire_time
            if due <= row.now:
                due = first_due_after(timing, row.now, row.next_fire_time)
            connection.execute(RESUME_PERIODIC, {"name": name, "next_fire_time": due, "channel": PERIODIC_CHANNEL})
            return due

    # --- firing (every node) ---

    @database_errors
    def fire_due(self) -> Firing:
        """Fire every due periodic job that no other node is firing; say what happened and when the next is due.

        An idle pass is one statement (NEXT_FIRE_IN); only when something is due does a firing transaction run.
        """
        firing = Firing([], [], [], self._next_due_in())
        while firing.next_due_in is not None and firing.next_due_in <= 0:
            with db.transaction(self.engine) as connection:
                due = connection.execute(LOCK_DUE_PERIODIC, {"limit": FIRED_PER_TRANSACTION}).all()
                for row in due:
                    self._fire(connection, row, firing)
            firing.next_due_in = self._next_due_in()
            if len(due) < FIRED_PER_TRANSACTION:
                break  # what is still due is another node's, being fired now
        return firing

    def _next_due_in(self) -> float | None:
        with db.autocommit(self.engine) as connection:
            return connection.execute(NEXT_FIRE_IN).scalar()

    def _fire(self, connection, row, firing: Firing) -> None:
        """Fire (or pass over) one locked due periodic job, in the caller's transaction."""
        cas = {"name": row.name, "expected": row.next_fire_time}
        try:
            cas["next_fire_time"] = first_due_after(Timing(row.cron, row.timezone, row.every_seconds), row.now,
                                                    row.next_fire_time)
            message = {**row.args, "name": row.spider, "_job": uuid.uuid1().hex, "settings": row.settings}
            options = JobOptions(periodic=row.name, max_runtime=row.max_runtime, stall_timeout=row.stall_timeout,
                                 tags=None if row.pool is None else tuple(pool_tags(row.pool)))
            rows = enqueue.job_rows(row.project, [(message, row.priority, options)], False)
        except (ValueError, TypeError, KeyError) as e:  # stored by hand, or the time zone database changed
            firing.broken.append((row.name, str(e)))
            retry = row.now + datetime.timedelta(seconds=BROKEN_RETRY_SECONDS)
            _moved_on(connection.execute(SKIPPED_PERIODIC, {**cas, "next_fire_time": retry, "counted": 0}), row.name)
            return
        if row.busy and row.overlap == "skip":
            _moved_on(connection.execute(SKIPPED_PERIODIC, {**cas, "counted": 1}), row.name)
            firing.skipped.append(row.name)
            return
        enqueued = enqueue.insert_jobs(connection, row.project, rows)
        if not enqueued:
            raise db.too_late(self.engine, f"periodic job '{row.name}' was not fired")
        [job] = enqueued
        _moved_on(connection.execute(FIRED_PERIODIC, {**cas, "job_id": job.id, "job": job.job}), row.name)
        firing.fired.append(FiredJob(row.name, row.project, row.spider, job.job, row.next_fire_time))

    # --- per-spider limits ---

    @database_errors
    def set_limit(self, project: str, spider: str, max_running: int) -> None:
        """At most ``max_running`` crawls of the spider at once in the cluster, from the next claim on."""
        if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
            raise InvalidScheduleError(f"the limit must be a whole number of at least 1, not {max_running!r}")
        params = {"project": _name("project", project), "spider": _name("spider", spider),
                  "max_running": max_running, "channel": NOTIFY_CHANNEL}
        with db.autocommit(self.engine) as connection:
            connection.execute(SET_LIMIT, params).one()

    @database_errors
    def list_limits(self) -> list[SpiderLimitRow]:
        return read_rows(self.engine, SpiderLimitRow, LIST_LIMITS)

    @database_errors
    def remove_limit(self, project: str, spider: str) -> None:
        params = {"project": project, "spider": spider, "channel": NOTIFY_CHANNEL}
        with db.autocommit(self.engine) as connection:
            if connection.execute(REMOVE_LIMIT, params).first() is None:
                raise ScheduleNotFoundError(f"no limit for spider '{spider}' of project '{project}'")


def _periodic_params(job: PeriodicJob) -> dict[str, Any]:
    """The columns of a new periodic job, checked as the table and a job's message can hold them."""
    check_timing(job.timing)
    if job.overlap not in OVERLAP:
        raise InvalidScheduleError(f"overlap must be one of {', '.join(OVERLAP)}, not {job.overlap!r}")
    try:
        priority = check_priority(job.priority)
    except InvalidJobError as e:
        raise InvalidScheduleError(str(e)) from None
    args, settings = job.args or {}, job.settings or {}
    for what, values in (("argument", args), ("setting", settings)):
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in values.items()):
            raise InvalidScheduleError(f"every spider {what} must be a name and a string value")
    try:
        encoded = [encode_message(args), encode_message(settings)]
    except ValueError as e:
        raise InvalidScheduleError(str(e)) from None
    return {
        "name": _name("name", job.name), "project": _name("project", job.project),
        "spider": _name("spider", job.spider), "cron": job.timing.cron, "timezone": job.timing.timezone,
        "every_seconds": job.timing.every_seconds, "priority": priority, "args": encoded[0],
        "settings": encoded[1], "overlap": job.overlap, "max_runtime": job.max_runtime,
        "stall_timeout": job.stall_timeout, "pool": None if job.tags is None else pool_key(job.tags),
        "channel": PERIODIC_CHANNEL,
    }


def _name(what: str, value: Any) -> str:
    try:
        return check_name(what, value)
    except ValueError as e:
        raise InvalidScheduleError(str(e)) from None


def _found(row, name: str):
    if row is None:
        raise ScheduleNotFoundError(f"no periodic job named '{name}'")
    return row


def _moved_on(result, name: str) -> None:
    """The compare-and-set matched: else the due time moved under this node's lock, and its firing is undone."""
    if result.rowcount != 1:
        raise RuntimeError(f"periodic job '{name}': its due time changed while this node held it; not fired")
