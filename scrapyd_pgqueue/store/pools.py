"""Node pools: the tags a node has and a job requires, routes per spider, and the work no live node can run.

A job's required tags are stored as its pool: the tags sorted, deduplicated and joined by commas ('' when it
requires none). The pool leads the pending indexes, so a claim reads each pool's head as an index range of its own;
a node claims from the pools whose tags it all has (the claim function, store/schema.sql).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.job_rules.checks import check_name
from scrapyd_pgqueue.store.base import StorePerEngine, database_errors
from scrapyd_pgqueue.tags import pool_key, pool_tags

# --- queries ---------------------------------------------------------------------------------------------------

# Route a spider's jobs scheduled without _tags to a pool (one row per spider; setting it again replaces it).
SET_ROUTE = text("""
    INSERT INTO spider_route (project, spider, pool) VALUES (:project, :spider, :pool)
    ON CONFLICT (project, spider) DO UPDATE SET pool = EXCLUDED.pool, created_time = now()
""")

REMOVE_ROUTE = text("DELETE FROM spider_route WHERE project = :project AND spider = :spider")

# Every route (of :project, all when NULL); a handful per project.
LIST_ROUTES = text("""
    SELECT project, spider, pool FROM spider_route
    WHERE CAST(:project AS text) IS NULL OR project = :project
    ORDER BY project, spider
""")

# The pending pools that no live node can run, each with its pending jobs counted up to :cap
# (spider_job_unroutable_pools: one probe of spider_job_pending_idx per pending pool).
UNROUTABLE_POOLS = text("SELECT pool, jobs FROM spider_job_unroutable_pools(:lease_seconds, :cap) ORDER BY pool")

# The tags the newest row of job id :job (in :project, all projects when NULL) requires; reads spider_job_job_idx.
JOB_POOL = text("""
    SELECT pool FROM spider_job
    WHERE job = :job AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY id DESC
    LIMIT 1
""")

# --- operations ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    project: str
    spider: str
    tags: list[str]


@dataclass(frozen=True)
class UnroutablePool:
    tags: list[str]
    jobs: int  # pending jobs requiring these tags, counted up to the caller's cap


class PoolStore(StorePerEngine):
    """Routes and unroutable work over one database."""

    @database_errors
    def set_route(self, project: str, spider: str, tags: Iterable[str]) -> None:
        params = {"project": check_name("project", project), "spider": check_name("spider name", spider),
                  "pool": pool_key(tags)}
        with db.autocommit(self.engine) as connection:
            connection.execute(SET_ROUTE, params)

    @database_errors
    def remove_route(self, project: str, spider: str) -> bool:
        with db.autocommit(self.engine) as connection:
            return connection.execute(REMOVE_ROUTE, {"project": project, "spider": spider}).rowcount > 0

    @database_errors
    def routes(self, project: str | None = None) -> list[Route]:
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(LIST_ROUTES, {"project": project})
            return [Route(row.project, row.spider, pool_tags(row.pool)) for row in rows]

    @database_errors
    def required_tags(self, job: str, project: str | None = None) -> list[str] | None:
        """The tags the newest run of ``job`` requires; None when unknown."""
        with db.autocommit(self.engine) as connection:
            pool = connection.execute(JOB_POOL, {"job": job, "project": project}).scalar()
        return None if pool is None else pool_tags(pool)

    @database_errors
    def unroutable(self, lease_seconds: float, cap: int) -> list[UnroutablePool]:
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(UNROUTABLE_POOLS, {"lease_seconds": lease_seconds, "cap": cap})
            return [UnroutablePool(pool_tags(row.pool), row.jobs) for row in rows]
