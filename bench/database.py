"""The benchmark's Postgres: where it comes from, how its tables are filled, and what the server reports.

All values reach SQL as query parameters; the only identifiers put into SQL text are the benchmark's own table
names, quoted with ``psycopg2.sql.Identifier``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg2
import psycopg2.extensions
from psycopg2 import sql
from sqlalchemy import make_url

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.local import devdb

# The seed article's table, rebuilt as it published it (SQLAlchemy types Integer, Float, LargeBinary, String,
# DateTime). SEED_TABLE gets one partial index on pending rows so that it reads the head of an index as ours does
# and the comparison isolates LOCK TABLE against SKIP LOCKED; SEED_TABLE_AS_PUBLISHED has only its primary key.
SEED_TABLE = "seed_spider_job"
SEED_TABLE_AS_PUBLISHED = "seed_spider_job_as_published"
SEED_TABLES = (SEED_TABLE, SEED_TABLE_AS_PUBLISHED)

# The lean claim's table (issue 24's reference): the queue's columns and one partial index on pending rows, in the
# claim's order; nothing else (no other index, no trigger, no constraint but the primary key).
LEAN_TABLE = "lean_spider_job"
CREATE_LEAN_TABLE = """
    CREATE TABLE IF NOT EXISTS lean_spider_job (
        LIKE spider_job INCLUDING DEFAULTS INCLUDING IDENTITY, PRIMARY KEY (id));
    CREATE INDEX IF NOT EXISTS lean_spider_job_pending_idx ON lean_spider_job (priority DESC, id)
        WHERE status = 'pending'
"""
# The claim as it was before node pools (migration 0013): 0009's claim function, claim_0013, on a copy of spider_job
# with 0013's schema (no pool column; pending indexes without it; the same triggers). Issue 33's reference: the claim
# of a node without tags on a queue without tagged jobs costs what this one does.
CLAIM_0013_TABLE = "claim_0013_spider_job"
CREATE_CLAIM_0013_TABLE = f"""
    DROP TABLE IF EXISTS {CLAIM_0013_TABLE};
    CREATE TABLE {CLAIM_0013_TABLE} (LIKE spider_job INCLUDING ALL);
    ALTER TABLE {CLAIM_0013_TABLE} DROP COLUMN pool;
    CREATE INDEX ON {CLAIM_0013_TABLE} (priority DESC, id) WHERE status = 'pending';
    CREATE INDEX ON {CLAIM_0013_TABLE} (project, priority DESC, id) WHERE status = 'pending'
"""
# spider_job's own triggers (the crawl trees' counts), for the copy.
SPIDER_JOB_TRIGGERS = """
    SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = 'spider_job'::regclass AND NOT tgisinternal
"""
BENCHMARK_TABLES = (*SEED_TABLES, LEAN_TABLE, CLAIM_0013_TABLE)

CREATE_SEED_TABLE = """
    CREATE TABLE IF NOT EXISTS {table} (
        id serial PRIMARY KEY,
        priority double precision,
        message bytea,
        status varchar,
        project varchar,
        spider varchar,
        job varchar,
        start_time timestamp,
        end_time timestamp
    )
"""
CREATE_SEED_PENDING_INDEX = "CREATE INDEX IF NOT EXISTS {index} ON {table} (priority DESC) WHERE status = 'pending'"

# Pending jobs the way Scrapyd's schedule.json makes them (message = spider args + name + _job + settings),
# spread evenly over :projects, each with a random priority of ten levels (or :priority when given). Priorities
# come from random() so that they are independent of the project: a pattern tied to the row number lines up with
# the project cycle and leaves whole projects without their top priorities.
FILL_SPIDER_JOB = """
    INSERT INTO {table} (project, spider, job, priority, message, status, created_time)
    SELECT project, spider, job, coalesce(%(priority)s, floor(random() * 10)),
           jsonb_build_object('name', spider, '_job', job, 'settings', jsonb_build_object(), 'category', 'bench'),
           'pending', localtimestamp
    FROM (
        SELECT (%(projects)s::text[])[1 + i %% cardinality(%(projects)s::text[])] AS project,
               'spider' || (i %% 13) AS spider,
               %(prefix)s || i AS job
        FROM generate_series(%(first)s, %(first)s + %(count)s - 1) AS i
    ) AS generated
