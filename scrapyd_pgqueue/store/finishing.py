"""How jobs end: start, finish (or retry after a failure), prune, and the terminated jobs; ``JobEnds``, part of
``queue.JobStore``.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import (
    ClaimedJob,
    JobRow,
    database_errors,
    on_database_clock,
    read_rows,
)
from scrapyd_pgqueue.store.statuses import FINISHED

# --- queries ---------------------------------------------------------------------------------------------------

# Record the crawl's pid once it is spawned; only while this claim still owns the job. Returns the job's watchdog
# limits (NULL: the node's): learnt here, milliseconds after the spawn, the claim function and its plan stay as they
# are, and no statement is added.
MARK_STARTED = text("""
    UPDATE spider_job SET pid = :pid, start_time = :start_time
    WHERE id = :id AND status = 'ongoing' AND worker = :worker AND attempts = :attempt
    RETURNING max_runtime, stall_timeout
""")

# End (or retry) a job: the claim :attempt of job :id held by :worker; or, without :id, the running job :job of
# :project claimed by :worker (IJobStorage.add from a stock launcher). A claim may still finish once recovery handed
# the job back or gave it up as lost, as long as nobody claimed it since (same worker and attempt): the result of a
# node that came back late is kept then. A newer attempt, or a job already finished, is never overwritten. The
# driver sends the values in the statement, so the planner drops the branch a call does not take.
# A failed job (outcome failed, or timeout or stalled: stopped by its node's watchdog) with retries left (failures <
# retries; the SET reads the row as it was) waits as 'delayed' for its exponential backoff, same row and job id, its
# failure counted; out of retries it ends 'dead' (its reason says how the last run ended). Any other outcome (a
# cancelled job among them) ends it. A retried job gives its unique key up when a new waiting job took it meanwhile.
# The start MARK_STARTED recorded for this crawl (its pid) stays, so that a job shows one start time running and
# finished. The crawl's final stats (:stats) replace what its node's tick wrote; a job that waits to be retried has
# none. A job that ended writes its webhooks' events in the same transaction (trigger spider_job_ended).
FINISH_JOB = text("""
    WITH ending AS (SELECT :outcome IN ('failed', 'timeout', 'stalled') AS failed)
    UPDATE spider_job
    SET status = CASE WHEN failed AND failures < retries THEN 'delayed' ELSE 'terminated' END,
        outcome = CASE WHEN failed AND failures < retries THEN NULL WHEN failed AND retries > 0 THEN 'dead'
                       ELSE :outcome END,
        run_at = CASE WHEN failed AND failures < retries THEN now() + make_interval(secs => retry_delay * 2 ^ failures)
                 END,
        failures = failures + CASE WHEN failed THEN 1 ELSE 0 END,
        unique_key = CASE WHEN failed AND failures < retries THEN spider_job_key_unless_taken(project, unique_key)
                          ELSE unique_key END,
        exit_code = :exit_code, reason = :reason, pid = coalesce(:pid, pid), node = coalesce(node, :node),
        start_time = CASE WHEN pid = :pid THEN start_time ELSE :start_time END,
        end_time = :end_time,
        stats = CASE WHEN failed AND failures < retries THEN NULL ELSE coalesce(CAST(:stats AS jsonb), stats) END
    FROM ending
    WHERE worker = :worker
      AND (CAST(:id AS bigint) IS NOT NULL AND id = :id AND attempts = :attempt
           AND (status IN ('ongoing', 'pending') OR outcome = 'lost')
           OR CAST(:id AS bigint) IS NULL AND project = :project AND job = :job AND status = 'ongoing')
    RETURNING id
""")

# Record a job that never went through the queue as terminated: a finished crawl is a fact, also when a job with
# the same id waits or runs (terminated rows are outside spider_job_live_job_key). Its webhooks' events: trigger
# spider_job_recorded.
INSERT_TERMINATED = text("""
    INSERT INTO spider_job (project, spider, job, status, outcome, exit_code, reason, node, pid, created_time,
                            start_time, end_time, stats)
    VALUES (:project, :spider, :job, 'terminated', :outcome, :exit_code, :reason, :node, :pid,
            coalesce(:start_time, now()), :start_time, :end_time, CAST(:stats AS jsonb))
""")

# Delete terminated jobs beyond the newest :keep (reads spider_job_terminated_idx). Nodes prune after every finish,
# at the same time: SKIP LOCKED leaves rows another pruner is deleting to it, instead of deadlocking with it. Dead
# jobs stay (the dead letters, until requeue --dead, prune --older-than, or PRUNE_DEAD with dead_to_keep). A crawl's
# first row stays while another of its workers has not ended: its frontier goes with it (ON DELETE CASCADE).
PRUNE_TERMINATED = text("""
    DELETE FROM spider_job WHERE id IN (
        SELECT id FROM spider_job AS j WHERE status = 'terminated' AND outcome IS DISTINCT FROM 'dead'
            AND (crawl IS DISTINCT FROM id OR NOT EXISTS (
                SELECT 1 FROM spider_job AS w WHERE w.crawl = j.id AND w.status <> 'terminated'))
        ORDER BY end_time DESC OFFSET :keep
        FOR UPDATE SKIP LOCKED
    )
