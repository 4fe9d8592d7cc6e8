"""Adding jobs: the rules a job's columns follow, and the one statement that stores a batch (delayed, unique and
tree jobs too); run by ``queue.JobStore.enqueue`` and by periodic firings inside their own transaction.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import msgspec

from scrapyd_pgqueue.database import clock
from scrapyd_pgqueue.database.sql import IntegrityError, text
from scrapyd_pgqueue.job_rules.checks import InvalidJobError, check_name, check_priority, encode_message
from scrapyd_pgqueue.job_rules.options import ERROR, NO_OPTIONS, REPLACE, JobOptions
from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL, DuplicateJobError, Enqueued
from scrapyd_pgqueue.tags import pool_key

# --- queries ---------------------------------------------------------------------------------------------------

# Add jobs, all or none, in one statement, from the rows of the batch, a JSON array (:rows, ``json_rows``): one
# parameter, parsed by the server in one pass (1.4x faster than arrays, one per column, whose elements the driver
# quotes one by one), each row with its place n. Rows are inserted in their batch order (ORDER BY n), so their ids,
# and so the claim order among equal priorities, follow it. A job due later (run_at, or delay on the database's
# clock) waits as 'delayed'; run_at is every job's due time (past-due counts read it). A job's pool (the tags it
# requires) is its own _tags, else its spider's route (spider_route's primary key: one probe per job), else '' (any
# node). A unique key already held by a waiting job of the project updates that job instead
# (spider_job_waiting_unique_key decides, also between concurrent schedules): with the new run time, priority,
# arguments and settings for the keys in :replace_keys, unchanged otherwise; the rest of its row (its id, job id,
# tree, periodic and creation time) stays the job's; RETURNING says which rows existed (xmax is set on a row ON
# CONFLICT updated). Only while the caller still waits for the answer (:answer_by, database clock): a statement that
# reaches a stalled server and runs after the caller gave up and answered "error" must not leave a ghost job behind.
# One NOTIFY wakes idle nodes, if any node wants work (delivered on commit, so a woken node finds the rows; a node
# woken by delayed jobs learns when the first is due). staging.MOVE_STAGED_JOBS is this statement over staged rows
# (a test keeps the two in step).
ENQUEUE_JOBS = text("""
    WITH batch AS (
        SELECT * FROM ROWS FROM (json_to_recordset(CAST(:rows AS json)) AS (
                 spider text, job text, version text, priority double precision, message jsonb,
                 run_at double precision, delay double precision, unique_key text, retries integer,
                 retry_delay double precision, periodic text, parent text, parent_id bigint, tree_id bigint,
                 max_runtime double precision, stall_timeout double precision, pool text))
             WITH ORDINALITY AS b(spider, job, version, priority, message, run_at_epoch, delay, unique_key, retries,
                                  retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout, pool,
                                  n)
    ), inserted AS (
        INSERT INTO spider_job AS j (project, spider, job, version, priority, message, status, run_at, unique_key,
                                     retries, retry_delay, periodic, parent, parent_id, tree_id, max_runtime,
                                     stall_timeout, pool, created_time)
        SELECT :project, spider, job, version, priority, message,
               CASE WHEN due > now() THEN 'delayed' ELSE 'pending' END, coalesce(due, now()),
               unique_key, retries, retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout,
               coalesce(pool, (SELECT r.pool FROM spider_route AS r
                               WHERE r.project = :project AND r.spider = due_batch.spider), ''),
               now()
        FROM (SELECT b.*, coalesce(to_timestamp(b.run_at_epoch), now() + make_interval(secs => b.delay)) AS due
              FROM batch AS b) AS due_batch
        WHERE clock_timestamp() < to_timestamp(:answer_by)
        ORDER BY n
        ON CONFLICT (project, unique_key) WHERE status IN ('delayed', 'pending') AND unique_key IS NOT NULL
        DO UPDATE SET (spider, version, priority, message, status, run_at, retries, retry_delay, max_runtime,
                       stall_timeout, pool) = (
            SELECT EXCLUDED.spider, EXCLUDED.version, EXCLUDED.priority,
                   EXCLUDED.message || jsonb_build_object('_job', j.job), EXCLUDED.status, EXCLUDED.run_at,
                   EXCLUDED.retries, EXCLUDED.retry_delay, EXCLUDED.max_runtime, EXCLUDED.stall_timeout, EXCLUDED.pool
            WHERE EXCLUDED.unique_key = ANY(CAST(:replace_keys AS text[]))
            UNION ALL
            SELECT j.spider, j.version, j.priority, j.message, j.status, j.run_at, j.retries, j.retry_delay,
                   j.max_runtime, j.stall_timeout, j.pool
            WHERE NOT EXCLUDED.unique_key = ANY(CAST(:replace_keys AS text[]))
        )
        RETURNING j.id, j.job, j.unique_key, j.xmax <> 0 AS existing
    ), woken AS (
        SELECT pg_notify(:channel, '') WHERE EXISTS (SELECT 1 FROM inserted) AND scrapyd_nodes_want_work()
    )
    SELECT id, job, unique_key, existing FROM inserted, (SELECT count(*) FROM woken) AS notified