"""

FILL_SEED_TABLE = """
    INSERT INTO {table} (priority, message, status, project, spider, job)
    SELECT floor(random() * 10),
           convert_to(json_build_object('name', 'spider' || (i %% 13), '_job', 'seed-' || i,
                                        'settings', json_build_object(), 'category', 'bench')::text, 'UTF8'),
           'pending', %(project)s, 'spider' || (i %% 13), 'seed-' || i
    FROM generate_series(1, %(count)s) AS i
"""

RANDOM_SEED = 0.42  # priorities are random but the same in every run and every backlog

# CASCADE: tables that hang off spider_job (job_log) go with it; the benchmark makes no rows there.
TRUNCATE_SPIDER_JOB = "TRUNCATE spider_job RESTART IDENTITY CASCADE"

TABLE_STATS = """
    SELECT n_live_tup, n_dead_tup, autovacuum_count, vacuum_count, last_autovacuum, last_vacuum,
           pg_relation_size(relid) AS heap_bytes,
           pg_indexes_size(relid) AS indexes_bytes,
           pg_total_relation_size(relid) AS total_bytes
    FROM pg_stat_user_tables WHERE relname = %(table)s
"""

# Exact row counts by status (the statistics' n_live_tup is an estimate, and a flush that arrives after a VACUUM
# can count a fill twice).
STATUS_COUNTS = "SELECT status, count(*) FROM spider_job GROUP BY status"

INDEX_SIZES = """
    SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
    WHERE relname = %(table)s ORDER BY indexrelname
