"""The queue itself: enqueue (delayed and unique jobs too), claim (due jobs, per-spider limits), waiting jobs,
notify; ``JobStore``, which also holds how jobs end (``finishing.JobEnds``) and the nodes' leases
(``nodes.NodeLeases``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError

from scrapyd_pgqueue import db
from scrapyd_pgqueue.store.base import (
    ERROR,
    NO_OPTIONS,
    NOTIFY_CHANNEL,
    REPLACE,
    ClaimedJob,
    DuplicateJobError,
    Enqueued,
    InvalidJobError,
    JobOptions,
    check_name,
    database_errors,
    encode_message,
    now,
)
from scrapyd_pgqueue.store import trees
from scrapyd_pgqueue.store.finishing import JobEnds
from scrapyd_pgqueue.store.nodes import NodeLeases

# --- queries ---------------------------------------------------------------------------------------------------

# Add jobs, all or none, in one statement; one NOTIFY wakes idle nodes (delivered on commit, so a woken node finds
# the rows; a node woken by delayed jobs learns when the first is due). Rows are inserted in the arrays' order (ORDER
# BY n), so their ids, and so the claim order among equal priorities, follow it. A job due later (run_at, or delay on
# the database's clock) waits as 'delayed'; run_at is every job's due time (past-due counts read it). A unique key already held by a waiting job of the project updates that
# job instead (spider_job_waiting_unique_key decides, also between concurrent schedules): with the new run time,
# priority, arguments and settings for the keys in :replace_keys, unchanged otherwise, its job id kept; RETURNING
# says which rows existed (xmax is set on a row ON CONFLICT updated). Only while the caller still waits for the
# answer (:answer_by, database clock): a statement that reaches a stalled server and runs after the caller gave up and
# answered "error" must not leave a ghost job behind.
ENQUEUE_JOBS = text("""
    WITH batch AS (
        SELECT b.*, coalesce(to_timestamp(b.run_at_epoch), now() + make_interval(secs => b.delay)) AS due
        FROM unnest(CAST(:spiders AS text[]), CAST(:jobs AS text[]), CAST(:versions AS text[]),
                    CAST(:prioritys AS double precision[]), CAST(:messages AS jsonb[]),
                    CAST(:run_ats AS double precision[]), CAST(:delays AS double precision[]),
                    CAST(:unique_keys AS text[]), CAST(:retriess AS integer[]),
                    CAST(:retry_delays AS double precision[]), CAST(:periodics AS text[]),
                    CAST(:parents AS text[]), CAST(:parent_ids AS bigint[]), CAST(:tree_ids AS bigint[]))
             WITH ORDINALITY AS b(spider, job, version, priority, message, run_at_epoch, delay, unique_key, retries,
                                  retry_delay, periodic, parent, parent_id, tree_id, n)
    ), inserted AS (
        INSERT INTO spider_job AS j (project, spider, job, version, priority, message, status, run_at, unique_key,
                                     retries, retry_delay, periodic, parent, parent_id, tree_id, created_time)
        SELECT :project, spider, job, version, priority, message,
               CASE WHEN due > now() THEN 'delayed' ELSE 'pending' END, coalesce(due, now()),
               unique_key, retries, retry_delay, periodic, parent, parent_id, tree_id, :now
        FROM batch
        WHERE clock_timestamp() < to_timestamp(:answer_by)
        ORDER BY n
        ON CONFLICT (project, unique_key) WHERE status IN ('delayed', 'pending') AND unique_key IS NOT NULL
        DO UPDATE SET (spider, version, priority, message, status, run_at, retries, retry_delay) = (
            SELECT EXCLUDED.spider, EXCLUDED.version, EXCLUDED.priority,
                   EXCLUDED.message || jsonb_build_object('_job', j.job), EXCLUDED.status, EXCLUDED.run_at,
                   EXCLUDED.retries, EXCLUDED.retry_delay
            WHERE EXCLUDED.unique_key = ANY(CAST(:replace_keys AS text[]))
            UNION ALL
            SELECT j.spider, j.version, j.priority, j.message, j.status, j.run_at, j.retries, j.retry_delay
            WHERE NOT EXCLUDED.unique_key = ANY(CAST(:replace_keys AS text[]))
        )
        RETURNING j.id, j.job, j.unique_key, j.xmax <> 0 AS existing
    ), woken AS (
        SELECT pg_notify(:channel, :project) WHERE EXISTS (SELECT 1 FROM inserted)
    )
    SELECT id, job, unique_key, existing FROM inserted, (SELECT count(*) FROM woken) AS notified
