"""Every node's jobs, for the web services, the pages and the CLI: job status, pending pages, running and finished
lists, counts, cancel and logs; ``AllJobsStore``, which also holds the operator command's queries
(``operator.OperatorQueries``) and the crawl trees' (``trees.TreeQueries``).
"""

from __future__ import annotations

import datetime
import signal as signals
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.database import clock, db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import (
    CANCEL_CHANNEL,
    JOB_STATUS,
    ClaimedJob,
    StorePerEngine,
    database_errors,
    read_rows,
)
from scrapyd_pgqueue.store.operator import OperatorQueries
from scrapyd_pgqueue.store.trees import TreeQueries
from scrapyd_pgqueue.tags import pool_tags

# Pending jobs daemonstatus.json counts exactly (a few milliseconds); beyond, it reports the planner's estimate.
PENDING_COUNT_CAP = 10_000
# The signal numbers a cancel request may carry: 0 is none (it signals nothing), nor is any number the system lacks.
SIGNAL_NUMBERS = frozenset(int(number) for number in signals.valid_signals())


class RequiresTags:
    """A job's row with its pool: the tags a node needs to run it (``tags``)."""

    pool: str

    @property
    def tags(self) -> list[str]:
        return pool_tags(self.pool)


@dataclass(frozen=True)
class PendingJob(RequiresTags):
    project: str
    job: str
    message: dict[str, Any]
    run_at: datetime.datetime | None = None  # a delayed job's due time
    pool: str = ""  # the tags it requires, joined (store/pools.py)
    crawl: str | None = None  # the crawl it is a worker of: the crawl's first job id


@dataclass(frozen=True)
class StartedJob(RequiresTags):
    """What a running job's row and a finished one's share."""

    id: int
    project: str
    spider: str
    job: str


@dataclass(frozen=True)
class RunningJob(StartedJob):
    pid: int | None
    start_time: datetime.datetime | None
    node: str | None
    worker: str | None
    stats: dict[str, Any] | None = None  # the keys of its stats that job_stats.stats_summary reads
    pool: str = ""  # the tags it requires, joined (store/pools.py)
    crawl: str | None = None  # the crawl it is a worker of: the crawl's first job id


@dataclass(frozen=True)
class FinishedJobRow(StartedJob):
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None
    node: str | None
    outcome: str | None
    has_log: bool
    stats: dict[str, Any] | None = None  # the keys of its stats that job_stats.stats_summary reads
    pool: str = ""  # the tags it required, joined (store/pools.py)
    crawl: str | None = None  # the crawl it is a worker of: the crawl's first job id


@dataclass(frozen=True)
class ClusterCounts:
    pending: int
    pending_exact: bool  # False: more than PENDING_COUNT_CAP, and ``pending`` is the planner's estimate
    running: int
    finished: int
    nodes: int  # live ones: not stopped, heartbeat within the lease
    delayed: int = 0  # waiting for their time (capped like pending)
    past_due: int = 0  # pending for longer than past_due_seconds since due (capped like pending)
    dead: int = 0  # out of retries, kept until requeued
    unroutable: int = 0  # pending, requiring tags no live node has all of (capped like pending, per tag set)


def cancel_signal(value: str) -> str:
    """A cancel request's signal as stored: a name without ``SIG`` (``TERM``, ``KILL``, ``USR1``; any case, with or
    without ``SIG``) or a number of a real signal; ValueError, saying what is accepted, for anything else."""
    if value.isascii() and value.isdigit():
        if len(value) <= 3 and int(value) in SIGNAL_NUMBERS:
            return str(int(value))
    elif value.isascii():
        name = value.upper().removeprefix("SIG")
        if f"SIG{name}" in signals.Signals.__members__:
            return name
    raise ValueError(f"signal must be a signal's name (INT, TERM, KILL, ...) or number (1-{max(SIGNAL_NUMBERS)}), "
                     f"not {value[:40]!r}")


def signal_number(value: str) -> int:
    """The number of a stored signal, to send; ValueError for a value that is none (a row written another way)."""
    value = cancel_signal(value)
    return int(value) if value.isdigit() else int(signals.Signals[f"SIG{value}"])


@dataclass(frozen=True)
class CancelRequest:
    """Cancel requests made on a running job: the node running it sends one signal per request not yet sent."""

    id: int
    project: str
    job: str
    worker: str
    requests: int
    signal: str


@dataclass(frozen=True)
class StoredLog:
    """Where a job's log can be found: its stored tail, or the node process running (or that ran) it."""

    status: str
    log: bytes | None
    worker: str | None
    node_url: str | None


