"""The queue itself: enqueue, claim, pending jobs, start, finish, prune, terminated jobs, notify; ``JobStore``."""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from scrapyd_pgqueue import db
from scrapyd_pgqueue.models import FINISHED
from scrapyd_pgqueue.store.base import (
    NOTIFY_CHANNEL,
    ClaimedJob,
    DuplicateJobError,
    InvalidJobError,
    JobRow,
    check_name,
    database_errors,
    encode_message,
    now,
)
from scrapyd_pgqueue.store.nodes import NodeLeases

# --- queries ---------------------------------------------------------------------------------------------------

# Add a pending job and wake idle nodes; NOTIFY is delivered on commit, so a woken node finds the row.
# Only while the caller still waits for the answer (:answer_by, database clock): a statement that reaches a
# stalled server and runs after the caller gave up and answered "error" must not leave a ghost job behind.
ENQUEUE = text("""
    WITH inserted AS (
        INSERT INTO spider_job (project, spider, job, version, priority, message, status, created_time)
        SELECT :project, :spider, :job, :version, :priority, CAST(:message AS jsonb), 'pending', :now
        WHERE clock_timestamp() < to_timestamp(:answer_by)
        RETURNING id
    )
    SELECT id, pg_notify(:channel, :project) FROM inserted
""")

