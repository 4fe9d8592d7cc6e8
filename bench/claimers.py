"""The claim paths compared by the throughput suite, each behind the same small interface.

A claimer is built inside a worker process (after spawn), makes one claim per ``claim()`` call and returns
whether it got a job. ``KINDS`` maps each series name to its claimer and a label for the tables. Everything is
imported at the top so that a spawned worker has paid its imports before it reports ready.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from psycopg2 import sql
from scrapyd.config import Config
from scrapyd.spiderqueue import SqliteSpiderQueue

from bench import database
from scrapyd_pgqueue import store
from scrapyd_pgqueue.components.spiderqueue import PostgresSpiderQueue
from scrapyd_pgqueue.store import NOTIFY_CHANNEL, JobStore


@dataclass(frozen=True)
class ClaimRun:
    """What one worker process is asked to do for one timed run (pickled to the worker)."""

    kind: str
    database_url: str
    project: str
    seconds: float
    sqlite_dir: str
    level: int = 1  # how many claimers run together: picks the start barrier


def _node_name(index: int) -> str:
    return f"bench-node-{index}"


class PgQueuePop:
    """(a) ``PostgresSpiderQueue(config, project).pop()``, built from a Scrapyd ``Config`` as Scrapyd builds it."""

    def __init__(self, run: ClaimRun, index: int):
        config = Config(values={"database_url": run.database_url, "node_name": _node_name(index)})
        self.queue = PostgresSpiderQueue(config, run.project)

    def claim(self) -> bool:
        return self.queue.pop() is not None

    def close(self) -> None:
        # The engine is per process and stays cached; closing its pooled connections leaves the server idle.
        self.queue.store.engine.dispose()


class PgQueueClaimNextJobs:
    """(a) The poller's path: ``JobStore.claim_next_jobs(projects, 1, node=..., worker=...)``."""

    def __init__(self, run: ClaimRun, index: int):
        self.store = JobStore.for_url(run.database_url)
        self.projects = [run.project]
        self.node = _node_name(index)
        self.worker = uuid.uuid4().hex

    def claim(self) -> bool:
        return bool(self.store.claim_next_jobs(self.projects, 1, node=self.node, worker=self.worker).jobs)

    def close(self) -> None:
        self.store.engine.dispose()


def bare_claim_statement() -> str:
    """The store's claim (psycopg2 placeholders): the statement (a) sends, without its timeouts."""
    return store.CLAIM_NEXT_JOBS


def claim_0013_statement() -> str:
    """The claim before node pools, as the store sends it for a node without tags, of claim_0013() (0009's
    function) on CLAIM_0013_TABLE."""
    return store.CLAIM_NEXT_JOBS.replace("claim_spider_jobs(", "claim_0013(")


class BareClaimStatement:
    """(d) The ceiling: the store's claim statement alone, psycopg2, autocommit off, one commit per claim.

    The same parameters as (a): one project, limit 1, a node name and a worker id.
    """

    statement = staticmethod(bare_claim_statement)

    def __init__(self, run: ClaimRun, index: int):
        self.statement = self.statement()
        self.connection = database.connect(run.database_url)
        # A node without tags (the claim's own default), as every claimer here.
        self.params = {"projects": [run.project], "limit": 1, "node": _node_name(index), "worker": uuid.uuid4().hex,
                       "channel": NOTIFY_CHANNEL}

    def claim(self) -> bool:
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(self.statement, self.params)
                rows = cursor.fetchall()
            self.connection.commit()
        except Exception:
            self.connection.rollback()
            raise
        return any(row[0] is not None for row in rows)  # the last row (id NULL) is the claim's summary

    def close(self) -> None:
        self.connection.close()


class Claim0013Statement(BareClaimStatement):
    """(f) The claim before node pools: (d) as it was at migration 0013, on a copy of spider_job with that schema
    (issue 33's reference for the claim of a node without tags on a queue without tagged jobs)."""

    statement = staticmethod(claim_0013_statement)


def lean_claim_statement(table: str = database.LEAN_TABLE) -> str:
    """The lean claim: what a claim must do and nothing else, one statement (its table: database.LEAN_TABLE)."""
    return (f"UPDATE {table} SET status = 'ongoing', node = %(node)s, worker = %(worker)s, start_time = now(), "
            f"attempts = attempts + 1 WHERE id = (SELECT id FROM {table} WHERE status = 'pending' "
            f"ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING message")