# One page of waiting jobs (of :project, all when NULL) in run order: pending ones in claim order, then delayed ones
# by due time. Each part reads the head of its index (spider_job_pending_idx or the per-project one, each pool's range
# merged by priority; spider_job_delayed_idx) up to :offset + :limit rows, so a page costs its size plus the offset
# (times the pending pools), never the backlog. :offset + :limit is a bigint: the largest offset leaves room for any
# limit.
MAX_PENDING_OFFSET = 2**62
PENDING_PAGE = text("""
    SELECT project, job, message, run_at, pool,
           (SELECT c.job FROM spider_job AS c WHERE c.id = waiting.crawl) AS crawl FROM (
        (SELECT 0 AS part, head.* FROM spider_job_pending_pools() AS pending(pool), LATERAL (
             SELECT project, job, message, NULL::timestamptz AS run_at, priority, id, pool, crawl FROM spider_job
             WHERE status = 'pending' AND pool = pending.pool
               AND (CAST(:project AS text) IS NULL OR project = :project)
             ORDER BY priority DESC, id LIMIT :offset + :limit) AS head
         ORDER BY head.priority DESC, head.id LIMIT :offset + :limit)
        UNION ALL
        (SELECT 1, project, job, message, run_at, priority, id, pool, crawl FROM spider_job
         WHERE status = 'delayed' AND (CAST(:project AS text) IS NULL OR project = :project)
         ORDER BY run_at, id LIMIT :offset + :limit)
    ) AS waiting
    ORDER BY part, CASE WHEN part = 1 THEN run_at END, priority DESC, id
    LIMIT :limit OFFSET :offset
""")

# The running jobs (of :project, all when NULL) of every node: bounded by the cluster's process slots. Of a job's
# stats, the keys its summary reads (spider_job_stats_summary), not the whole dict: a list of many jobs stays small.
RUNNING_JOBS = text("""
    SELECT id, project, spider, job, pid, start_time, node, worker,
           spider_job_stats_summary(j.stats) AS stats, pool,
           (SELECT c.job FROM spider_job AS c WHERE c.id = j.crawl) AS crawl
    FROM spider_job AS j
    WHERE status = 'ongoing' AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY start_time, id
""")

# The newest :limit finished jobs (of :project, all when NULL), with whether the database holds their log.
# Reads spider_job_terminated_idx; terminated rows are pruned to finished_to_keep. Stats: as RUNNING_JOBS.
FINISHED_JOBS = text("""
    SELECT j.id, j.project, j.spider, j.job, j.start_time, j.end_time, j.node, j.outcome,
           EXISTS (SELECT 1 FROM job_log AS l WHERE l.job_id = j.id) AS has_log,
           spider_job_stats_summary(j.stats) AS stats, j.pool,
           (SELECT c.job FROM spider_job AS c WHERE c.id = j.crawl) AS crawl
    FROM spider_job AS j
    WHERE j.status = 'terminated' AND (CAST(:project AS text) IS NULL OR j.project = :project)
    ORDER BY j.end_time DESC, j.id DESC
    LIMIT :limit
""")

# The cluster at a glance. Pending, delayed and past-due jobs (pending for :past_due seconds since they were due:
# a range of spider_job_pending_due_idx) are counted up to :cap only (an exact count of a huge backlog is a scan
# costing tens of milliseconds per request), with the planner's estimate of the pending index's size for beyond;
# running and finished jobs are few (process slots; pruned to finished_to_keep); live nodes are those not stopped
# whose heartbeat is within :lease_seconds (database clock); unroutable jobs are the pending ones of the pools no live
# node can run (spider_job_unroutable_pools: one probe per pending pool).
CLUSTER_COUNTS = text("""
    SELECT (SELECT count(*) FROM (SELECT 1 FROM spider_job WHERE status = 'pending' LIMIT :cap) AS capped)
               AS pending_counted,
           (SELECT count(*) FROM (SELECT 1 FROM spider_job WHERE status = 'delayed' LIMIT :cap) AS capped)
               AS delayed,
           (SELECT count(*) FROM (
                SELECT 1 FROM spider_job
                WHERE status = 'pending' AND run_at < now() - make_interval(secs => :past_due)
                LIMIT :cap) AS capped) AS past_due,
           (SELECT count(*) FROM spider_job WHERE status = 'terminated' AND outcome = 'dead') AS dead,
           (SELECT reltuples FROM pg_class WHERE oid = CAST('spider_job_pending_idx' AS regclass)) AS pending_estimate,
           (SELECT count(*) FROM spider_job WHERE status = 'ongoing') AS running,
           (SELECT count(*) FROM spider_job WHERE status = 'terminated') AS finished,
           (SELECT count(*) FROM scrapyd_node
            WHERE stopped_time IS NULL AND heartbeat_time > now() - make_interval(secs => :lease_seconds)) AS nodes,
           (SELECT coalesce(sum(jobs), 0) FROM spider_job_unroutable_pools(:lease_seconds, :cap)) AS unroutable
""")