"""

SERVER_SETTINGS = (
    "max_connections",
    "shared_buffers",
    "fsync",
    "synchronous_commit",
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_threshold",
)


def connect(url: str, autocommit: bool = False):
    """A plain psycopg2 connection for a SQLAlchemy-style URL (``postgresql+psycopg2://`` accepted)."""
    parsed = make_url(url)
    connection = psycopg2.connect(
        host=parsed.host,
        port=parsed.port or 5432,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database or "postgres",
        application_name="scrapyd-pgqueue-bench",
        **parsed.query,
    )
    connection.autocommit = autocommit
    return connection


@contextlib.contextmanager
def admin_connection(url: str) -> Iterator:
    """An autocommit connection: VACUUM cannot run inside a transaction."""
    connection = connect(url, autocommit=True)
    try:
        yield connection
    finally:
        connection.close()


@contextlib.contextmanager
def copying_connection(url: str) -> Iterator:
    """An autocommit connection that can COPY: psycopg2 refuses COPY while the package's wait callback (deadlines)
    is set, so it is unset meanwhile; for a single-threaded part of a suite, no node of the bench's process running."""
    callback = psycopg2.extensions.get_wait_callback()
    psycopg2.extensions.set_wait_callback(None)
    try:
        with admin_connection(url) as connection:
            yield connection
    finally:
        psycopg2.extensions.set_wait_callback(callback)


@contextlib.contextmanager
def benchmark_database(url: str | None, log) -> Iterator[str]:
    """The URL to benchmark against: a throwaway server removed at the end, or ``url`` left as it was found."""
    if url is None:
        log("starting a throwaway Postgres (scrapyd_pgqueue.local.devdb.throwaway_postgres)")
        server = devdb.throwaway_postgres()
        try:
            yield server.url
        finally:
            log("removing the throwaway Postgres")
            server.remove()
        return
    refuse_database_in_use(url)
    try:
        yield url
    finally:
        drop_benchmark_rows(url)


def refuse_database_in_use(url: str) -> None:
    """The benchmark truncates spider_job: never point it at a database whose queue holds jobs."""
    with admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('spider_job') IS NOT NULL")
        if not cursor.fetchone()[0]:
            return
        cursor.execute("SELECT EXISTS (SELECT 1 FROM spider_job)")
        if cursor.fetchone()[0]:
            raise SystemExit(
                f"refusing to run: spider_job in {db.describe(url)} holds jobs and the benchmark truncates it; "
                "give the URL of an empty database"
            )


def drop_benchmark_rows(url: str) -> None:
    """Leave a given database as found: the queue schema empty, the benchmark's own tables gone."""
    with admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(TRUNCATE_SPIDER_JOB)
        for table in BENCHMARK_TABLES:
            cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        cursor.execute("DROP FUNCTION IF EXISTS claim_0013(text[], integer, text, text, text)")


def prepare_schema(url: str) -> None:
    """The queue's schema through the package's own migrations, and the seed article's tables."""
    db.get_engine(url)
    with admin_connection(url) as connection, connection.cursor() as cursor:
        for table in SEED_TABLES:
            cursor.execute(sql.SQL(CREATE_SEED_TABLE).format(table=sql.Identifier(table)))
        cursor.execute(
            sql.SQL(CREATE_SEED_PENDING_INDEX).format(
                index=sql.Identifier(f"{SEED_TABLE}_pending_idx"), table=sql.Identifier(SEED_TABLE)
            )
        )
        cursor.execute(CREATE_LEAN_TABLE)
        create_claim_0013(cursor)


def create_claim_0013(cursor) -> None:
    """CLAIM_0013_TABLE and claim_0013(), 0009's claim function reading and writing that table."""
    import re
    import runpy

    from scrapyd_pgqueue.migrations import versions

    cursor.execute(CREATE_CLAIM_0013_TABLE)
    cursor.execute(SPIDER_JOB_TRIGGERS)
    for (trigger,) in cursor.fetchall():
        cursor.execute(trigger.replace(" ON public.spider_job ", f" ON {CLAIM_0013_TABLE} "))
    path = Path(versions.__path__[0]) / "0014_node_pools.py"
    function = runpy.run_path(str(path))["OLD_CLAIM_FUNCTION"].replace(
        "FUNCTION claim_spider_jobs(", "FUNCTION claim_0013(").replace(
        "LANGUAGE plpgsql VOLATILE SET plan_cache_mode", "LANGUAGE plpgsql VOLATILE SET search_path = public, pg_temp "
        "SET plan_cache_mode")
    cursor.execute(re.sub(r"\bspider_job\b(?!_)", CLAIM_0013_TABLE, function))

def fill_spider_job(url: str, count: int, projects: Sequence[str], prefix: str, table: str = "spider_job") -> None:
    """Replace the queue (or the lean table) with ``count`` fresh pending jobs, then VACUUM ANALYZE as a settled
    table would be."""
    with admin_connection(url) as connection, connection.cursor() as cursor:
        name = sql.Identifier(table)
        cursor.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(name))
        cursor.execute("SELECT setseed(%s)", (RANDOM_SEED,))  # the same priorities in every run
        insert_pending(cursor, count, projects, prefix, first=1, table=table)
        cursor.execute(sql.SQL("VACUUM ANALYZE {}").format(name))


def insert_pending(
    cursor, count: int, projects: Sequence[str], prefix: str, first: int, priority: float | None = None,
    table: str = "spider_job",
) -> None:
    """Add ``count`` pending jobs numbered from ``first`` (job ids ``prefix || n`` must not collide)."""
    params = {"projects": list(projects), "prefix": prefix, "first": first, "count": count, "priority": priority}
    cursor.execute(sql.SQL(FILL_SPIDER_JOB).format(table=sql.Identifier(table)), params)


def fill_seed_table(url: str, table: str, count: int, project: str) -> None:
    with admin_connection(url) as connection, connection.cursor() as cursor:
        name = sql.Identifier(table)
        cursor.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(name))
        cursor.execute("SELECT setseed(%s)", (RANDOM_SEED,))
        cursor.execute(sql.SQL(FILL_SEED_TABLE).format(table=name), {"count": count, "project": project})
        cursor.execute(sql.SQL("VACUUM ANALYZE {}").format(name))


