"""Every queue operation, each one short statement; all of the package's SQL lives here.

No Twisted and no Scrapyd imports: the store is used by the Scrapyd adapters, the operator command and the
benchmark alike. Every method runs in its own short transaction; none is held while a crawl runs.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from scrapyd_pgqueue import db
from scrapyd_pgqueue.models import FINISHED

# Channel of the NOTIFY sent with every enqueue; the payload is the project.
NOTIFY_CHANNEL = "scrapyd_pgqueue_jobs"


class DuplicateJobError(ValueError):
    """A pending or running job of the project already has this job id."""


class InvalidJobError(ValueError):
    """The job cannot be stored as given (reason in the message)."""


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    project: str
    job: str
    attempt: int  # the claim's number: finishing it is conditional on it
    message: dict[str, Any]


@dataclass(frozen=True)
class JobRow:
    id: int
    project: str
    spider: str
    job: str
    status: str
    outcome: str | None
    exit_code: int | None
    reason: str | None
    node: str | None
    pid: int | None
    attempts: int
    priority: float
    version: str | None
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None


# --- queries ---------------------------------------------------------------------------------------------------

# Add a pending job and wake idle nodes; NOTIFY is delivered on commit, so a woken node finds the row.
ENQUEUE = text("""
    WITH inserted AS (
        INSERT INTO spider_job (project, spider, job, version, priority, message, status, created_time)
        VALUES (:project, :spider, :job, :version, :priority, CAST(:message AS jsonb), 'pending', :now)
        RETURNING id
    )
    SELECT id, pg_notify(:channel, :project) FROM inserted
""")

# Claim the next :limit pending jobs of :projects (all projects when NULL) for this node.
# Shaped for concurrency: the CTE locks rows with FOR UPDATE SKIP LOCKED, so concurrent claimers pass over
# each other's rows instead of queueing behind them, and it is materialised once, so LIMIT holds (LIMIT = the
# caller's free slots: a node never takes more than it can start). It reads spider_job_pending_idx (or
# spider_job_pending_project_idx for one project) from its head in (priority DESC, id) order, so a claim costs
# the same with a hundred or a million pending rows. The row lock is held only for this statement.
CLAIM_NEXT_JOBS = text("""
    WITH next_jobs AS (
        SELECT id FROM spider_job
        WHERE status = 'pending' AND (CAST(:projects AS text[]) IS NULL OR project = ANY(:projects))
        ORDER BY priority DESC, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE spider_job AS j
    SET status = 'ongoing', node = :node, worker = :worker, start_time = :now, attempts = j.attempts + 1
    FROM next_jobs
    WHERE j.id = next_jobs.id
    RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority
""")

# Whether any of :projects (all when NULL) has a pending job: an index probe, unlike COUNT(*).
HAS_PENDING = text("""
    SELECT EXISTS (
        SELECT 1 FROM spider_job
        WHERE status = 'pending' AND (CAST(:projects AS text[]) IS NULL OR project = ANY(:projects))
    )
""")

# Count the pending jobs of a project (ISpiderQueue.count; not for hot paths on large backlogs).
COUNT_PENDING = text("SELECT count(*) FROM spider_job WHERE status = 'pending' AND project = :project")

# The pending messages of a project in claim order, at most :limit (all when NULL).
LIST_PENDING = text("""
    SELECT id, message FROM spider_job
    WHERE status = 'pending' AND project = :project
    ORDER BY priority DESC, id
    LIMIT :limit
""")

# Delete pending jobs by id; a job claimed meanwhile is left alone.
DELETE_PENDING = text("""
    DELETE FROM spider_job WHERE id = ANY(:ids) AND status = 'pending' AND project = :project
""")

# Delete every pending job of a project.
CLEAR_PENDING = text("DELETE FROM spider_job WHERE status = 'pending' AND project = :project")

# Record the crawl's pid once it is spawned; only while this claim still owns the job.
MARK_STARTED = text("""
    UPDATE spider_job SET pid = :pid, start_time = :start_time
    WHERE id = :id AND status = 'ongoing' AND worker = :worker AND attempts = :attempt
""")

# Terminate the claim :attempt of job :id held by :worker; a late writer whose claim was recovered changes nothing.
FINISH_CLAIMED = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = :outcome, exit_code = :exit_code, reason = :reason,
        pid = coalesce(:pid, pid), start_time = :start_time, end_time = :end_time
    WHERE id = :id AND status = 'ongoing' AND worker = :worker AND attempts = :attempt
    RETURNING id
""")