class LeanClaim:
    """(e) The reference of issue 24: the lean claim statement over psycopg2 in autocommit, on a table with the
    queue's columns and a single partial index on pending rows (no promotion, limits, leases or trees)."""

    def __init__(self, run: ClaimRun, index: int):
        self.statement = lean_claim_statement()
        self.connection = database.connect(run.database_url, autocommit=True)
        self.params = {"node": _node_name(index), "worker": uuid.uuid4().hex}

    def claim(self) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute(self.statement, self.params)
            return cursor.fetchone() is not None

    def close(self) -> None:
        self.connection.close()


class SeedLockTable:
    """(b) The seed article's pop, psycopg2 directly (its ORM session would only add client time).

    One transaction: LOCK TABLE ... IN SHARE ROW EXCLUSIVE MODE (it conflicts with itself, so claimers queue
    one behind another), read the best pending row, mark it ongoing, commit.
    """

    table = database.SEED_TABLE

    def __init__(self, run: ClaimRun, index: int):
        name = sql.Identifier(self.table)
        self.lock = sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(name)
        # The article's query(SpiderJob).filter(status == 'pending').order_by(priority.desc()).first()
        self.select = sql.SQL(
            "SELECT id, priority, message, status, project, spider, job, start_time, end_time FROM {} "
            "WHERE status = 'pending' ORDER BY priority DESC LIMIT 1"
        ).format(name)
        # The ORM flushes only the changed column.
        self.update = sql.SQL("UPDATE {} SET status = 'ongoing' WHERE id = %s").format(name)
        self.connection = database.connect(run.database_url)

    def claim(self) -> bool:
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(self.lock)
                cursor.execute(self.select)
                row = cursor.fetchone()
                if row is not None:
                    json.loads(bytes(row[2]))  # the article decodes the message it returns
                    cursor.execute(self.update, (row[0],))
            self.connection.commit()
        except Exception:
            self.connection.rollback()
            raise
        return row is not None

    def close(self) -> None:
        self.connection.close()


class SeedLockTableAsPublished(SeedLockTable):
    """(b') The same on the article's table exactly as published: no index, so every claim sorts the table."""

    table = database.SEED_TABLE_AS_PUBLISHED


class ScrapydSqlite:
    """(c) Scrapyd's own ``SqliteSpiderQueue``: one file, shared by the worker processes of this one node."""

    def __init__(self, run: ClaimRun, index: int):
        self.queue = SqliteSpiderQueue(Config(values={"dbs_dir": run.sqlite_dir}), run.project)

    def claim(self) -> bool:
        try:
            return self.queue.pop() is not None
        except Exception:
            # "database is locked" can leave the DELETE's implicit transaction open; close it so this worker
            # keeps measuring. (Scrapyd itself does not: its poller stops for good on the exception.)
            self.queue.q.conn.rollback()
            raise

    def close(self) -> None:
        self.queue.q.conn.close()


@dataclass(frozen=True)
class Kind:
    label: str
    claimer: type
    store: str  # which backlog it reads: "spider_job", a seed table, or "sqlite"


KINDS = {
    "pgqueue_pop": Kind("(a) PostgresSpiderQueue.pop()", PgQueuePop, "spider_job"),
    "pgqueue_claim_next_jobs": Kind("(a) JobStore.claim_next_jobs (poller)", PgQueueClaimNextJobs, "spider_job"),
    "seed_lock_table": Kind("(b) seed LOCK TABLE, pending index", SeedLockTable, database.SEED_TABLE),
    "seed_lock_table_as_published": Kind(
        "(b') seed LOCK TABLE, no index (as published)", SeedLockTableAsPublished, database.SEED_TABLE_AS_PUBLISHED
    ),
    "scrapyd_sqlite": Kind("(c) Scrapyd SqliteSpiderQueue", ScrapydSqlite, "sqlite"),
    "bare_claim_statement": Kind("(d) bare claim statement, psycopg2", BareClaimStatement, "spider_job"),
    "lean_claim": Kind("(e) lean claim, lean table", LeanClaim, database.LEAN_TABLE),
    "claim_0013": Kind("(f) claim before node pools (0013), its table", Claim0013Statement, database.CLAIM_0013_TABLE),
}


def open_claimer(run: ClaimRun, index: int):
    return KINDS[run.kind].claimer(run, index)
