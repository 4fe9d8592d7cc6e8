"""Big batches by COPY, for a process whose driver can COPY (the ``enqueue`` command: ``waits.copy_allowed``).

Ids are reserved for the whole batch first, in its order, so the jobs keep their order (and the claim's among equal
priorities) whichever way each goes: a job without a unique key is copied straight into spider_job, as a row of its
own (its due time and status worked out from the transaction's ``now()``, which every statement of the transaction
reads alike); a job with a key is copied into spider_job_staging, then moved by ``enqueue.INSERT_BATCH``, which
applies the key's rules (replace, keep, error).
"""

from __future__ import annotations

import datetime
import io
from typing import Any

from scrapyd_pgqueue.store import waits
from scrapyd_pgqueue.store.sql import text
from scrapyd_pgqueue.store.base import NODES_WANT_WORK, Enqueued
from scrapyd_pgqueue.store.enqueue import (
    ENQUEUE_COLUMNS,
    INSERT_BATCH,
    duplicates_refused,
    in_request_order,
    insert_params,
)

# Batches from this size are copied: below it, the extra round trips cost more than COPY saves.
STAGED_FROM_JOBS = 100

# :count ids for a batch, in its order, and the transaction's time (its jobs' creation and, for most, due time). None
# once the caller's time ran out (see enqueue.INSERT_BATCH).
RESERVE_IDS = text("""
    SELECT array_agg(nextval('spider_job_id_seq') ORDER BY n) AS ids, now() AS now FROM generate_series(1, :count) AS n
    WHERE clock_timestamp() < to_timestamp(:answer_by)
    HAVING count(*) > 0
""")
# Jobs without a unique key, straight into the queue; the tree trigger counts tree jobs as for an INSERT.
COPY_JOBS = ("COPY spider_job (id, project, spider, job, version, priority, message, status, run_at, retries, "
             "retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout, pool, created_time) "
             "FROM STDIN")
# Jobs with a unique key, into the staging table (batch: the transaction's id, by default).
STAGE_JOBS = ("COPY spider_job_staging (id, n, spider, job, version, priority, message, run_at_epoch, delay, "
              "unique_key, retries, retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout, "
              "pool) FROM STDIN")  # after id and n, enqueue.ENQUEUE_COLUMNS
# The staged jobs, moved: a transaction sees only its own staged rows (the committed ones were all deleted), and
# :first, the batch's first n, skips its earlier batches (dead rows until it ends) in the index.
MOVE_STAGED_JOBS = text(INSERT_BATCH.format(id="id, ", batch="""batch AS (
        DELETE FROM spider_job_staging WHERE batch = txid_current() AND n >= :first RETURNING *
    )"""))
# The project's routes (spider -> the tags its jobs require), for the jobs copied straight in without tags of their own.
PROJECT_ROUTES = text("SELECT spider, pool FROM spider_route WHERE project = :project")
# Wakes idle nodes at commit, once per transaction, if any node wants work (store/base.NODES_WANT_WORK).
NOTIFY_JOBS = text(f"SELECT pg_notify(:channel, '') WHERE {NODES_WANT_WORK}")


def staged(rows: list[dict[str, Any]]) -> bool:
    """Whether ``rows`` go in by COPY (in a transaction: the reserved ids, the COPY, the move)."""
    return len(rows) >= STAGED_FROM_JOBS and waits.copy_allowed()


def copy_jobs(connection, project: str, rows: list[dict[str, Any]], first: int = 0) -> list[Enqueued]:
    """Store ``rows`` (from ``enqueue.job_rows``) on ``connection``, in the caller's transaction, after the ``first``
    jobs the transaction stored already; say where each job went, in their order (empty: the caller's time ran out)."""
    params = insert_params(rows)
    reserved = connection.execute(RESERVE_IDS, {"count": len(rows), "answer_by": params["answer_by"]}).first()
    if reserved is None:
        return []
    ids, now = reserved.ids, reserved.now
    plain = [index for index, row in enumerate(rows) if row["unique_key"] is None]
    keyed = [index for index, row in enumerate(rows) if row["unique_key"] is not None]
    enqueued: dict[int, Enqueued] = {}
    with duplicates_refused(project, [row["job"] for row in rows]):
        if plain:
            now_text = now.isoformat()
            routes = dict(connection.execute(PROJECT_ROUTES, {"project": project}).all())
            connection.copy_in(COPY_JOBS, _lines(_queue_row(ids[i], rows[i], now, now_text, routes) for i in plain))
            connection.execute(NOTIFY_JOBS, params)
            enqueued.update((i, Enqueued(ids[i], rows[i]["job"])) for i in plain)
        if keyed:
            staged_lines = (
                [ids[i], first + i, *(rows[i][column] for column in ENQUEUE_COLUMNS)] for i in keyed)
            connection.copy_in(STAGE_JOBS, _lines(staged_lines))
            moved = connection.execute(MOVE_STAGED_JOBS, {**params, "first": first}).all()
            enqueued.update(zip(keyed, in_request_order([rows[i] for i in keyed], moved)))
    return [enqueued[index] for index in range(len(rows))]


def _queue_row(id: int, row: dict[str, Any], now: datetime.datetime, now_text: str, routes: dict[str, str]) -> list:
    """A job's columns as INSERT_BATCH would write them, in COPY_JOBS' order (times as text: most are ``now``; the
    pool its own tags, else its spider's route, else any node)."""
    if row["run_at"] is not None:
        due = datetime.datetime.fromtimestamp(row["run_at"], datetime.timezone.utc)
    elif row["delay"] is not None:
        due = now + datetime.timedelta(seconds=row["delay"])
    else:
        due = now
    return [id, row["project"], row["spider"], row["job"], row["version"], row["priority"], row["message"],
            "delayed" if due > now else "pending", now_text if due == now else due.isoformat(), row["retries"],
            row["retry_delay"], row["periodic"], row["parent"], row["parent_id"], row["tree_id"], row["max_runtime"],
            row["stall_timeout"], routes.get(row["spider"], "") if row["pool"] is None else row["pool"], now_text]


def _lines(rows) -> io.BytesIO:
    """``rows`` (lists of values) in COPY's text format."""
    lines = []
    for values in rows:
        lines.append("\t".join(
            "\\N" if value is None else _copy_text(value) if isinstance(value, str)
            else repr(value) if isinstance(value, float) else str(value)
            for value in values))
    lines.append("")
    return io.BytesIO("\n".join(lines).encode())


def _copy_text(value: str) -> str:
    """A text value as COPY's text format reads it: backslash, tab, newline and carriage return escaped."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value
