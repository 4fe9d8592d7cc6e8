"""The delayed jobs (inserted, promoted, counted) and the claim paths timed on them."""

from __future__ import annotations

import uuid

from bench import database
from bench.suites.delayed.settings import PROJECTS

# Delayed jobs as the store's enqueue makes them (status 'delayed', run_at on the database's clock), spread over
# :projects, due :from_seconds to :from_seconds + :spread_seconds from now at random (or evenly when :even).
INSERT_DELAYED = """
    INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
    SELECT project, spider, job, floor(random() * 10),
           jsonb_build_object('name', spider, '_job', job, 'settings', jsonb_build_object(), 'category', 'bench'),
           'delayed',
           now() + make_interval(secs => %(from_seconds)s + %(spread_seconds)s *
                                 CASE WHEN %(even)s THEN (i - 1)::float8 / %(count)s ELSE random() END),
           localtimestamp
    FROM (
        SELECT i, (%(projects)s::text[])[1 + i %% cardinality(%(projects)s::text[])] AS project,
               'spider' || (i %% 13) AS spider,
               %(prefix)s || i AS job
        FROM generate_series(1, %(count)s) AS i
    ) AS generated
    RETURNING id
"""

# What became of a set of delayed jobs: how many were promoted (no longer delayed).
PROMOTED = "SELECT count(*) FILTER (WHERE status <> 'delayed'), count(*) FROM spider_job WHERE id = ANY(%(ids)s)"
DELETE_STILL_DELAYED = "DELETE FROM spider_job WHERE id = ANY(%(ids)s) AND status = 'delayed'"
COUNT_DELAYED = "SELECT count(*) FROM spider_job WHERE status = 'delayed'"


def claim_paths(url: str) -> dict:
    """``pop()`` of one project (Scrapyd's poller), ``claim_next_jobs`` of that project and of all five (ours)."""
    from scrapyd.config import Config

    from scrapyd_pgqueue import PostgresSpiderQueue
    from scrapyd_pgqueue.store import JobStore

    node = "bench-delayed"
    queue = PostgresSpiderQueue(Config(values={"database_url": url, "node_name": node}), PROJECTS[0])
    store = JobStore.for_url(url)
    worker = uuid.uuid4().hex

    def pop():
        return PROJECTS[0] if queue.pop() is not None else None

    def claim_of(projects):
        def claim():
            claimed = store.claim_next_jobs(list(projects), 1, node=node, worker=worker).jobs
            return claimed[0].project if claimed else None

        return claim

    return {
        "pgqueue_pop": pop,
        "claim_next_jobs_project": claim_of(PROJECTS[:1]),
        "claim_next_jobs_projects": claim_of(PROJECTS),
    }


def _delayed_params(count: int, prefix: str, from_seconds: float, spread_seconds: float, even: bool,
                    projects=PROJECTS) -> dict:
    return {"projects": list(projects), "prefix": prefix, "count": count, "from_seconds": from_seconds,
            "spread_seconds": spread_seconds, "even": even}


def _without_returning(statement: str) -> str:
    return statement.replace("RETURNING id", "")


def insert_delayed(url: str, count: int, projects, prefix: str, from_seconds: float, spread_seconds: float,
                   even: bool) -> list[int]:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(INSERT_DELAYED, _delayed_params(count, prefix, from_seconds, spread_seconds, even, projects))
        return [row[0] for row in cursor.fetchall()]


def promoted(url: str, ids: list[int]) -> dict:
    """How many of ``ids`` the claims promoted; the rest (not yet due) are deleted so that the next path starts
    clean."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(PROMOTED, {"ids": ids})
        count, total = cursor.fetchone()
        cursor.execute(DELETE_STILL_DELAYED, {"ids": ids})
    return {"promoted": count, "inserted": total}


def _checkpoint(cursor) -> bool:
    """Write out the fill's dirty pages now (best effort: CHECKPOINT needs superuser or pg_checkpoint), so that a
    checkpoint triggered by the fill's WAL does not land on the measurement that follows it (a suspect, not proven:
    one run without it measured 'delayed' about 2x slower than 'delayed_due' right after, on the same table)."""
    import psycopg2

    try:
        cursor.execute("CHECKPOINT")
    except psycopg2.Error:
        return False
    return True


def _count_delayed(url: str) -> int:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(COUNT_DELAYED)
        return cursor.fetchone()[0]