# Terminate a job known only by project and job id (IJobStorage.add from a stock launcher).
FINISH_BY_JOB_ID = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = :outcome, exit_code = :exit_code, reason = :reason,
        pid = coalesce(:pid, pid), node = coalesce(node, :node), start_time = :start_time, end_time = :end_time
    WHERE project = :project AND job = :job AND status = 'ongoing'
    RETURNING id
""")

# Record a job that never went through the queue as terminated.
INSERT_TERMINATED = text("""
    INSERT INTO spider_job (project, spider, job, status, outcome, exit_code, reason, node, pid,
                            created_time, start_time, end_time)
    VALUES (:project, :spider, :job, 'terminated', :outcome, :exit_code, :reason, :node, :pid,
            :start_time, :start_time, :end_time)
""")

# Delete terminated jobs beyond the newest :keep (reads spider_job_terminated_idx).
PRUNE_TERMINATED = text("""
    DELETE FROM spider_job WHERE id IN (
        SELECT id FROM spider_job WHERE status = 'terminated' ORDER BY end_time DESC OFFSET :keep
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


# Register this Scrapyd process (or refresh it after a reconnect); its heartbeat starts now.
REGISTER_NODE = text("""
    INSERT INTO scrapyd_node (id, name, url, max_proc) VALUES (:worker, :name, :url, :max_proc)
    ON CONFLICT (id) DO UPDATE SET heartbeat_time = now(), stopped_time = NULL
""")

# Renew this process's lease on the jobs it runs (database clock: nodes' clocks may disagree).
HEARTBEAT = text("UPDATE scrapyd_node SET heartbeat_time = now() WHERE id = :worker")

# Mark this process stopped (graceful shutdown).
STOP_NODE = text("UPDATE scrapyd_node SET stopped_time = now() WHERE id = :worker")

# --- operations ------------------------------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now()


def _database_errors(method):
    """Driver errors leave the store as ``db.DatabaseError`` naming host and port, never the password."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with db.translate_errors(self.engine.url):
            return method(self, *args, **kwargs)

    return wrapper


def _encode_message(message: dict[str, Any]) -> str:
    try:
        encoded = json.dumps(message, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidJobError(f"job arguments must be JSON-serialisable finite values: {e}") from e
    if "\x00" in encoded or "\\u0000" in encoded:
        raise InvalidJobError("job arguments may not contain NUL characters")
    return encoded


class JobStore:
    """The queue operations over one database."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def for_url(cls, url: str) -> JobStore:
        return _store_for_engine(db.get_engine(url))

    @_database_errors
    def enqueue(self, project: str, message: dict[str, Any], priority: float = 0.0) -> int:
        """Add ``message`` (ISpiderQueue's message: spider args plus ``name``) as a pending job; return its row id."""
        priority = float(priority)
        if not math.isfinite(priority):
            raise InvalidJobError(f"priority must be a finite number, not {priority!r}")
        job = message.get("_job")
        if job is None:
            job = uuid.uuid1().hex  # the row needs an id; the message stays exactly as given
        params = {
            "project": project,
            "spider": message["name"],
            "job": str(job),
            "version": message.get("_version"),
            "priority": priority,
            "message": _encode_message(message),
            "now": _now(),
            "channel": NOTIFY_CHANNEL,
        }
        try:
            with self.engine.begin() as connection:
                return connection.execute(ENQUEUE, params).scalar_one()
        except IntegrityError as e:
            if getattr(e.orig, "diag", None) and e.orig.diag.constraint_name == "spider_job_live_job_key":
                raise DuplicateJobError(
                    f"job id '{job}' is already pending or running in project '{project}'"
                ) from None
            raise

    @_database_errors
    def claim_next_jobs(
        self, projects: Iterable[str] | None, limit: int, *, node: str, worker: str
    ) -> list[ClaimedJob]:
        """Move up to ``limit`` of the best pending jobs to ``ongoing`` for this node, in claim order."""
        if limit <= 0:
            return []
        params = {
            "projects": None if projects is None else list(projects),
            "limit": limit,
            "node": node,
            "worker": worker,
            "now": _now(),
        }
        with self.engine.begin() as connection:
            rows = connection.execute(CLAIM_NEXT_JOBS, params).all()
        rows.sort(key=lambda row: (-row.priority, row.id))  # RETURNING has no order
        return [ClaimedJob(row.id, row.project, row.job, row.attempts, row.message) for row in rows]

    @_database_errors
    def has_pending(self, projects: Iterable[str] | None = None) -> bool:
        with self.engine.connect() as connection:
            params = {"projects": None if projects is None else list(projects)}
            return connection.execute(HAS_PENDING, params).scalar_one()

    @_database_errors
    def count_pending(self, project: str) -> int:
        with self.engine.connect() as connection:
            return connection.execute(COUNT_PENDING, {"project": project}).scalar_one()

    @_database_errors
    def list_pending(self, project: str, limit: int | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as connection:
            rows = connection.execute(LIST_PENDING, {"project": project, "limit": limit})
            return [row.message for row in rows]

    @_database_errors
    def remove_pending(self, project: str, predicate: Callable[[dict[str, Any]], bool]) -> int:
        """Delete the pending jobs whose message satisfies ``predicate``; return how many were deleted."""
        with self.engine.begin() as connection:
            rows = connection.execute(LIST_PENDING, {"project": project, "limit": None}).all()
            ids = [row.id for row in rows if predicate(row.message)]
            if not ids:
                return 0
            return connection.execute(DELETE_PENDING, {"ids": ids, "project": project}).rowcount

    @_database_errors
    def clear_pending(self, project: str) -> int:
        with self.engine.begin() as connection:
            return connection.execute(CLEAR_PENDING, {"project": project}).rowcount

    @_database_errors
    def mark_started(self, claimed: ClaimedJob, *, worker: str, pid: int | None, start_time: datetime.datetime) -> bool:
        params = {"id": claimed.id, "attempt": claimed.attempt, "worker": worker, "pid": pid, "start_time": start_time}
        with self.engine.begin() as connection:
            return connection.execute(MARK_STARTED, params).rowcount == 1

    @_database_errors
    def finish_job(
        self,
        *,
        project: str,
        spider: str,
        job: str,
        start_time: datetime.datetime,
        end_time: datetime.datetime,
        outcome: str = FINISHED,
        exit_code: int | None = None,
        reason: str | None = None,
        pid: int | None = None,
        node: str | None = None,
        claimed: ClaimedJob | None = None,
        worker: str | None = None,
    ) -> bool:
        """Mark a job terminated; return False when a claim no longer owns it (it was recovered meanwhile).

        With ``claimed`` (and its ``worker``) only that claim is finished. Without, the live row of the job id
        is finished, or a terminated row is recorded for a job that never went through the queue.
        """
        params = {
            "project": project,
            "spider": spider,
            "job": job,
            "start_time": start_time,
            "end_time": end_time,
            "outcome": outcome,
            "exit_code": exit_code,
            "reason": reason,
            "pid": pid,
            "node": node,
        }
        with self.engine.begin() as connection:
            if claimed is not None:
                params.update(id=claimed.id, attempt=claimed.attempt, worker=worker)
                return connection.execute(FINISH_CLAIMED, params).first() is not None
            if connection.execute(FINISH_BY_JOB_ID, params).first() is None:
                connection.execute(INSERT_TERMINATED, params)
            return True

    @_database_errors
    def prune_terminated(self, keep: int) -> int:
        with self.engine.begin() as connection:
            return connection.execute(PRUNE_TERMINATED, {"keep": max(keep, 0)}).rowcount

    @_database_errors
    def list_terminated(self, limit: int) -> list[JobRow]:
        with self.engine.connect() as connection:
            return [JobRow(**row._mapping) for row in connection.execute(LIST_TERMINATED, {"limit": limit})]

    @_database_errors
    def count_terminated(self) -> int:
        with self.engine.connect() as connection:
            return connection.execute(COUNT_TERMINATED).scalar_one()

    @_database_errors
    def register_node(self, *, worker: str, name: str, url: str | None, max_proc: int | None) -> None:
        with self.engine.begin() as connection:
            connection.execute(REGISTER_NODE, {"worker": worker, "name": name, "url": url, "max_proc": max_proc})

    @_database_errors
    def heartbeat(self, worker: str) -> bool:
        """Renew the lease; False when the node row is gone (the caller registers again)."""
        with self.engine.begin() as connection:
            return connection.execute(HEARTBEAT, {"worker": worker}).rowcount == 1

    @_database_errors
    def stop_node(self, worker: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(STOP_NODE, {"worker": worker})


@functools.cache
def _store_for_engine(engine: Engine) -> JobStore:
    return JobStore(engine)