# Cancel a waiting (pending or delayed) job: terminated as 'cancelled' (end at the cancel), so it never starts (nor
# retries) and every node reports it finished. A claim that locked the row first wins; the running job is then
# cancelled instead. Only while the caller waits for the answer (in_time), as for REQUEST_CANCEL. Its webhooks'
# events (ended) are written with it (trigger spider_job_ended).
CANCEL_PENDING = text("""
    WITH in_time AS MATERIALIZED (SELECT clock_timestamp() < to_timestamp(:answer_by) AS ok), cancelled AS (
        UPDATE spider_job
        SET status = 'terminated', outcome = 'cancelled', reason = 'cancelled before it started',
            cancel_requested = true, start_time = coalesce(start_time, now()), end_time = now()
        WHERE project = :project AND job = :job AND status IN ('delayed', 'pending') AND (SELECT ok FROM in_time)
        RETURNING id
    )
    SELECT (SELECT ok FROM in_time) AS in_time, (SELECT count(*) FROM cancelled) AS done
""")

# Ask the node running job :job to signal its crawl: one more request, with its signal, and a NOTIFY that the
# node hears at once (its heartbeat reads the same columns as the floor). Reads spider_job_live_job_key.
REQUEST_CANCEL = text("""
    WITH in_time AS MATERIALIZED (SELECT clock_timestamp() < to_timestamp(:answer_by) AS ok), requested AS (
        UPDATE spider_job
        SET cancel_requested = true, cancel_requests = cancel_requests + 1, cancel_signal = :signal
        WHERE project = :project AND job = :job AND status = 'ongoing' AND (SELECT ok FROM in_time)
        RETURNING id, project, job, worker, cancel_requests, cancel_signal
    ), notified AS (
        SELECT pg_notify(:channel, json_build_object(
            'id', id, 'project', project, 'job', job, 'worker', worker, 'requests', cancel_requests,
            'signal', cancel_signal)::text)
        FROM requested
    )
    SELECT (SELECT ok FROM in_time) AS in_time, (SELECT count(*) FROM notified) AS done
""")

# The cancel requests on the running jobs of process :worker (the heartbeat's floor under the NOTIFY).
# Reads spider_job_ongoing_worker_idx.
REQUESTED_CANCELS = text("""
    SELECT id, project, job, worker, cancel_requests AS requests, cancel_signal AS signal FROM spider_job
    WHERE status = 'ongoing' AND worker = :worker AND cancel_requests > 0
""")

# Store the log of claim :attempt of job :id while no newer claim exists (so a node that lost the job to recovery
# cannot overwrite the log of a newer attempt); a retried finish stores it again.
SAVE_CLAIMED_LOG = text("""
    INSERT INTO job_log (job_id, log, size)
    SELECT id, :log, :size FROM spider_job
    WHERE id = :id AND worker = :worker AND attempts = :attempt
    ON CONFLICT (job_id) DO UPDATE SET log = excluded.log, size = excluded.size, created_time = now()
""")

# Store the log of the newest run of job id :job of :project (a job that did not come from this package's poller).
SAVE_LOG_BY_JOB_ID = text("""
    INSERT INTO job_log (job_id, log, size)
    SELECT id, :log, :size FROM spider_job
    WHERE project = :project AND job = :job
    ORDER BY id DESC
    LIMIT 1
    ON CONFLICT (job_id) DO UPDATE SET log = excluded.log, size = excluded.size, created_time = now()
""")

# The whole stats of the newest run of :job of :project (stats.json); no row: an unknown job. Reads
# spider_job_job_idx.
JOB_STATS = text("""
    SELECT stats FROM spider_job WHERE job = :job AND project = :project ORDER BY id DESC LIMIT 1
""")

# Where the log of the newest run of :project/:spider/:job is: its stored tail, else the node process with it
# (while that process has not stopped).
FIND_LOG = text("""
    SELECT j.status, l.log, j.worker, CASE WHEN n.stopped_time IS NULL THEN n.url END AS node_url
    FROM spider_job AS j
    LEFT JOIN job_log AS l ON l.job_id = j.id
    LEFT JOIN scrapyd_node AS n ON n.id = j.worker
    WHERE j.job = :job AND j.project = :project AND j.spider = :spider
    ORDER BY j.id DESC
    LIMIT 1
""")