""")

# The same for dead jobs beyond the newest :keep (their stored logs go with them, ON DELETE CASCADE): a statement of
# its own, run only with dead_to_keep set, so that the prune after every finish keeps its plan.
PRUNE_DEAD = text("""
    DELETE FROM spider_job WHERE id IN (
        SELECT id FROM spider_job AS j WHERE status = 'terminated' AND outcome = 'dead'
            AND (crawl IS DISTINCT FROM id OR NOT EXISTS (
                SELECT 1 FROM spider_job AS w WHERE w.crawl = j.id AND w.status <> 'terminated'))
        ORDER BY end_time DESC OFFSET :keep
        FOR UPDATE SKIP LOCKED
    )
""")

# The newest :limit terminated jobs, newest end first.
LIST_TERMINATED = text("""
    SELECT id, project, spider, job, status, outcome, exit_code, reason, node, pid, attempts, priority, version,
           start_time, end_time
    FROM spider_job WHERE status = 'terminated'
    ORDER BY end_time DESC, id DESC
    LIMIT :limit
""")

# How many terminated jobs are kept.
COUNT_TERMINATED = text("SELECT count(*) FROM spider_job WHERE status = 'terminated'")

# --- operations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchdogLimits:
    """A job's own _max_runtime and _stall_timeout (seconds; None: the node's default applies)."""

    max_runtime: float | None = None
    stall_timeout: float | None = None


class JobEnds:
    """Starting and ending jobs over one database (part of ``JobStore``)."""

    engine: Engine

    @database_errors
    def mark_started(self, claimed: ClaimedJob, *, worker: str, pid: int | None,
                     start_time: datetime.datetime) -> WatchdogLimits | None:
        """Record the crawl's pid; return the job's watchdog limits, or None when the claim no longer owns it."""
        params = {"id": claimed.id, "attempt": claimed.attempt, "worker": worker, "pid": pid,
                  "start_time": on_database_clock(start_time)[0]}
        with db.autocommit(self.engine) as connection:
            row = connection.execute(MARK_STARTED, params).first()
        return None if row is None else WatchdogLimits(row.max_runtime, row.stall_timeout)

    @database_errors
    def finish_job(
        self, *, project: str, spider: str, job: str, start_time: datetime.datetime, end_time: datetime.datetime,
        outcome: str = FINISHED, exit_code: int | None = None, reason: str | None = None, pid: int | None = None,
        node: str | None = None, claimed: ClaimedJob | None = None, worker: str | None = None,
        stats: dict | None = None,
    ) -> bool:
        """Mark a job terminated; return False when a claim no longer owns it (it was recovered meanwhile).

        With ``claimed`` (and its ``worker``) only that claim is finished. Without, the live row of the job id
        claimed by ``worker`` is finished, or a terminated row is recorded for a job that never went through the
        queue. ``stats``: the crawl's final stats (None: keep what its node wrote while it ran).
        """
        params = {"project": project, "spider": spider, "job": job, "outcome": outcome, "exit_code": exit_code,
                  "reason": reason, "pid": pid, "node": node, "worker": worker,
                  "stats": None if stats is None else json.dumps(stats, separators=(",", ":"))}
        params["start_time"], params["end_time"] = on_database_clock(start_time, end_time)
        if claimed is not None:
            params.update(id=claimed.id, attempt=claimed.attempt)
            with db.autocommit(self.engine) as connection:
                return connection.execute(FINISH_JOB, params).first() is not None
        params.update(id=None, attempt=None)
        with db.transaction(self.engine) as connection:
            if connection.execute(FINISH_JOB, params).first() is None:
                connection.execute(INSERT_TERMINATED, params)
            return True

    @database_errors
    def prune_terminated(self, keep: int, keep_dead: int | None = None) -> int:
        """Delete finished jobs beyond the newest ``keep``, and dead ones beyond the newest ``keep_dead`` (None:
        every dead job stays); return how many were deleted."""
        with db.autocommit(self.engine) as connection:
            deleted = connection.execute(PRUNE_TERMINATED, {"keep": max(keep, 0)}).rowcount
            if keep_dead is not None:
                deleted += connection.execute(PRUNE_DEAD, {"keep": max(keep_dead, 0)}).rowcount
            return deleted

    @database_errors
    def list_terminated(self, limit: int) -> list[JobRow]:
        return read_rows(self.engine, JobRow, LIST_TERMINATED, {"limit": limit})

    @database_errors
    def count_terminated(self) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(COUNT_TERMINATED).scalar_one()