""")


def _claim_statement(which_projects: str):
    """The claim, for one way of choosing projects (a fixed SQL fragment, never a value)."""
    return text(f"""
        WITH due AS (
            SELECT id FROM spider_job
            WHERE status = 'delayed' AND run_at <= now() AND {which_projects}
            ORDER BY run_at
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ), promoted AS (
            UPDATE spider_job AS j SET status = 'pending'
            FROM due WHERE j.id = due.id
            RETURNING j.project
        ), woken AS (
            SELECT pg_notify(:channel, project) FROM (SELECT DISTINCT project FROM promoted) AS p
        ), limits AS MATERIALIZED (
            SELECT project, spider, max_running FROM spider_limit
            WHERE {which_projects}
            FOR UPDATE SKIP LOCKED
        ), room AS (
            SELECT project, spider, max_running - spider_job_running(project, spider) AS free FROM limits
        ), unlimited_jobs AS (
            SELECT id, priority FROM spider_job AS j
            WHERE status = 'pending' AND {which_projects}
              AND NOT EXISTS (SELECT 1 FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
            ORDER BY priority DESC, id
            LIMIT :limit
            FOR UPDATE SKIP LOCKED
        ), limited_jobs AS (
            SELECT next.id, next.priority FROM room, LATERAL (
                SELECT id, priority FROM spider_job
                WHERE status = 'pending' AND project = room.project AND spider = room.spider
                ORDER BY priority DESC, id
                LIMIT greatest(least(room.free, :limit), 0)
                FOR UPDATE SKIP LOCKED
            ) AS next
        ), next_jobs AS (
            SELECT id FROM (SELECT * FROM unlimited_jobs UNION ALL SELECT * FROM limited_jobs) AS candidates
            ORDER BY priority DESC, id
            LIMIT :limit
        ), claimed AS (
            UPDATE spider_job AS j
            SET status = 'ongoing', node = :node, worker = :worker, start_time = :now, attempts = j.attempts + 1
            FROM next_jobs
            WHERE j.id = next_jobs.id
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision) AS waited
        )
        SELECT id, project, job, attempts, message, priority, waited, NULL AS promoted, NULL AS next_due_in
        FROM claimed
        UNION ALL
        SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               (SELECT count(*) FROM promoted) + 0 * (SELECT count(*) FROM woken),
               (SELECT extract(epoch FROM min(run_at) - now()) FROM spider_job
                WHERE status = 'delayed' AND {which_projects})
    """)


# Claim the next :limit pending jobs for this node: of any project, of the :projects it can run, or of one
# :project (ISpiderQueue.pop). One statement, shaped for concurrency and for a cost that does not grow with the
# backlog:
# - due: delayed jobs whose time has come become pending (and wake the nodes, which claim them at once), read from
#   the head of spider_job_delayed_idx: a million jobs still waiting cost nothing. Not claimed in this statement,
#   whose snapshot cannot see them pending.
# - unlimited_jobs locks rows with FOR UPDATE SKIP LOCKED, so concurrent claimers pass over each other's rows instead
#   of queueing behind them, and LIMIT = the caller's free slots (a node never takes more than it can start). It
#   reads spider_job_pending_idx from its head in (priority DESC, id) order; one project reads
#   spider_job_pending_project_idx from the head of that project (a list of projects cannot: an ordered index scan
#   takes one value of its leading column). Jobs of spiders with a limit are passed over here.
# - limited_jobs: a spider with a cluster-wide limit (spider_limit) is filled by one claimer at a time, the one that
#   locked its limit row (SKIP LOCKED: the others claim other spiders' jobs meanwhile, no head-of-line blocking).
#   spider_job_running() counts its running jobs after that lock, in a fresh snapshot (a VOLATILE function), so
#   claims committed by other nodes while this statement ran are counted: never more than max_running at once.
#   Each limited spider reads the head of spider_job_pending_spider_idx, at most its free room.
# - The rows are held only for this statement. The last row (id NULL) says how many delayed jobs became due and in
#   how many seconds the next one is (the poller sets its timer by it).
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

# Count the waiting (pending or delayed) jobs of a project (ISpiderQueue.count; not for hot paths on large backlogs).
COUNT_PENDING = text("SELECT count(*) FROM spider_job WHERE status IN ('delayed', 'pending') AND project = :project")

# The waiting messages of a project in run order, at most :limit (all when NULL): pending in claim order, then
# delayed by due time.
LIST_PENDING = text("""
    SELECT id, message FROM spider_job
    WHERE status IN ('delayed', 'pending') AND project = :project
    ORDER BY status = 'delayed', CASE WHEN status = 'delayed' THEN run_at END, priority DESC, id
    LIMIT :limit
