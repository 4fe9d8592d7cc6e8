"""The operator command's queries (``cli/``): ``OperatorQueries``, which ``AllJobsStore`` inherits."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import IntegrityError, text
from scrapyd_pgqueue.store.base import (
    JOB_STATUS,
    NOTIFY_CHANNEL,
    DuplicateJobError,
    JobNotFoundError,
    JobRow,
    database_errors,
    read_rows,
)


@dataclass(frozen=True)
class NodeRow:
    name: str
    url: str | None
    max_proc: int | None
    state: str  # live, silent (no heartbeat within the lease, not stopped) or stopped
    heartbeat_age: float  # seconds since its last heartbeat (database clock)
    running: int
    started_time: datetime.datetime
    tags: list[str] = field(default_factory=list)  # what it may run: jobs requiring a subset of them


# --- operator command ---

# Pending jobs per project and spider, with the oldest one's creation time (a full pass over pending rows).
PENDING_AND_OLDEST_BY_SPIDER = text("""
    SELECT project, spider, count(*) AS pending, min(created_time) AS oldest FROM spider_job
    WHERE status = 'pending'
    GROUP BY project, spider
    ORDER BY project, spider
""")

# Per project and spider: delayed, pending, past due (pending for :past_due seconds since it was due), running and
# dead jobs (a full pass over the waiting, running and dead rows: the operator command, not a hot path).
COUNTS_BY_SPIDER = text("""
    SELECT project, spider,
           count(*) FILTER (WHERE status = 'delayed') AS delayed,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'pending' AND coalesce(run_at, created_time)
                                                         < now() - make_interval(secs => :past_due)) AS past_due,
           count(*) FILTER (WHERE status = 'ongoing') AS running,
           count(*) FILTER (WHERE outcome = 'dead') AS dead
    FROM spider_job
    WHERE status IN ('delayed', 'pending', 'ongoing') OR (status = 'terminated' AND outcome = 'dead')
    GROUP BY project, spider
    ORDER BY project, spider
""")

# Send dead jobs (of :project and :spider, all when NULL) back to pending with their failures forgotten, as they
# were scheduled (their message); a job id that waits or runs again meanwhile is left dead. Wakes idle nodes.
REQUEUE_DEAD = text("""
    WITH requeued AS (
        UPDATE spider_job AS j
        SET status = 'pending', outcome = NULL, exit_code = NULL, reason = NULL, node = NULL, worker = NULL,
            pid = NULL, start_time = NULL, end_time = NULL, run_at = now(), failures = 0, created_time = now(),
            cancel_requested = false, cancel_requests = 0, cancel_signal = NULL, stats = NULL,
            unique_key = spider_job_key_unless_taken(j.project, j.unique_key)
        WHERE status = 'terminated' AND outcome = 'dead' AND message IS NOT NULL
          AND (CAST(:project AS text) IS NULL OR project = :project)
          AND (CAST(:spider AS text) IS NULL OR spider = :spider)
          AND NOT EXISTS (
              SELECT 1 FROM spider_job AS live
              WHERE live.project = j.project AND live.job = j.job AND live.status IN ('delayed', 'pending', 'ongoing')
          )
        RETURNING j.id, j.project, j.job
    ), woken AS (
        SELECT pg_notify(:channel, '') WHERE EXISTS (SELECT 1 FROM requeued)
    )
    SELECT id, project, job FROM requeued, (SELECT count(*) FROM woken) AS notified
""")

# Node processes not stopped, and those stopped within :recent_seconds, each with its running jobs and its state.
NODES = text("""
    SELECT n.name, n.url, n.max_proc, n.started_time, n.tags,
           CAST(extract(epoch FROM now() - n.heartbeat_time) AS double precision) AS heartbeat_age,
           CASE WHEN n.stopped_time IS NOT NULL THEN 'stopped'
                WHEN n.heartbeat_time > now() - make_interval(secs => :lease_seconds) THEN 'live'
                ELSE 'silent' END AS state,
           (SELECT count(*) FROM spider_job AS j WHERE j.status = 'ongoing' AND j.worker = n.id) AS running
    FROM scrapyd_node AS n
    WHERE n.stopped_time IS NULL OR n.stopped_time > now() - make_interval(secs => :recent_seconds)
    ORDER BY n.name, n.started_time DESC
""")

# How many kept finished jobs ended each way (finished, failed, cancelled, lost, interrupted).
OUTCOME_COUNTS = text("""
    SELECT outcome, count(*) AS jobs FROM spider_job WHERE status = 'terminated' GROUP BY outcome ORDER BY outcome
""")

# The newest :limit jobs that did not end well: failed, lost (recovery gave up), interrupted, dead, or stopped by
# the watchdog (timeout, stalled).
TROUBLED_JOBS = text("""
    SELECT id, project, spider, job, status, outcome, exit_code, reason, node, pid, attempts, priority, version,
           start_time, end_time
    FROM spider_job
    WHERE status = 'terminated' AND outcome IN ('failed', 'lost', 'interrupted', 'dead', 'timeout', 'stalled')
    ORDER BY end_time DESC, id DESC
    LIMIT :limit
""")

# Live jobs claimed more than once (recovered from a node that died or stopped), newest first, at most :limit.
RECOVERED_JOBS = text("""
    SELECT id, project, spider, job, status, outcome, exit_code, reason, node, pid, attempts, priority, version,
           start_time, end_time
    FROM spider_job
    WHERE status IN ('pending', 'ongoing') AND attempts > 1
    ORDER BY id DESC
    LIMIT :limit
