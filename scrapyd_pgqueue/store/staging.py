"""Big batches by COPY, for a process whose driver can COPY (``waits.copy_allowed``): the ``enqueue`` command, and a
node's COPY helper (``node/copy_helper.py``) for schedule_batch.json and the crawl API.

A batch's ids are reserved first, in its order, so its jobs keep their order (and the claim's among equal
priorities) whichever way each goes. A job without a unique key or a tree (most of a bulk schedule) is copied
straight into spider_job while the batch is read: each job is checked as COPY asks for more rows, so the server
stores one stretch of the batch while this process checks the next, and a batch costs the slower of the two rather
than their sum. Its due time and status are worked out from the transaction's ``now()``, which every statement of the
transaction reads alike. Jobs with a unique key wait for the end of that COPY: those whose key no waiting job holds
are copied in the same way (one index probe a key); the rest, and tree jobs, are stored by the caller
(``place_aside``): copied into spider_job_staging with their reserved ids; a held key's replace then updates the
waiting job in place (REPLACE_STAGED_JOBS), and the rest are moved by MOVE_STAGED_JOBS (``enqueue.ENQUEUE_JOBS`` over
staged rows), which applies the unique key's rules (keep, error) and the tree's.
"""

from __future__ import annotations

import datetime
import io
import re
from typing import Any, Callable, Iterable

from scrapyd_pgqueue.database import clock
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL, Enqueued
from scrapyd_pgqueue.store.enqueue import (
    ENQUEUE_COLUMNS,
    Repeats,
    checked_row,
    duplicates_refused,
    in_request_order,
    insert_params,
)

# :count ids for a batch, in its order, the transaction's time (its jobs' creation and, for most, due time), and the
# project's routes (spider -> the tags its jobs require, for the jobs without tags of their own). None once the
# caller's time ran out (see enqueue.ENQUEUE_JOBS).
RESERVE_IDS = text("""
    SELECT array_agg(nextval('spider_job_id_seq') ORDER BY n) AS ids, now() AS now,
           (SELECT coalesce(json_object_agg(spider, pool), '{}') FROM spider_route WHERE project = :project) AS routes
    FROM generate_series(1, :count) AS n
    WHERE clock_timestamp() < to_timestamp(:answer_by)
    HAVING count(*) > 0
""")
# Jobs without a unique key or a tree, straight into the queue.
COPY_JOBS = ("COPY spider_job (id, project, spider, job, version, priority, message, status, run_at, unique_key, "
             "retries, retry_delay, periodic, max_runtime, stall_timeout, pool, created_time) FROM STDIN")
# Which of :keys waiting jobs of the project hold (spider_job_waiting_unique_key, one probe a key): a new job with
# another key goes straight into spider_job (within the transaction, a concurrent schedule of the same key makes the
# COPY fail: DuplicateJobError, nothing stored).
HELD_KEYS = text("""
    SELECT unique_key FROM spider_job
    WHERE project = :project AND unique_key = ANY(CAST(:keys AS text[])) AND status IN ('delayed', 'pending')
""")
# Jobs with a held unique key or a tree, into the staging table (batch: the transaction's id, by default).
STAGE_JOBS = ("COPY spider_job_staging (id, n, spider, job, version, priority, message, run_at_epoch, delay, "
              "unique_key, retries, retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout, "
              "pool) FROM STDIN")  # after id and n, enqueue.ENQUEUE_COLUMNS