""")

# Delete waiting jobs by id; a job claimed meanwhile is left alone.
DELETE_PENDING = text("""
    DELETE FROM spider_job WHERE id = ANY(:ids) AND status IN ('delayed', 'pending') AND project = :project
""")

# Delete every waiting job of a project.
CLEAR_PENDING = text("DELETE FROM spider_job WHERE status IN ('delayed', 'pending') AND project = :project")

# --- operations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A claim's jobs, how many delayed jobs it found due (pending now: claim again), and in how many seconds the
    next delayed job is due (None: none waits)."""

    jobs: list[ClaimedJob]
    became_due: int
    next_due_in: float | None


class JobStore(NodeLeases, JobEnds):
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
    def enqueue(
        self, project: str, message: dict[str, Any], priority: float = 0.0, options: JobOptions = NO_OPTIONS
    ) -> Enqueued:
        """Add ``message`` (ISpiderQueue's message: spider arguments plus ``name``) as a job; say where it went."""
        return self._enqueue(project, job_rows(project, [(message, priority, options)], numbered=False))[0]

    @database_errors
    def enqueue_many(
        self, project: str, jobs: Iterable[tuple[dict[str, Any], float] | tuple[dict[str, Any], float, JobOptions]]
    ) -> list[Enqueued]:
        """Add many (message, priority[, options]) jobs at once, all or none, in their order; say where each went.

        A unique key with ``on_conflict="error"`` held by a waiting job refuses the whole batch (DuplicateJobError).
        """
        return self._enqueue(project, job_rows(project, jobs, numbered=True))

    def _enqueue(self, project: str, rows: list[dict[str, Any]]) -> list[Enqueued]:
        if not rows:
            return []
        refuse_existing = any(row["on_conflict"] == ERROR for row in rows if row["unique_key"])
        in_trees = trees.needs_trees(rows)
        connect = db.transaction if refuse_existing or in_trees else db.autocommit
        with connect(self.engine) as connection:
            known = trees.place_in_trees(connection, project, rows) if in_trees else {}
            new = [row for index, row in enumerate(rows) if index not in known]
            inserted = insert_jobs(connection, project, new) if new else []
            if new and not inserted:
                raise db.too_late(self.engine, "no job was stored")
            if refuse_existing:
                _refuse_existing_keys(new, inserted)  # rolls the batch back
            if in_trees:
                trees.start_trees(connection, new, inserted)
        placed = iter(inserted)
        return [known[index] if index in known else next(placed) for index in range(len(rows))]

    @database_errors
    def claim_next_jobs(
        self, projects: Iterable[str] | None, limit: int, *, node: str, worker: str
    ) -> list[ClaimedJob]:
        """Move up to ``limit`` of the best pending jobs to ``ongoing`` for this node, in claim order."""
        return self.claim(projects, limit, node=node, worker=worker).jobs

    @database_errors
    def claim(self, projects: Iterable[str] | None, limit: int, *, node: str, worker: str) -> Claim:
        """``claim_next_jobs``, and what the poller needs for its next claim: delayed jobs that became due, and
        when the next one will."""
        params = {"limit": max(limit, 0), "node": node, "worker": worker, "now": now(), "channel": NOTIFY_CHANNEL}
        if projects is None:
            statement = CLAIM_NEXT_JOBS
        else:
            params["projects"] = list(projects)
            if not params["projects"]:
                return Claim([], 0, None)
            statement = CLAIM_NEXT_JOBS_OF_PROJECTS
            if len(params["projects"]) == 1:
                statement, params["project"] = CLAIM_NEXT_JOBS_OF_PROJECT, params["projects"][0]
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(statement, params).all()
        summary = next(row for row in rows if row.id is None)
        jobs = sorted((row for row in rows if row.id is not None), key=lambda row: (-row.priority, row.id))
        return Claim(
            [ClaimedJob(row.id, row.project, row.job, row.attempts, row.message, row.waited) for row in jobs],
            summary.promoted or 0,
            None if summary.next_due_in is None else float(summary.next_due_in),
        )

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