class AllJobsStore(StorePerEngine, OperatorQueries, TreeQueries):
    """The jobs of every node: looked up, listed, counted, cancelled, their logs; for the web services, the pages,
    the node's cancel events and the operator command."""

    @database_errors
    def job_status(self, job: str, project: str | None = None) -> str | None:
        """The job's state as Scrapyd names it: 'pending', 'running', 'finished', or None when unknown."""
        with db.autocommit(self.engine) as connection:
            status = connection.execute(JOB_STATUS, {"job": job, "project": project}).scalar()
        return {"delayed": "pending", "pending": "pending", "ongoing": "running", "terminated": "finished"}.get(status)

    @database_errors
    def pending_page(self, project: str | None, limit: int, offset: int = 0) -> tuple[list[PendingJob], bool]:
        """Up to ``limit`` pending jobs from ``offset`` in claim order, and whether more follow."""
        params = {"project": project, "limit": limit + 1, "offset": offset}
        with db.autocommit(self.engine) as connection:
            rows = [PendingJob(**row._asdict()) for row in connection.execute(PENDING_PAGE, params)]
        return rows[:limit], len(rows) > limit

    @database_errors
    def running_jobs(self, project: str | None = None) -> list[RunningJob]:
        return read_rows(self.engine, RunningJob, RUNNING_JOBS, {"project": project})

    @database_errors
    def finished_jobs(self, project: str | None, limit: int) -> list[FinishedJobRow]:
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(FINISHED_JOBS, {"project": project, "limit": limit})
            return [FinishedJobRow(**row._asdict()) for row in rows]

    @database_errors
    def cluster_counts(self, lease_seconds: float, past_due_seconds: float = 60.0) -> ClusterCounts:
        params = {"lease_seconds": float(lease_seconds), "cap": PENDING_COUNT_CAP, "past_due": past_due_seconds}
        with db.autocommit(self.engine) as connection:
            row = connection.execute(CLUSTER_COUNTS, params).one()
        exact = row.pending_counted < PENDING_COUNT_CAP
        pending = row.pending_counted if exact else max(PENDING_COUNT_CAP, int(row.pending_estimate or 0))
        return ClusterCounts(
            pending, exact, row.running, row.finished, row.nodes, row.delayed, row.past_due, row.dead,
            int(row.unroutable),
        )

    @database_errors
    def cancel_job(self, project: str, job: str, signal: str = "INT") -> str | None:
        """Cancel a pending job, or ask the node running it to signal it (``signal`` as ``cancel_signal`` gives
        it); return Scrapyd's ``prevstate``. Nothing changes once the caller's time is up (``clock.answer_by``)."""
        params = {"project": project, "job": job, "answer_by": clock.answer_by(), "signal": signal,
                  "channel": CANCEL_CHANNEL}
        with db.autocommit(self.engine) as connection:
            for statement, prevstate in ((CANCEL_PENDING, "pending"), (REQUEST_CANCEL, "running")):
                row = connection.execute(statement, params).one()
                if not row.in_time:
                    raise db.too_late(self.engine, "nothing was cancelled")
                if row.done:
                    return prevstate
        return None

    @database_errors
    def requested_cancels(self, worker: str) -> list[CancelRequest]:
        return read_rows(self.engine, CancelRequest, REQUESTED_CANCELS, {"worker": worker})

    @database_errors
    def save_log(
        self, *, project: str, job: str, log: bytes, size: int, claimed: ClaimedJob | None = None,
        worker: str | None = None,
    ) -> None:
        """Store a finished job's log (already capped by the caller) for every node to serve."""
        with db.autocommit(self.engine) as connection:
            if claimed is not None:
                params = {"id": claimed.id, "attempt": claimed.attempt, "worker": worker, "log": log, "size": size}
                connection.execute(SAVE_CLAIMED_LOG, params)
            else:
                params = {"project": project, "job": job, "log": log, "size": size}
                connection.execute(SAVE_LOG_BY_JOB_ID, params)

    @database_errors
    def job_stats(self, project: str, job: str) -> dict[str, Any] | None:
        """The stats of the newest run of a job as stored (``{}`` when it reported none yet); None: no such job."""
        with db.autocommit(self.engine) as connection:
            row = connection.execute(JOB_STATS, {"project": project, "job": job}).first()
        return None if row is None else row.stats or {}

    @database_errors
    def find_log(self, project: str, spider: str, job: str) -> StoredLog | None:
        with db.autocommit(self.engine) as connection:
            params = {"project": project, "spider": spider, "job": job}
            row = connection.execute(FIND_LOG, params).first()
        if row is None:
            return None
        return StoredLog(row.status, None if row.log is None else bytes(row.log), row.worker, row.node_url)