# The staged jobs, moved: a transaction sees only its own staged rows (the committed ones were all deleted), and
# :first, the batch's first n, skips its earlier batches (dead rows until it ends) in the index. Apart from where its
# rows come from, and their reserved ids, this is enqueue.ENQUEUE_JOBS (see there; a test keeps the two in step).
MOVE_STAGED_JOBS = text("""
    WITH batch AS (
        DELETE FROM spider_job_staging WHERE batch = txid_current() AND n >= :first RETURNING *
    ), inserted AS (
        INSERT INTO spider_job AS j (id, project, spider, job, version, priority, message, status, run_at, unique_key,
                                     retries, retry_delay, periodic, parent, parent_id, tree_id, max_runtime,
                                     stall_timeout, pool, created_time)
        SELECT id, :project, spider, job, version, priority, message,
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
# The staged jobs with a key in :replace_keys, taken out of the staging table, each updating the waiting job that
# holds its key (a plain UPDATE joined on the key: spider_job_waiting_unique_key, one probe a job, in batch order). It
# sets what ENQUEUE_JOBS' ON CONFLICT sets, the job id kept, in three quarters of its time (100,000 replaced keys in
# batches of 20,000: 2.4-2.5 s against 3.2-3.5 s): no speculative insertion, no row lock before the update, no
# subquery per row. A taken job whose key no waiting job holds any longer (claimed meanwhile: the join's condition is
# checked again on a row it waited for) is not in the answer: the caller stages it again for the move, which inserts
# it.
REPLACE_STAGED_JOBS = text("""
    WITH staged AS (
        DELETE FROM spider_job_staging
        WHERE batch = txid_current() AND n >= :first AND unique_key = ANY(CAST(:replace_keys AS text[]))
        RETURNING *, coalesce(to_timestamp(run_at_epoch), now() + make_interval(secs => delay)) AS due
    ), replaced AS (
        UPDATE spider_job AS j SET (spider, version, priority, message, status, run_at, retries, retry_delay,
                                    max_runtime, stall_timeout, pool) = (
            s.spider, s.version, s.priority, s.message || jsonb_build_object('_job', j.job),
            CASE WHEN s.due > now() THEN 'delayed' ELSE 'pending' END, s.due, s.retries, s.retry_delay,
            s.max_runtime, s.stall_timeout,
            coalesce(s.pool, (SELECT r.pool FROM spider_route AS r WHERE r.project = :project AND r.spider = s.spider),
                     ''))
        FROM staged AS s
        WHERE j.project = :project AND j.unique_key = s.unique_key AND j.unique_key IS NOT NULL
          AND j.status IN ('delayed', 'pending') AND clock_timestamp() < to_timestamp(:answer_by)
        RETURNING j.id, j.job, j.unique_key, true AS existing
    ), woken AS (
        SELECT pg_notify(:channel, '') WHERE EXISTS (SELECT 1 FROM replaced) AND scrapyd_nodes_want_work()
    )
    SELECT id, job, unique_key, existing FROM replaced, (SELECT count(*) FROM woken) AS notified
""")
# Wakes idle nodes at commit, once per transaction, if any node wants work.
NOTIFY_JOBS = text("SELECT pg_notify(:channel, '') WHERE scrapyd_nodes_want_work()")
# Rows of checked jobs a read of the COPY hands the driver: enough to keep the server busy between two reads.
ROWS_PER_READ = 500


class StreamedBatch:
    """Where the jobs of a batch went: their reserved ids and job ids by position, and the places of the set-aside
    ones (a waiting job's, for a key it held). Made into Enqueued only when asked: the enqueue command needs the
    count alone, a million times over."""

    __slots__ = ("ids", "jobs", "placed")

    def __init__(self, ids: list[int], jobs: list[str], placed: dict[int, Enqueued]):
        self.ids, self.jobs, self.placed = ids, jobs, placed

    def __len__(self) -> int:
        return len(self.jobs)

    def enqueued(self) -> list[Enqueued]:
        return [self.placed.get(position) or Enqueued(id, job)
                for position, (id, job) in enumerate(zip(self.ids, self.jobs))]


def stream_jobs(connection, project: str, jobs: Iterable[tuple], count: int,
                place_aside: Callable[[list[dict[str, Any]], list[int], list[int]], list[Enqueued]]
                ) -> StreamedBatch | None:
    """Store the at most ``count`` jobs that ``jobs`` yields ((message, priority[, options]), checked as they are
    read) on ``connection``, in the caller's transaction; say where each went (None: the caller's time ran out).

    The jobs without a unique key or a tree are copied as they are checked; then those whose unique key no waiting
    job holds (HELD_KEYS), with their reserved ids. ``place_aside(rows, positions, ids)`` stores the rest (a key
    held, a tree) with their positions in the batch and their reserved ids, and says where each went. An
    InvalidJobError or DuplicateJobError names a job by its position in the batch; an error raised by ``jobs``
    itself is raised as it is."""
    params = {"channel": NOTIFY_CHANNEL, "answer_by": clock.answer_by()}
    reserved = connection.execute(RESERVE_IDS, {"project": project, "count": count,
                                                "answer_by": params["answer_by"]}).first()
    if reserved is None:
        return None
    source = _CheckedJobs(project, jobs, reserved.ids, reserved.now, reserved.routes)
    with duplicates_refused(project, source.job_ids, source.keys):
        try:
            connection.copy_in(COPY_JOBS, source)
        except Exception:
            if source.error is not None:
                raise source.error from None
            raise
        aside = source.aside
        if aside:
            keys = [row["unique_key"] for _, row in aside if row["unique_key"] is not None]
            held = set(connection.execute(HELD_KEYS, {"project": project, "keys": keys}).scalars()) if keys else ()
            free, aside = _split(aside, held)
            if free:
                connection.copy_in(COPY_JOBS, io.BytesIO("".join(
                    source.queue_line(reserved.ids[position], row) for position, row in free).encode()))
        if source.copied or len(aside) < len(source.aside):
            connection.execute(NOTIFY_JOBS, params)
        placed = {}
        if aside:
            positions = [position for position, _ in aside]
            placed = dict(zip(positions, place_aside([row for _, row in aside], positions,
                                                     [reserved.ids[i] for i in positions])))
    return StreamedBatch(reserved.ids, source.job_ids, placed)


def _straight(row: dict[str, Any], held) -> bool:
    """Whether a job goes straight into spider_job: no tree, and no unique key, or one no waiting job holds."""
    return row["unique_key"] not in held and row["parent"] is None and row["tree_key"] is None \
        and row["on_complete"] is None


def _split(aside: list[tuple[int, dict[str, Any]]], held) -> tuple[list, list]:
    """The set-aside jobs that go straight into spider_job (``_straight``), and the others, each in batch order."""
    straight, others = [], []
    for placed in aside:
        (straight if _straight(placed[1], held) else others).append(placed)
    return straight, others


def stage_jobs(connection, project: str, rows: list[dict[str, Any]], ids: list[int]) -> list[Enqueued]:
    """Store ``rows`` (from ``enqueue.checked_row``) with their reserved ``ids`` (increasing) through the staging
    table, in the caller's transaction; say where each went, in their order. A row's place n is its id: the move
    inserts in id order, and skips the transaction's earlier batches by it."""
    _stage(connection, rows, ids)
    params = {**insert_params(rows), "first": ids[0]}
    replaced = connection.execute(REPLACE_STAGED_JOBS, params).all() if params["replace_keys"] else []
    if len(replaced) < len(params["replace_keys"]):  # keys no waiting job held any longer: staged again, inserted
        taken = set(params["replace_keys"]) - {row.unique_key for row in replaced}
        again = [(id, row) for id, row in zip(ids, rows) if row["unique_key"] in taken]
        _stage(connection, [row for _, row in again], [id for id, _ in again])
    moved = connection.execute(MOVE_STAGED_JOBS, params).all() if len(replaced) < len(rows) else []
    return in_request_order(rows, replaced + moved)


def _stage(connection, rows: list[dict[str, Any]], ids: list[int]) -> None:
    """``rows`` into the staging table, each with its reserved id as its place n."""
    connection.copy_in(STAGE_JOBS, io.BytesIO("".join(map(_staged_line, ids, rows)).encode()))


def _staged_line(id: int, row: dict[str, Any]) -> str:
    """A job's row in STAGE_JOBS' columns. The line of a job with a key and nothing else to say (text that needs no
    escape: a bulk replace's) is written at once, twice as fast; any other, value by value."""
    if (row["version"] is None and row["run_at"] is None and row["delay"] is None and row["periodic"] is None
            and row["parent"] is None and row["parent_id"] is None and row["tree_id"] is None
            and row["max_runtime"] is None and row["stall_timeout"] is None and row["pool"] is None
            and row["unique_key"] is not None
            and not _NEEDS_ESCAPE.search(row["spider"] + row["job"] + row["message"] + row["unique_key"])):
        return (f"{id}\t{id}\t{row['spider']}\t{row['job']}\t\\N\t{row['priority']!r}\t{row['message']}\t\\N\t\\N\t"
                f"{row['unique_key']}\t{row['retries']}\t{row['retry_delay']!r}\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\t\\N\n")
    return _copy_line([id, id, *(row[column] for column in ENQUEUE_COLUMNS)])


class _CheckedJobs:
    """The COPY text of a batch's jobs without a key or a tree, made as the driver reads it; the others set aside. An
    error while reading (a bad job) is kept in ``error`` and ends the COPY (the driver reports only its text)."""

    def __init__(self, project: str, jobs: Iterable[tuple], ids: list[int], now: datetime.datetime,
                 routes: dict[str, str]):
        self.project, self.jobs, self.ids, self.routes = project, enumerate(jobs), ids, routes
        self.now, self.now_text = now, now.isoformat()
        self.repeats = Repeats()
        self.job_ids: list[str] = []  # by position, for duplicates_refused
        self.keys: list[str | None] = []
        self.aside: list[tuple[int, dict[str, Any]]] = []
        self.copied = 0
        self.error: Exception | None = None

    def read(self, size: int = -1) -> bytes:
        try:
            return self._next_rows()
        except Exception as e:
            self.error = e
            raise

    def _next_rows(self) -> bytes:
        lines = []
        for position, job in self.jobs:
            row = checked_row(self.project, job, position)
            self.repeats.refuse(position, row)
            self.job_ids.append(row["job"])
            self.keys.append(row["unique_key"])
            if row["unique_key"] is None and _straight(row, ()):  # a key waits for the probe of held keys
                lines.append(self.queue_line(self.ids[position], row))
                if len(lines) >= ROWS_PER_READ:
                    break
            else:
                self.aside.append((position, row))
        self.copied += len(lines)
        return "".join(lines).encode()

    def queue_line(self, id: int, row: dict[str, Any]) -> str:
        """A job's row in COPY_JOBS' columns, as ENQUEUE_JOBS would write it (times as text: most are ``now``; the
        pool its own tags, else its spider's route, else any node). The line of the common job (text that needs no
        escape, no version, periodic or limits) is written at once; any other, value by value."""
        if row["run_at"] is not None:
            due = datetime.datetime.fromtimestamp(row["run_at"], datetime.timezone.utc)
        elif row["delay"] is not None:
            due = self.now + datetime.timedelta(seconds=row["delay"])
        else:
            due = self.now
        status = "delayed" if due > self.now else "pending"
        run_at = self.now_text if due is self.now else due.isoformat()
        pool = self.routes.get(row["spider"], "") if row["pool"] is None else row["pool"]
        texts = row["project"] + row["spider"] + row["job"] + row["message"] + pool
        if (row["version"] is None and row["unique_key"] is None and row["periodic"] is None
                and row["max_runtime"] is None and row["stall_timeout"] is None and not _NEEDS_ESCAPE.search(texts)):
            return (f"{id}\t{row['project']}\t{row['spider']}\t{row['job']}\t\\N\t{row['priority']!r}\t"
                    f"{row['message']}\t{status}\t{run_at}\t\\N\t{row['retries']}\t{row['retry_delay']!r}\t"
                    f"\\N\t\\N\t\\N\t{pool}\t{self.now_text}\n")
        return _copy_line([id, row["project"], row["spider"], row["job"], row["version"], row["priority"],
                           row["message"], status, run_at, row["unique_key"], row["retries"], row["retry_delay"],
                           row["periodic"], row["max_runtime"], row["stall_timeout"], pool, self.now_text])


# What COPY's text format must escape in a value: backslash, tab, newline, carriage return.
_NEEDS_ESCAPE = re.compile(r"[\\\t\n\r]")


def _copy_line(values: list) -> str:
    """``values`` as a line of COPY's text format."""
    return "\t".join(
        "\\N" if value is None else _copy_text(value) if isinstance(value, str)
        else repr(value) if isinstance(value, float) else str(value)
        for value in values) + "\n"


def _copy_text(value: str) -> str:
    """A text value as COPY's text format reads it: backslash, tab, newline and carriage return escaped."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value
