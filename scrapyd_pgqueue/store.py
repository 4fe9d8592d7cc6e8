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
from sqlalchemy.exc import IntegrityError

from scrapyd_pgqueue import db
from scrapyd_pgqueue.models import FINISHED, PENDING

# Channel of the NOTIFY sent with every enqueue; the payload is the project.
NOTIFY_CHANNEL = "scrapyd_pgqueue_jobs"

# Longest project, spider, job id or version stored: (project, job) is one index entry, which Postgres caps at
# 2704 bytes.
MAX_NAME_BYTES = 1000


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
class ReleasedJob:
    """A running job taken from its node: back to ``pending``, or ``terminated`` once out of attempts."""

    id: int
    project: str
    job: str
    status: str


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

def _claim_statement(which_projects: str):
    """The claim, for one way of choosing projects (a fixed SQL fragment, never a value)."""
    return text(f"""
        WITH next_jobs AS (
            SELECT id FROM spider_job
            WHERE status = 'pending' AND {which_projects}
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


# Claim the next :limit pending jobs for this node: of any project, of the :projects it can run, or of one
# :project (ISpiderQueue.pop). Shaped for concurrency: the CTE locks rows with FOR UPDATE SKIP LOCKED, so
# concurrent claimers pass over each other's rows instead of queueing behind them, and it is materialised once,
# so LIMIT holds (LIMIT = the caller's free slots: a node never takes more than it can start). It reads
# spider_job_pending_idx from its head in (priority DESC, id) order, so a claim costs the same with a hundred or a
# million pending rows; one project reads spider_job_pending_project_idx from the head of that project (a list of
# projects cannot: an ordered index scan takes one value of its leading column). The row lock is held only for
# this statement.
CLAIM_NEXT_JOBS = _claim_statement("true")
CLAIM_NEXT_JOBS_OF_PROJECTS = _claim_statement("project = ANY(:projects)")
CLAIM_NEXT_JOBS_OF_PROJECT = _claim_statement("project = :project")

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

# Terminate the claim :attempt of job :id held by :worker. Still allowed once recovery handed the job back or gave
# it up as lost, as long as nobody claimed it since (same worker and attempt): the result of a node that came back
# late is kept then. A newer attempt, or a job already finished, is never overwritten.
FINISH_CLAIMED = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = :outcome, exit_code = :exit_code, reason = :reason,
        pid = coalesce(:pid, pid), start_time = :start_time, end_time = :end_time
    WHERE id = :id AND worker = :worker AND attempts = :attempt
      AND (status IN ('ongoing', 'pending') OR outcome = 'lost')
    RETURNING id
""")

# Terminate a job known only by project and job id, claimed by this process (IJobStorage.add from a stock launcher).
FINISH_BY_JOB_ID = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = :outcome, exit_code = :exit_code, reason = :reason,
        pid = coalesce(:pid, pid), node = coalesce(node, :node), start_time = :start_time, end_time = :end_time
    WHERE project = :project AND job = :job AND status = 'ongoing' AND worker = :worker
    RETURNING id
""")

# Record a job that never went through the queue as terminated; nothing when the job id is live on another node.
INSERT_TERMINATED = text("""
    INSERT INTO spider_job (project, spider, job, status, outcome, exit_code, reason, node, pid,
                            created_time, start_time, end_time)
    SELECT :project, :spider, :job, 'terminated', :outcome, :exit_code, :reason, :node, :pid,
           :start_time, :start_time, :end_time
    WHERE NOT EXISTS (
        SELECT 1 FROM spider_job WHERE project = :project AND job = :job AND status IN ('pending', 'ongoing')
    )