def fill_scrapyd_sqlite_queue(dbs_dir: Path, project: str, count: int) -> None:
    """A fresh ``<dbs_dir>/<project>.db`` as Scrapyd's SqliteSpiderQueue makes it, holding ``count`` jobs."""
    path = dbs_dir / f"{project}.db"
    for stale in (path, path.with_name(path.name + "-journal")):
        stale.unlink(missing_ok=True)
    connection = sqlite3.connect(path)
    try:
        # Scrapyd's own DDL (scrapyd.sqlite.JsonSqlitePriorityQueue); "real key" is a type name, not an index.
        connection.execute("CREATE TABLE spider_queue (id integer PRIMARY KEY, priority real key, message blob)")
        priorities = random.Random(RANDOM_SEED)
        rows = ((float(priorities.randrange(10)), _scrapyd_sqlite_message(i)) for i in range(1, count + 1))
        connection.executemany("INSERT INTO spider_queue (priority, message) VALUES (?, ?)", rows)
        connection.commit()
    finally:
        connection.close()


def _scrapyd_sqlite_message(i: int) -> bytes:
    # Encoded as JsonSqlitePriorityQueue.encode does.
    message = {"name": f"spider{i % 13}", "_job": f"sqlite-{i}", "settings": {}, "category": "bench"}
    return sqlite3.Binary(json.dumps(message).encode("ascii"))


def vacuum(url: str, table: str = "spider_job") -> None:
    with admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(sql.SQL("VACUUM {}").format(sql.Identifier(table)))


def table_stats(url: str) -> dict:
    """Rows, dead tuples, vacuum counts and sizes of spider_job as the server reports them now."""
    table = "spider_job"
    with admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(TABLE_STATS, {"table": table})
        columns = [column.name for column in cursor.description]
        stats = dict(zip(columns, cursor.fetchone()))
        cursor.execute(INDEX_SIZES, {"table": table})
        stats["index_bytes"] = dict(cursor.fetchall())
        cursor.execute(STATUS_COUNTS)
        stats["rows_by_status"] = dict(cursor.fetchall())
        stats["rows"] = sum(stats["rows_by_status"].values())
    for key in ("last_autovacuum", "last_vacuum"):
        stats[key] = stats[key].isoformat() if stats[key] else None
    return stats


def server_description(url: str) -> dict:
    """Version and the settings that shape these figures, for the results' metadata."""
    with admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT version(), current_setting('server_version')")
        version, short_version = cursor.fetchone()
        settings = {}
        for name in SERVER_SETTINGS:
            cursor.execute("SELECT current_setting(%s)", (name,))
            settings[name] = cursor.fetchone()[0]
    return {"version": version, "server_version": short_version, "where": db.describe(url), "settings": settings}


def remove_scrapyd_environment() -> list[str]:
    """Drop variables that would point the benchmark's queues at another database or node name."""
    from scrapyd_pgqueue import config as pgconfig

    removed = []
    for name in (pgconfig.DATABASE_URL_VARIABLE, pgconfig.NODE_NAME_VARIABLE):
        if os.environ.pop(name, None) is not None:
            removed.append(name)
    return removed


# auto_explain, for the statements run inside a function (EXPLAIN shows a function call as one node): each plan is
# sent back to this client as a LOG message (client_min_messages), the outer statement's last.
NESTED_EXPLAIN = (
    "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on; "
    "SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; SET auto_explain.log_format = json; "
    "SET client_min_messages = log"
)


def explain_nested(connection, statement: str, params: dict) -> list[dict]:
    """Run ``statement`` (in the caller's transaction) and return the plan of each statement it ran, with timing
    and buffers, in order: the functions' statements, then the statement itself. Needs a superuser (LOAD)."""
    with connection.cursor() as cursor:
        cursor.execute(NESTED_EXPLAIN)
        del connection.notices[:]
        cursor.execute(statement, params)
        cursor.fetchall()
        cursor.execute("RESET client_min_messages")
    return [json.loads(notice[notice.index("plan:") + len("plan:"):]) for notice in connection.notices
            if "plan:" in notice]