# Add many pending jobs in one statement, all or none. Rows are inserted in the arrays' order (ORDER BY n), so their
# ids, and so the claim order among equal priorities, follow it; one NOTIFY for the batch. Same :answer_by as ENQUEUE.
ENQUEUE_MANY = text("""
    WITH inserted AS (
        INSERT INTO spider_job (project, spider, job, version, priority, message, status, created_time)
        SELECT :project, batch.spider, batch.job, batch.version, batch.priority, batch.message, 'pending', :now
        FROM unnest(CAST(:spiders AS text[]), CAST(:jobs AS text[]), CAST(:versions AS text[]),
                    CAST(:prioritys AS double precision[]), CAST(:messages AS jsonb[]))
             WITH ORDINALITY AS batch(spider, job, version, priority, message, n)
        WHERE clock_timestamp() < to_timestamp(:answer_by)
        ORDER BY batch.n
        RETURNING job, id
    ), woken AS (
        SELECT pg_notify(:channel, :project) WHERE EXISTS (SELECT 1 FROM inserted)
    )
    SELECT job, id FROM inserted, (SELECT count(*) FROM woken) AS notified
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

# Wake the listeners of :channel (the node's listener proves with it that LISTEN works through its URL).
NOTIFY = text("SELECT pg_notify(:channel, :payload)")

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

# --- operations ------------------------------------------------------------------------------------------------


class JobStore(NodeLeases):
    """The queue operations over one database."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def for_url(cls, url: str) -> JobStore:
        return _store_for_engine(db.get_engine(url))

    @classmethod
    def for_settings(cls, settings) -> JobStore:
        """The store of a node, over an engine with the node's pool size and timeout."""
        return _store_for_engine(db.engine_for_settings(settings))

    @database_errors
    def notify(self, channel: str, payload: str) -> None:
        with db.autocommit(self.engine) as connection:
            connection.execute(NOTIFY, {"channel": channel, "payload": payload})

    @database_errors
    def enqueue(self, project: str, message: dict[str, Any], priority: float = 0.0) -> int:
        """Add ``message`` (ISpiderQueue's message: spider args plus ``name``) as a pending job; return its row id."""
        params = {**_job_row(project, message, priority), "now": now(), "channel": NOTIFY_CHANNEL}
        with _duplicates_refused(project, [params["job"]]), db.autocommit(self.engine) as connection:
            params["answer_by"] = db.answer_by()
            job_id = connection.execute(ENQUEUE, params).scalar()
        if job_id is None:
            raise db.too_late(self.engine, "the job was not stored")
        return job_id

    @database_errors
    def enqueue_many(self, project: str, jobs: Iterable[tuple[dict[str, Any], float]]) -> list[int]:
        """Add many (message, priority) jobs at once, all or none, in their order; return their row ids."""
        rows = []
        for index, (message, priority) in enumerate(jobs):
            try:
                rows.append(_job_row(project, message, priority))
            except InvalidJobError as e:
                raise InvalidJobError(f"job {index}: {e}") from None
        if not rows:
            return []
        seen: dict[str, int] = {}
        for index, row in enumerate(rows):
            if seen.setdefault(row["job"], index) != index:
                raise DuplicateJobError(f"job {index}: job id '{row['job']}' is also job {seen[row['job']]}")
        params = {"project": rows[0]["project"], "now": now(), "channel": NOTIFY_CHANNEL}
        for column in ("spider", "job", "version", "priority", "message"):
            params[f"{column}s"] = [row[column] for row in rows]
        jobs_by_index = params["jobs"]
        with _duplicates_refused(project, jobs_by_index), db.autocommit(self.engine) as connection:
            params["answer_by"] = db.answer_by()
            ids = dict(connection.execute(ENQUEUE_MANY, params).all())
        if not ids:
            raise db.too_late(self.engine, "no job was stored")
        return [ids[job] for job in jobs_by_index]

    @database_errors
    def claim_next_jobs(
        self, projects: Iterable[str] | None, limit: int, *, node: str, worker: str
    ) -> list[ClaimedJob]:
        """Move up to ``limit`` of the best pending jobs to ``ongoing`` for this node, in claim order."""
        if limit <= 0:
            return []
        params = {"limit": limit, "node": node, "worker": worker, "now": now()}
        if projects is None:
            statement = CLAIM_NEXT_JOBS
        else:
            params["projects"] = list(projects)
            if not params["projects"]:
                return []
            statement = CLAIM_NEXT_JOBS_OF_PROJECTS
            if len(params["projects"]) == 1:
                statement, params["project"] = CLAIM_NEXT_JOBS_OF_PROJECT, params["projects"][0]
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(statement, params).all()
        rows.sort(key=lambda row: (-row.priority, row.id))  # RETURNING has no order
        return [ClaimedJob(row.id, row.project, row.job, row.attempts, row.message) for row in rows]

    @database_errors
    def has_pending(self, projects: Iterable[str] | None = None) -> bool:
        with db.autocommit(self.engine) as connection:
            params = {"projects": None if projects is None else list(projects)}
            return connection.execute(HAS_PENDING, params).scalar_one()

    @database_errors
    def count_pending(self, project: str) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(COUNT_PENDING, {"project": project}).scalar_one()

    @database_errors
    def list_pending(self, project: str, limit: int | None = None) -> list[dict[str, Any]]:
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(LIST_PENDING, {"project": project, "limit": limit})
            return [row.message for row in rows]

    @database_errors
    def remove_pending(self, project: str, predicate: Callable[[dict[str, Any]], bool]) -> int:
        """Delete the pending jobs whose message satisfies ``predicate``; return how many were deleted."""
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(LIST_PENDING, {"project": project, "limit": None}).all()
            ids = [row.id for row in rows if predicate(row.message)]
            if not ids:
                return 0
            return connection.execute(DELETE_PENDING, {"ids": ids, "project": project}).rowcount

    @database_errors
    def clear_pending(self, project: str) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(CLEAR_PENDING, {"project": project}).rowcount

    @database_errors
    def mark_started(self, claimed: ClaimedJob, *, worker: str, pid: int | None, start_time: datetime.datetime) -> bool:
        params = {"id": claimed.id, "attempt": claimed.attempt, "worker": worker, "pid": pid, "start_time": start_time}
        with db.autocommit(self.engine) as connection:
            return connection.execute(MARK_STARTED, params).rowcount == 1

    @database_errors
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
        if claimed is not None:
            params.update(id=claimed.id, attempt=claimed.attempt)
            with db.autocommit(self.engine) as connection:
                return connection.execute(FINISH_CLAIMED, params).first() is not None
        with db.transaction(self.engine) as connection:
            if connection.execute(FINISH_BY_JOB_ID, params).first() is None:
                connection.execute(INSERT_TERMINATED, params)
            return True

    @database_errors
    def prune_terminated(self, keep: int) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(PRUNE_TERMINATED, {"keep": max(keep, 0)}).rowcount

    @database_errors
    def list_terminated(self, limit: int) -> list[JobRow]:
        with db.autocommit(self.engine) as connection:
            return [JobRow(**row._mapping) for row in connection.execute(LIST_TERMINATED, {"limit": limit})]

    @database_errors
    def count_terminated(self) -> int:
        with db.autocommit(self.engine) as connection:
            return connection.execute(COUNT_TERMINATED).scalar_one()


def _job_row(project: str, message: dict[str, Any], priority: float) -> dict[str, Any]:
    """The columns of a new pending job, checked as the table can hold them (InvalidJobError)."""
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
    return {
        "project": check_name("project", project),
        "spider": check_name("spider name", message.get("name")),
        "job": check_name("job id", str(job)),
        "version": None if version is None else check_name("version", version),
        "priority": priority,
        "message": encode_message(message),
    }


@contextlib.contextmanager
def _duplicates_refused(project: str, jobs: list[str]):
    """The live-job unique index's refusal as DuplicateJobError, naming the job (and its place in a batch)."""
    try:
        yield
    except IntegrityError as e:
        if not (getattr(e.orig, "diag", None) and e.orig.diag.constraint_name == "spider_job_live_job_key"):
            raise
        detail = e.orig.diag.message_detail or ""  # Key (project, job)=(p, j) already exists.
        index = next((i for i, job in enumerate(jobs) if detail.endswith(f", {job}) already exists.")), 0)
        where = f"job {index}: " if len(jobs) > 1 else ""
        raise DuplicateJobError(
            f"{where}job id '{jobs[index]}' is already pending or running in project '{project}'"
        ) from None


@functools.cache
def _store_for_engine(engine: Engine) -> JobStore:
    return JobStore(engine)


def notify_through_pool(settings):
    """``notify(channel, payload)`` through the node's pool."""
    return JobStore.for_settings(settings).notify