""")

# The projects that have a row with job id :job (to tell the operator which one to pick). Reads spider_job_job_idx.
PROJECTS_OF_JOB = text("SELECT DISTINCT project FROM spider_job WHERE job = :job ORDER BY project")

# Put the newest terminated run of :project/:job back to pending as it was scheduled (its message), and wake idle
# nodes. attempts keeps counting, so a late writer of an old claim can never finish the new one. The live-job
# unique index refuses it while the same job id is pending or running.
REQUEUE = text("""
    WITH target AS (
        SELECT id FROM spider_job
        WHERE project = :project AND job = :job AND status = 'terminated' AND message IS NOT NULL
        ORDER BY id DESC
        LIMIT 1
        FOR UPDATE
    ), requeued AS (
        UPDATE spider_job AS j
        SET status = 'pending', outcome = NULL, exit_code = NULL, reason = NULL, node = NULL, worker = NULL,
            pid = NULL, start_time = NULL, end_time = NULL, created_time = now(), run_at = now(),
            unique_key = spider_job_key_unless_taken(j.project, j.unique_key),
            cancel_requested = false, cancel_requests = 0, cancel_signal = NULL, stats = NULL
        FROM target
        WHERE j.id = target.id
        RETURNING j.id, j.project
    )
    SELECT id, pg_notify(:channel, '') FROM requeued
""")

# Forget the stored log of a requeued job's previous run.
DELETE_LOG = text("DELETE FROM job_log WHERE job_id = :id")

# Delete finished jobs that ended more than :seconds ago on the database's clock (their logs go with them); a crawl's
# first row stays while another of its workers has not ended (its frontier goes with it).
PRUNE_FINISHED_OLDER_THAN = text("""
    DELETE FROM spider_job AS j WHERE status = 'terminated' AND end_time < now() - make_interval(secs => :seconds)
        AND (crawl IS DISTINCT FROM id OR NOT EXISTS (
            SELECT 1 FROM spider_job AS w WHERE w.crawl = j.id AND w.status <> 'terminated'))
""")


class OperatorQueries:
    """The operator command's operations over one database (part of ``AllJobsStore``)."""

    engine: Engine

    # --- operator command ---

    @database_errors
    def pending_by_spider(self) -> list[dict[str, Any]]:
        with db.autocommit(self.engine) as connection:
            return [row._asdict() for row in connection.execute(PENDING_AND_OLDEST_BY_SPIDER)]

    @database_errors
    def counts_by_spider(self, past_due_seconds: float = 60.0) -> list[dict[str, Any]]:
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(COUNTS_BY_SPIDER, {"past_due": float(past_due_seconds)})
            return [row._asdict() for row in rows]

    @database_errors
    def requeue_dead(self, project: str | None = None, spider: str | None = None) -> list[tuple[str, str]]:
        """Send dead jobs back to pending; return their (project, job)."""
        params = {"project": project, "spider": spider, "channel": NOTIFY_CHANNEL}
        with db.autocommit(self.engine) as connection:
            return [(row.project, row.job) for row in connection.execute(REQUEUE_DEAD, params)]

    @database_errors
    def nodes(self, *, lease_seconds: float, recent_seconds: float = 3600.0) -> list[NodeRow]:
        params = {"lease_seconds": float(lease_seconds), "recent_seconds": float(recent_seconds)}
        return read_rows(self.engine, NodeRow, NODES, params)

    @database_errors
    def outcome_counts(self) -> dict[str, int]:
        with db.autocommit(self.engine) as connection:
            return {row.outcome: row.jobs for row in connection.execute(OUTCOME_COUNTS)}

    @database_errors
    def troubled_jobs(self, limit: int = 20) -> list[JobRow]:
        return read_rows(self.engine, JobRow, TROUBLED_JOBS, {"limit": limit})

    @database_errors
    def recovered_jobs(self, limit: int = 20) -> list[JobRow]:
        return read_rows(self.engine, JobRow, RECOVERED_JOBS, {"limit": limit})

    @database_errors
    def projects_of_job(self, job: str) -> list[str]:
        with db.autocommit(self.engine) as connection:
            return list(connection.execute(PROJECTS_OF_JOB, {"job": job}).scalars())

    @database_errors
    def requeue(self, project: str, job: str) -> int:
        """Put the newest finished run of ``job`` back to pending; return its row id."""
        params = {"project": project, "job": job, "channel": NOTIFY_CHANNEL}
        try:
            with db.transaction(self.engine) as connection:
                row = connection.execute(REQUEUE, params).first()
                if row is None and connection.execute(JOB_STATUS, params).scalar() in ("pending", "ongoing"):
                    raise DuplicateJobError(f"job id '{job}' is already pending or running in project '{project}'")
                if row is None:
                    raise JobNotFoundError(
                        f"no finished job '{job}' in project '{project}' that can be requeued "
                        "(it must have gone through the queue)"
                    )
                connection.execute(DELETE_LOG, {"id": row.id})
                return row.id
        except IntegrityError as e:
            if getattr(e.orig, "diag", None) and e.orig.diag.constraint_name == "spider_job_live_job_key":
                raise DuplicateJobError(
                    f"job id '{job}' is already pending or running in project '{project}'"
                ) from None
            raise

    @database_errors
    def prune_finished_older_than(self, age: datetime.timedelta) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(PRUNE_FINISHED_OLDER_THAN, {"seconds": age.total_seconds()}).rowcount