""")

# The columns of a batch's row (a staged row's after id and n).
ENQUEUE_COLUMNS = (
    "spider", "job", "version", "priority", "message", "run_at", "delay", "unique_key", "retries", "retry_delay",
    "periodic", "parent", "parent_id", "tree_id", "max_runtime", "stall_timeout", "pool",
)

# --- operations ------------------------------------------------------------------------------------------------


def insert_jobs(connection, project: str, rows: list[dict[str, Any]]) -> list[Enqueued]:
    """Store ``rows`` (from ``job_rows``) on ``connection`` with ENQUEUE_JOBS, in a transaction of the caller's (a
    periodic firing) or alone; say where each job went, in their order. Empty when the caller's time ran out.
    (The enqueue command's batches go through ``staging.stream_jobs`` instead.)"""
    params = {**insert_params(rows), "rows": json_rows(rows)}
    with duplicates_refused(project, [row["job"] for row in rows]):
        return in_request_order(rows, connection.execute(ENQUEUE_JOBS, params).all())


def insert_params(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of ENQUEUE_JOBS (and staging.MOVE_STAGED_JOBS) besides its rows."""
    return {
        "project": rows[0]["project"], "channel": NOTIFY_CHANNEL, "answer_by": clock.answer_by(),
        # Keys only: a NULL in the array would make "NOT key = ANY(...)" NULL for the keys not in it (a NULL spider).
        "replace_keys": [row["unique_key"] for row in rows if row["on_conflict"] == REPLACE and row["unique_key"]],
    }


def json_rows(rows: list[dict[str, Any]]) -> str:
    """``rows`` as ENQUEUE_JOBS reads them: a JSON array of objects, the message as the JSON object it is."""
    return _ROWS_ENCODER.encode([{**row, "message": msgspec.Raw(row["message"].encode())} for row in rows]).decode()


_ROWS_ENCODER = msgspec.json.Encoder()


def job_rows(project: str, jobs, numbered: bool) -> list[dict[str, Any]]:
    """The checked columns of each (message, priority[, options]); InvalidJobError or DuplicateJobError naming the
    job's index in a batch."""
    rows = [checked_row(project, job, index, numbered) for index, job in enumerate(jobs)]
    repeats = Repeats()
    for index, row in enumerate(rows):
        repeats.refuse(index, row)
    return rows


def checked_row(project: str, job: tuple, index: int, numbered: bool = True) -> dict[str, Any]:
    """The checked columns of one (message, priority[, options]), the ``index``-th of its batch (named in an
    InvalidJobError where ``numbered``)."""
    message, priority, *options = job
    try:
        return _job_row(project, message, priority, options[0] if options else NO_OPTIONS)
    except InvalidJobError as e:
        raise InvalidJobError(f"job {index}: {e}" if numbered else str(e)) from None


class Repeats:
    """A batch's job ids and unique keys so far: a second job with either is refused (DuplicateJobError naming both
    jobs' indexes; tree keys are not among them: the first job with one wins)."""

    def __init__(self):
        self.jobs: dict[str, int] = {}
        self.keys: dict[str, int] = {}

    def refuse(self, index: int, row: dict[str, Any]) -> None:
        if self.jobs.setdefault(row["job"], index) != index:
            raise DuplicateJobError(f"job {index}: job id '{row['job']}' is also job {self.jobs[row['job']]}")
        key = row["unique_key"]
        if key is not None and self.keys.setdefault(key, index) != index:
            raise DuplicateJobError(f"job {index}: unique_key '{key}' is also job {self.keys[key]}")


def _job_row(project: str, message: dict[str, Any], priority: float, options: JobOptions) -> dict[str, Any]:
    """The columns of a new job, checked as the table can hold them (InvalidJobError)."""
    if isinstance(priority, str):  # the Python API's text, read as schedule.json reads its form's
        try:
            priority = float(priority)
        except ValueError:
            raise InvalidJobError(f"priority must be a number, not {priority!r}") from None
    priority = check_priority(priority)
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
        "max_runtime": options.max_runtime,
        "stall_timeout": options.stall_timeout,
        "pool": None if options.tags is None else pool_key(options.tags),
    }


def in_request_order(rows: list[dict[str, Any]], returned) -> list[Enqueued]:
    """ENQUEUE_JOBS' rows (in no order) as the requested jobs' order: a unique job by its key (the job id may be a
    waiting job's), the others by job id."""
    by_key = {row.unique_key: row for row in returned if row.unique_key is not None}
    by_job = {row.job: row for row in returned}
    found = [by_key[row["unique_key"]] if row["unique_key"] is not None else by_job.get(row["job"]) for row in rows]
    return [Enqueued(row.id, row.job, row.existing) for row in found if row is not None]


def refuse_existing_keys(rows: list[dict[str, Any]], enqueued: list[Enqueued], positions: list[int] | None = None):
    """DuplicateJobError for the first job whose unique key (with on_conflict "error") a waiting job held, named by
    its place in ``rows`` (or in its batch: ``positions``)."""
    for index, (row, result) in enumerate(zip(rows, enqueued)):
        if row["on_conflict"] == ERROR and result.existing:
            where = f"job {positions[index]}: " if positions is not None else f"job {index}: " if len(rows) > 1 else ""
            raise DuplicateJobError(
                f"{where}unique_key '{row['unique_key']}' is held by waiting job '{result.job}' of project "
                f"'{row['project']}'"
            )


@contextlib.contextmanager
def duplicates_refused(project: str, jobs: list[str], keys: list[str | None] = ()):
    """The live-job unique index's refusal as DuplicateJobError, naming the job (and its place in a batch); the
    waiting-key index's (a job copied with a key that a concurrent schedule took; ``keys`` by place) likewise."""
    try:
        yield
    except IntegrityError as e:
        constraint = getattr(e.orig, "diag", None) and e.orig.diag.constraint_name
        if constraint not in ("spider_job_live_job_key", "spider_job_waiting_unique_key"):
            raise
        detail = e.orig.diag.message_detail or ""  # Key (project, job)=(p, j) already exists.
        values = jobs if constraint == "spider_job_live_job_key" else keys
        index = next((i for i, value in enumerate(values) if detail.endswith(f", {value}) already exists.")), 0)
        where = f"job {index}: " if len(jobs) > 1 else ""
        if constraint == "spider_job_waiting_unique_key":
            raise DuplicateJobError(f"{where}unique_key '{keys[index]}' was taken by a job scheduled meanwhile in "
                                    f"project '{project}'") from None
        raise DuplicateJobError(
            f"{where}job id '{jobs[index]}' is already pending or running in project '{project}'"
        ) from None