def insert_jobs(connection, project: str, rows: list[dict[str, Any]]) -> list[Enqueued]:
    """Run ENQUEUE_JOBS for ``rows`` (from ``job_rows``) on ``connection``, in a transaction of the caller's (a
    periodic firing) or alone; say where each job went, in their order. Empty when the caller's time ran out."""
    params = {"project": rows[0]["project"], "now": now(), "channel": NOTIFY_CHANNEL, "answer_by": db.answer_by()}
    for column in _ENQUEUE_COLUMNS:
        params[f"{column}s"] = [row[column] for row in rows]
    params["replace_keys"] = [row["unique_key"] for row in rows if row["on_conflict"] == REPLACE]
    with _duplicates_refused(project, params["jobs"]):
        return _in_request_order(rows, connection.execute(ENQUEUE_JOBS, params).all())


# The arrays ENQUEUE_JOBS takes, one element per job.
_ENQUEUE_COLUMNS = (
    "spider", "job", "version", "priority", "message", "run_at", "delay", "unique_key", "retries", "retry_delay",
    "periodic", "parent", "parent_id", "tree_id",
)


def job_rows(project: str, jobs, numbered: bool) -> list[dict[str, Any]]:
    """The checked columns of each (message, priority[, options]); InvalidJobError or DuplicateJobError naming the
    job's index in a batch."""
    rows = []
    for index, (message, priority, *options) in enumerate(jobs):
        try:
            rows.append(_job_row(project, message, priority, options[0] if options else NO_OPTIONS))
        except InvalidJobError as e:
            raise InvalidJobError(f"job {index}: {e}" if numbered else str(e)) from None
    for column, what in (("job", "job id"), ("unique_key", "unique_key")):  # tree keys: the first one wins
        seen: dict[str, int] = {}
        for index, row in enumerate(rows):
            if row[column] is not None and seen.setdefault(row[column], index) != index:
                raise DuplicateJobError(f"job {index}: {what} '{row[column]}' is also job {seen[row[column]]}")
    return rows


def _job_row(project: str, message: dict[str, Any], priority: float, options: JobOptions) -> dict[str, Any]:
    """The columns of a new job, checked as the table can hold them (InvalidJobError)."""
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
        "run_at": options.run_at,
        "delay": options.delay,
        # A tree-scoped key lives in spider_tree_key, not among the waiting jobs' keys.
        "unique_key": None if options.unique_key is None or options.unique_scope == "tree"
        else check_name("unique_key", options.unique_key),
        "tree_key": check_name("unique_key", options.unique_key) if options.unique_scope == "tree" else None,
        "parent": None if options.parent is None else check_name("parent job id", options.parent),
        "parent_id": None,
        "tree_id": None,
        "on_complete": None if options.on_complete is None else check_name("on_complete", options.on_complete),
        "on_complete_args": options.on_complete_args,
        "on_conflict": options.on_conflict,
        "retries": options.retries,
        "retry_delay": options.retry_delay,
        "periodic": options.periodic,
    }


def _in_request_order(rows: list[dict[str, Any]], returned) -> list[Enqueued]:
    """ENQUEUE_JOBS' rows (in no order) as the requested jobs' order: a unique job by its key (the job id may be a
    waiting job's), the others by job id."""
    by_key = {row.unique_key: row for row in returned if row.unique_key is not None}
    by_job = {row.job: row for row in returned}
    found = [by_key[row["unique_key"]] if row["unique_key"] is not None else by_job.get(row["job"]) for row in rows]
    return [Enqueued(row.id, row.job, row.existing) for row in found if row is not None]


def _refuse_existing_keys(rows: list[dict[str, Any]], enqueued: list[Enqueued]) -> None:
    """DuplicateJobError for the first job whose unique key (with on_conflict "error") a waiting job held."""
    for index, (row, result) in enumerate(zip(rows, enqueued)):
        if row["on_conflict"] == ERROR and result.existing:
            where = f"job {index}: " if len(rows) > 1 else ""
            raise DuplicateJobError(
                f"{where}unique_key '{row['unique_key']}' is held by waiting job '{result.job}' of project "
                f"'{row['project']}'"
            )


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