""")

# Delete terminated jobs beyond the newest :keep (reads spider_job_terminated_idx). Nodes prune after every finish,
# at the same time: SKIP LOCKED leaves rows another pruner is deleting to it, instead of deadlocking with it.
PRUNE_TERMINATED = text("""
    DELETE FROM spider_job WHERE id IN (
        SELECT id FROM spider_job WHERE status = 'terminated' ORDER BY end_time DESC OFFSET :keep
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


# Register this Scrapyd process (or refresh it after a reconnect); its heartbeat starts now.
REGISTER_NODE = text("""
    INSERT INTO scrapyd_node (id, name, url, max_proc) VALUES (:worker, :name, :url, :max_proc)
    ON CONFLICT (id) DO UPDATE SET heartbeat_time = now(), stopped_time = NULL
""")

# Renew this process's lease on the jobs it runs (database clock: nodes' clocks may disagree).
HEARTBEAT = text("UPDATE scrapyd_node SET heartbeat_time = now() WHERE id = :worker")

# Mark this process stopped (graceful shutdown).
STOP_NODE = text("UPDATE scrapyd_node SET stopped_time = now() WHERE id = :worker")

# Recover the jobs of every other process whose lease expired (no heartbeat for :lease_seconds, database clock) or
# that stopped: back to pending (the claim stays counted in attempts); or terminated, as 'cancelled' when cancel.json
# asked for it (a cancelled job never runs again) or as 'lost' once :max_attempts claims are used up. Pending ones
# wake idle nodes. Reads spider_job_ongoing_worker_idx (running jobs only, by owner) joined to the small node
# table, never the pending or finished rows. Locks owner and job rows, skipping locked ones: a heartbeat or a
# finish being written at this instant wins, and two nodes recovering at once share the work.
RECOVER_EXPIRED_LEASES = text("""
    WITH expired AS (
        SELECT j.id, n.name,
               CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempts >= :max_attempts THEN 'lost' END AS outcome
        FROM spider_job AS j JOIN scrapyd_node AS n ON n.id = j.worker
        WHERE j.status = 'ongoing' AND j.worker <> :worker
          AND (n.heartbeat_time < now() - make_interval(secs => :lease_seconds) OR n.stopped_time IS NOT NULL)
        FOR UPDATE OF j, n SKIP LOCKED
    ), recovered AS (
        UPDATE spider_job AS j
        SET status = CASE WHEN expired.outcome IS NULL THEN 'pending' ELSE 'terminated' END,
            outcome = expired.outcome,
            reason = CASE WHEN expired.outcome IS NOT NULL THEN format(
                'node %s stopped heart-beating during attempt %s of %s', expired.name, j.attempts, :max_attempts
            ) END,
            end_time = CASE WHEN expired.outcome IS NOT NULL THEN :now END,
            pid = CASE WHEN expired.outcome IS NOT NULL THEN j.pid END
        FROM expired
        WHERE j.id = expired.id
        RETURNING j.id, j.project, j.job, j.status
    )
    SELECT id, project, job, status, (SELECT pg_notify(:channel, project) WHERE status = 'pending') AS notified
    FROM recovered
""")

# Hand this process's unfinished claims (pairs of job :ids and :attempts) back to the queue when it stops; or
# terminate them, as 'cancelled' when cancel.json asked for it, or as 'interrupted' once :max_attempts claims are
# used up. Only while each claim is still its own. Pending ones wake idle nodes.
HAND_BACK_CLAIMS = text("""
    WITH claim AS (
        SELECT j.id,
               CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempts >= :max_attempts THEN 'interrupted' END
                   AS outcome
        FROM spider_job AS j
        JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[])) AS mine(id, attempt)
          ON j.id = mine.id AND j.attempts = mine.attempt
        WHERE j.status = 'ongoing' AND j.worker = :worker
    ), handed_back AS (
        UPDATE spider_job AS j
        SET status = CASE WHEN claim.outcome IS NULL THEN 'pending' ELSE 'terminated' END,
            outcome = claim.outcome,
            reason = CASE WHEN claim.outcome IS NOT NULL THEN format(
                'node %s stopped during attempt %s of %s', :node, j.attempts, :max_attempts
            ) END,
            end_time = CASE WHEN claim.outcome IS NOT NULL THEN :now END,
            pid = CASE WHEN claim.outcome IS NOT NULL THEN j.pid END
        FROM claim
        WHERE j.id = claim.id
        RETURNING j.id, j.project, j.job, j.status
    )
    SELECT id, project, job, status, (SELECT pg_notify(:channel, project) WHERE status = 'pending') AS notified
    FROM handed_back
""")

# Hand back this process's claims that it runs no crawl for: the claim committed but its reply was lost with the
# connection (a database restart or a killed session). Only claims made before :claimed_before (this node's own
# clock, like start_time), so that a claim whose reply is still on its way is never taken. Reads
# spider_job_ongoing_worker_idx.
RELEASE_FORGOTTEN_CLAIMS = text("""
    WITH released AS (
        UPDATE spider_job SET status = 'pending'
        WHERE status = 'ongoing' AND worker = :worker AND start_time < :claimed_before AND NOT (id = ANY(:known_ids))
        RETURNING id, project, job
    )
    SELECT id, project, job, pg_notify(:channel, project) AS notified FROM released
""")

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
    if not _is_unicode(encoded):
        raise InvalidJobError("job arguments must be valid Unicode text")
    return encoded


def _is_unicode(value: str) -> bool:
    try:
        value.encode()  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
    except UnicodeEncodeError:
        return False
    return True


def _check_name(what: str, value: Any) -> str:
    """A project, spider, job id or version as the row's columns and indexes can hold it, else InvalidJobError."""
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidJobError(f"{what} may not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{what} may not contain NUL characters")
    if not _is_unicode(value):
        raise InvalidJobError(f"{what} must be valid Unicode text")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise InvalidJobError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return value


def _released(rows) -> list[ReleasedJob]:
    return [ReleasedJob(row.id, row.project, row.job, row.status) for row in rows]


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
        try:
            priority = float(priority)
        except (TypeError, ValueError):
            raise InvalidJobError(f"priority must be a number, not {priority!r}") from None
        if not math.isfinite(priority):
            raise InvalidJobError(f"priority must be a finite number, not {priority!r}")
        job = message.get("_job")
        if job is None:
            job = uuid.uuid1().hex  # the row needs an id; the message stays exactly as given
        version = message.get("_version")
        params = {
            "project": _check_name("project", project),
            "spider": _check_name("spider name", message.get("name")),
            "job": _check_name("job id", str(job)),
            "version": None if version is None else _check_name("version", version),
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
        params = {"limit": limit, "node": node, "worker": worker, "now": _now()}
        if projects is None:
            statement = CLAIM_NEXT_JOBS
        else:
            params["projects"] = list(projects)
            if not params["projects"]:
                return []
            statement = CLAIM_NEXT_JOBS_OF_PROJECTS
            if len(params["projects"]) == 1:
                statement, params["project"] = CLAIM_NEXT_JOBS_OF_PROJECT, params["projects"][0]
        with self.engine.begin() as connection:
            rows = connection.execute(statement, params).all()
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
        claimed by ``worker`` is finished, or a terminated row is recorded for a job that never went through the
        queue.
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
            "worker": worker,
        }
        with self.engine.begin() as connection:
            if claimed is not None:
                params.update(id=claimed.id, attempt=claimed.attempt)
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

    @_database_errors
    def recover_expired_leases(self, *, worker: str, lease_seconds: float, max_attempts: int) -> list[ReleasedJob]:
        """Take the running jobs of the other processes whose lease expired; return what was taken and where to."""
        params = {
            "worker": worker,
            "lease_seconds": float(lease_seconds),
            "max_attempts": max_attempts,
            "now": _now(),
            "channel": NOTIFY_CHANNEL,
        }
        with self.engine.begin() as connection:
            return _released(connection.execute(RECOVER_EXPIRED_LEASES, params))

    @_database_errors
    def hand_back(
        self, claims: Iterable[ClaimedJob], *, worker: str, node: str, max_attempts: int
    ) -> list[ReleasedJob]:
        """Give up claims of a stopping node: back to pending, or 'interrupted' once out of attempts."""
        claims = list(claims)
        if not claims:
            return []
        params = {
            "ids": [claimed.id for claimed in claims],
            "attempts": [claimed.attempt for claimed in claims],
            "worker": worker,
            "node": node,
            "max_attempts": max_attempts,
            "now": _now(),
            "channel": NOTIFY_CHANNEL,
        }
        with self.engine.begin() as connection:
            return _released(connection.execute(HAND_BACK_CLAIMS, params))

    @_database_errors
    def release_forgotten_claims(
        self, *, worker: str, known_ids: Iterable[int], claimed_before: datetime.datetime
    ) -> list[ReleasedJob]:
        """Back to pending: this process's claims made before ``claimed_before`` that are not in ``known_ids``."""
        params = {
            "worker": worker,
            "known_ids": list(known_ids),
            "claimed_before": claimed_before,
            "channel": NOTIFY_CHANNEL,
        }
        with self.engine.begin() as connection:
            rows = connection.execute(RELEASE_FORGOTTEN_CLAIMS, params)
            return [ReleasedJob(row.id, row.project, row.job, PENDING) for row in rows]


@functools.cache
def _store_for_engine(engine: Engine) -> JobStore:
    return JobStore(engine)


# =================================================================================================================
# The whole cluster's view: job answers for the web services, cancel anywhere, eggs and logs in the database, and
# the operator command's queries. Same rules as above: each query one short statement, commented.
# =================================================================================================================

# Channel of the NOTIFY sent with each cancel request on a running job; the payload is JSON (id, project, job,
# worker, requests, signal), and only the node running the job (its worker) acts on it.
CANCEL_CHANNEL = "scrapyd_pgqueue_cancel"
# Channel of the NOTIFY sent when a project's eggs change; the payload is the project.
PROJECTS_CHANNEL = "scrapyd_pgqueue_projects"
# Pending jobs daemonstatus.json counts exactly (a few milliseconds); beyond, it reports the planner's estimate.
PENDING_COUNT_CAP = 10_000
# The signal names a cancel request may carry (those Twisted's signalProcess knows); others are given by number.
SIGNAL_NAMES = ("HUP", "STOP", "INT", "KILL", "TERM")


class JobNotFoundError(LookupError):
    """No job with this id (in this project) is in the state the operation needs."""


@dataclass(frozen=True)
class PendingJob:
    project: str
    job: str
    message: dict[str, Any]


@dataclass(frozen=True)
class RunningJob:
    id: int
    project: str
    spider: str
    job: str
    pid: int | None
    start_time: datetime.datetime | None
    node: str | None
    worker: str | None


@dataclass(frozen=True)
class FinishedJobRow:
    id: int
    project: str
    spider: str
    job: str
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None
    node: str | None
    outcome: str | None
    has_log: bool


@dataclass(frozen=True)
class ClusterCounts:
    pending: int
    pending_exact: bool  # False: more than PENDING_COUNT_CAP, and ``pending`` is the planner's estimate
    running: int
    finished: int
    nodes: int  # live ones: not stopped, heartbeat within the lease


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


@dataclass(frozen=True)
class NodeRow:
    name: str
    url: str | None
    max_proc: int | None
    state: str  # live, silent (no heartbeat within the lease, not stopped) or stopped
    heartbeat_age: float  # seconds since its last heartbeat (database clock)
    running: int
    started_time: datetime.datetime


# The newest row of job id :job (in :project, all projects when NULL): a reused job id reports its latest run.
# Reads spider_job_job_idx.
JOB_STATUS = text("""
    SELECT status FROM spider_job
    WHERE job = :job AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY id DESC
    LIMIT 1
""")

# One page of pending jobs (of :project, all when NULL) in claim order: spider_job_pending_idx (or the per-project
# index) read from :offset, so a page costs its size plus the offset, never the whole backlog.
PENDING_PAGE = text("""
    SELECT project, job, message FROM spider_job
    WHERE status = 'pending' AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY priority DESC, id
    LIMIT :limit OFFSET :offset
""")

# The running jobs (of :project, all when NULL) of every node: bounded by the cluster's process slots.
RUNNING_JOBS = text("""
    SELECT id, project, spider, job, pid, start_time, node, worker FROM spider_job
    WHERE status = 'ongoing' AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY start_time, id
""")

# The newest :limit finished jobs (of :project, all when NULL), with whether the database holds their log.
# Reads spider_job_terminated_idx; terminated rows are pruned to finished_to_keep.
FINISHED_JOBS = text("""
    SELECT j.id, j.project, j.spider, j.job, j.start_time, j.end_time, j.node, j.outcome,
           EXISTS (SELECT 1 FROM job_log AS l WHERE l.job_id = j.id) AS has_log
    FROM spider_job AS j
    WHERE j.status = 'terminated' AND (CAST(:project AS text) IS NULL OR j.project = :project)
    ORDER BY j.end_time DESC, j.id DESC
    LIMIT :limit
""")

# The cluster at a glance. Pending jobs are counted up to :cap only (an exact count of a huge backlog is a scan
# costing tens of milliseconds, trap 14), with the planner's estimate of the pending index's size for beyond;
# running and finished jobs are few (process slots; pruned to finished_to_keep); live nodes are those not stopped
# whose heartbeat is within :lease_seconds (database clock).
CLUSTER_COUNTS = text("""
    SELECT (SELECT count(*) FROM (SELECT 1 FROM spider_job WHERE status = 'pending' LIMIT :cap) AS capped)
               AS pending_counted,
           (SELECT reltuples FROM pg_class WHERE oid = CAST('spider_job_pending_idx' AS regclass)) AS pending_estimate,
           (SELECT count(*) FROM spider_job WHERE status = 'ongoing') AS running,
           (SELECT count(*) FROM spider_job WHERE status = 'terminated') AS finished,
           (SELECT count(*) FROM scrapyd_node
            WHERE stopped_time IS NULL AND heartbeat_time > now() - make_interval(secs => :lease_seconds)) AS nodes
""")

# Cancel a pending job: terminated as 'cancelled' (start and end at the cancel), so it never starts and every node
# reports it finished. A claim that locked the row first wins; the running job is then cancelled instead.
CANCEL_PENDING = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = 'cancelled', reason = 'cancelled before it started',
        cancel_requested = true, start_time = :now, end_time = :now
    WHERE project = :project AND job = :job AND status = 'pending'
    RETURNING id
""")

# Ask the node running job :job to signal its crawl: one more request, with its signal, and a NOTIFY that the
# node hears at once (its heartbeat reads the same columns as the floor). Reads spider_job_live_job_key.
REQUEST_CANCEL = text("""
    WITH requested AS (
        UPDATE spider_job
        SET cancel_requested = true, cancel_requests = cancel_requests + 1, cancel_signal = :signal
        WHERE project = :project AND job = :job AND status = 'ongoing'
        RETURNING id, project, job, worker, cancel_requests, cancel_signal
    )
    SELECT id, pg_notify(:channel, json_build_object(
        'id', id, 'project', project, 'job', job, 'worker', worker, 'requests', cancel_requests,
        'signal', cancel_signal)::text)
    FROM requested
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

# --- operator command ---

# Pending jobs per project and spider, with the oldest one's creation time (a full pass over pending rows).
PENDING_BY_SPIDER = text("""
    SELECT project, spider, count(*) AS pending, min(created_time) AS oldest FROM spider_job
    WHERE status = 'pending'
    GROUP BY project, spider
    ORDER BY project, spider
""")

# Node processes not stopped, and those stopped within :recent_seconds, each with its running jobs and its state.
NODES = text("""
    SELECT n.name, n.url, n.max_proc, n.started_time,
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

# The newest :limit jobs that did not end well: failed, lost (recovery gave up) or interrupted.
TROUBLED_JOBS = text("""
    SELECT id, project, spider, job, status, outcome, exit_code, reason, node, pid, attempts, priority, version,
           start_time, end_time
    FROM spider_job
    WHERE status = 'terminated' AND outcome IN ('failed', 'lost', 'interrupted')
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
            pid = NULL, start_time = NULL, end_time = NULL, created_time = :now,
            cancel_requested = false, cancel_requests = 0, cancel_signal = NULL
        FROM target
        WHERE j.id = target.id
        RETURNING j.id, j.project
    )
    SELECT id, pg_notify(:channel, project) FROM requeued
""")

# Forget the stored log of a requeued job's previous run.
DELETE_LOG = text("DELETE FROM job_log WHERE job_id = :id")

# Delete finished jobs that ended before :before (their logs go with them).
PRUNE_FINISHED_BEFORE = text("DELETE FROM spider_job WHERE status = 'terminated' AND end_time < :before")

# --- eggs ---

# Replace the egg of :project/:version (a second upload of a version wins, like a file overwritten).
DELETE_EGG_VERSION = text("DELETE FROM project_egg WHERE project = :project AND version = :version")

# Store an egg; its new id changes the eggs' fingerprint, so nodes that missed the NOTIFY still notice.
INSERT_EGG = text("INSERT INTO project_egg (project, version, egg) VALUES (:project, :version, :egg)")

# Tell every node that the eggs of :project changed (delivered on commit).
NOTIFY_EGGS_CHANGED = text("SELECT pg_notify(:channel, :project)")

# The versions of :project (unordered; the caller sorts them like Scrapyd). Reads the unique (project, version) index.
EGG_VERSIONS = text("SELECT version FROM project_egg WHERE project = :project")

# The egg of :project/:version.
GET_EGG = text("SELECT egg FROM project_egg WHERE project = :project AND version = :version")

# Every project with an egg.
EGG_PROJECTS = text("SELECT DISTINCT project FROM project_egg ORDER BY project")

# Delete the egg of :project/:version, or all of the project's eggs when :version is NULL.
DELETE_EGGS = text("""
    DELETE FROM project_egg WHERE project = :project AND (CAST(:version AS text) IS NULL OR version = :version)
""")

# Per project, its number of eggs and newest egg id: changes whenever one of its eggs is added, replaced or deleted
# (ids are never reused). The heartbeat's floor under NOTIFY; reads no egg.
EGG_CATALOGUE = text("SELECT project, count(*) AS eggs, max(id) AS newest FROM project_egg GROUP BY project")


class ClusterStore:
    """Job views and operations for the whole cluster: web services, cancel, logs and the operator command."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def for_url(cls, url: str) -> ClusterStore:
        return _cluster_store_for_engine(db.get_engine(url))

    @_database_errors
    def job_status(self, job: str, project: str | None = None) -> str | None:
        """The job's state as Scrapyd names it: 'pending', 'running', 'finished', or None when unknown."""
        with self.engine.connect() as connection:
            status = connection.execute(JOB_STATUS, {"job": job, "project": project}).scalar()
        return {"pending": "pending", "ongoing": "running", "terminated": "finished"}.get(status)

    @_database_errors
    def pending_page(self, project: str | None, limit: int, offset: int = 0) -> tuple[list[PendingJob], bool]:
        """Up to ``limit`` pending jobs from ``offset`` in claim order, and whether more follow."""
        params = {"project": project, "limit": limit + 1, "offset": offset}
        with self.engine.connect() as connection:
            rows = [PendingJob(**row._mapping) for row in connection.execute(PENDING_PAGE, params)]
        return rows[:limit], len(rows) > limit

    @_database_errors
    def running_jobs(self, project: str | None = None) -> list[RunningJob]:
        with self.engine.connect() as connection:
            return [RunningJob(**row._mapping) for row in connection.execute(RUNNING_JOBS, {"project": project})]

    @_database_errors
    def finished_jobs(self, project: str | None, limit: int) -> list[FinishedJobRow]:
        with self.engine.connect() as connection:
            rows = connection.execute(FINISHED_JOBS, {"project": project, "limit": limit})
            return [FinishedJobRow(**row._mapping) for row in rows]

    @_database_errors
    def cluster_counts(self, lease_seconds: float) -> ClusterCounts:
        params = {"lease_seconds": float(lease_seconds), "cap": PENDING_COUNT_CAP}
        with self.engine.connect() as connection:
            row = connection.execute(CLUSTER_COUNTS, params).one()
        exact = row.pending_counted < PENDING_COUNT_CAP
        pending = row.pending_counted if exact else max(PENDING_COUNT_CAP, int(row.pending_estimate or 0))
        return ClusterCounts(pending, exact, row.running, row.finished, row.nodes)

    @_database_errors
    def cancel_job(self, project: str, job: str, signal: str = "INT") -> str | None:
        """Cancel a pending job, or ask the node running it to signal it; return Scrapyd's ``prevstate``."""
        with self.engine.begin() as connection:
            params = {"project": project, "job": job, "now": _now()}
            if connection.execute(CANCEL_PENDING, params).first() is not None:
                return "pending"
            params.update(signal=signal, channel=CANCEL_CHANNEL)
            if connection.execute(REQUEST_CANCEL, params).first() is not None:
                return "running"
        return None

    @_database_errors
    def requested_cancels(self, worker: str) -> list[CancelRequest]:
        with self.engine.connect() as connection:
            return [CancelRequest(**row._mapping) for row in connection.execute(REQUESTED_CANCELS, {"worker": worker})]

    @_database_errors
    def save_log(
        self, *, project: str, job: str, log: bytes, size: int, claimed: ClaimedJob | None = None,
        worker: str | None = None,
    ) -> None:
        """Store a finished job's log (already capped by the caller) for every node to serve."""
        with self.engine.begin() as connection:
            if claimed is not None:
                params = {"id": claimed.id, "attempt": claimed.attempt, "worker": worker, "log": log, "size": size}
                connection.execute(SAVE_CLAIMED_LOG, params)
            else:
                params = {"project": project, "job": job, "log": log, "size": size}
                connection.execute(SAVE_LOG_BY_JOB_ID, params)

    @_database_errors
    def find_log(self, project: str, spider: str, job: str) -> StoredLog | None:
        with self.engine.connect() as connection:
            params = {"project": project, "spider": spider, "job": job}
            row = connection.execute(FIND_LOG, params).first()
        if row is None:
            return None
        return StoredLog(row.status, None if row.log is None else bytes(row.log), row.worker, row.node_url)

    # --- operator command ---

    @_database_errors
    def pending_by_spider(self) -> list[dict[str, Any]]:
        with self.engine.connect() as connection:
            return [dict(row._mapping) for row in connection.execute(PENDING_BY_SPIDER)]

    @_database_errors
    def nodes(self, *, lease_seconds: float, recent_seconds: float = 3600.0) -> list[NodeRow]:
        params = {"lease_seconds": float(lease_seconds), "recent_seconds": float(recent_seconds)}
        with self.engine.connect() as connection:
            return [NodeRow(**row._mapping) for row in connection.execute(NODES, params)]

    @_database_errors
    def outcome_counts(self) -> dict[str, int]:
        with self.engine.connect() as connection:
            return {row.outcome: row.jobs for row in connection.execute(OUTCOME_COUNTS)}

    @_database_errors
    def troubled_jobs(self, limit: int = 20) -> list[JobRow]:
        with self.engine.connect() as connection:
            return [JobRow(**row._mapping) for row in connection.execute(TROUBLED_JOBS, {"limit": limit})]

    @_database_errors
    def recovered_jobs(self, limit: int = 20) -> list[JobRow]:
        with self.engine.connect() as connection:
            return [JobRow(**row._mapping) for row in connection.execute(RECOVERED_JOBS, {"limit": limit})]

    @_database_errors
    def projects_of_job(self, job: str) -> list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(PROJECTS_OF_JOB, {"job": job}).scalars())

    @_database_errors
    def requeue(self, project: str, job: str) -> int:
        """Put the newest finished run of ``job`` back to pending; return its row id."""
        params = {"project": project, "job": job, "now": _now(), "channel": NOTIFY_CHANNEL}
        try:
            with self.engine.begin() as connection:
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

    @_database_errors
    def prune_finished_before(self, before: datetime.datetime) -> int:
        with self.engine.begin() as connection:
            return connection.execute(PRUNE_FINISHED_BEFORE, {"before": before}).rowcount


class EggStore:
    """Project eggs in the database: deployed once through any node, runnable on every node."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def for_url(cls, url: str, migrate_schema: bool = True) -> EggStore:
        return _egg_store_for_engine(db.get_engine(url, migrate_schema=migrate_schema))

    @_database_errors
    def put_egg(self, project: str, version: str, egg: bytes) -> None:
        with self.engine.begin() as connection:
            connection.execute(DELETE_EGG_VERSION, {"project": project, "version": version})
            connection.execute(INSERT_EGG, {"project": project, "version": version, "egg": egg})
            connection.execute(NOTIFY_EGGS_CHANGED, {"channel": PROJECTS_CHANNEL, "project": project})

    @_database_errors
    def egg_versions(self, project: str) -> list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(EGG_VERSIONS, {"project": project}).scalars())

    @_database_errors
    def get_egg(self, project: str, version: str) -> bytes | None:
        with self.engine.connect() as connection:
            egg = connection.execute(GET_EGG, {"project": project, "version": version}).scalar()
        return None if egg is None else bytes(egg)

    @_database_errors
    def egg_projects(self) -> list[str]:
        with self.engine.connect() as connection:
            return list(connection.execute(EGG_PROJECTS).scalars())

    @_database_errors
    def delete_eggs(self, project: str, version: str | None = None) -> int:
        """Delete one version (or every version) of ``project``; return how many eggs were deleted."""
        with self.engine.begin() as connection:
            deleted = connection.execute(DELETE_EGGS, {"project": project, "version": version}).rowcount
            if deleted:
                connection.execute(NOTIFY_EGGS_CHANGED, {"channel": PROJECTS_CHANNEL, "project": project})
            return deleted

    @_database_errors
    def egg_catalogue(self) -> dict[str, tuple[int, int]]:
        """Project -> (number of eggs, newest egg id): compare two catalogues to see which projects changed."""
        with self.engine.connect() as connection:
            return {row.project: (row.eggs, row.newest) for row in connection.execute(EGG_CATALOGUE)}


@functools.cache
def _cluster_store_for_engine(engine: Engine) -> ClusterStore:
    return ClusterStore(engine)


@functools.cache
def _egg_store_for_engine(engine: Engine) -> EggStore:
    return EggStore(engine)
