"""The cluster at a glance, for the dashboard and /metrics: queue depth per spider, throughput, ages, node URLs.

Every query is bounded whatever the backlog (a million pending jobs): counts stop at ``COUNT_CAP`` rows, distinct
spiders come from an index skip scan, and finished jobs are the kept ones (pruned to ``finished_to_keep``). The
nodes and the newest failures come from ``AllJobsStore`` (``nodes``, ``troubled_jobs``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import StorePerEngine, database_errors, local_time

# Jobs counted exactly per spider and state; beyond, the count is shown as "at least" (COUNT_CAP+).
COUNT_CAP = 10_000
# Spiders (project, spider pairs) with pending jobs listed at most.
MAX_SPIDERS = 200


@dataclass
class SpiderDepth:
    """Jobs of one spider by state (pending, delayed, running, and outcomes of the kept finished jobs)."""

    project: str
    spider: str
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SpiderItems:
    """Items one spider scraped over the time its jobs ran (kept finished jobs and running ones)."""

    project: str
    spider: str
    jobs: int
    items: int
    seconds: float

    @property
    def per_minute(self) -> float:
        return self.items * 60 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class MinuteCount:
    minute: datetime.datetime
    outcome: str
    jobs: int


# Distinct (project, spider) pairs of pending jobs by a skip scan of spider_job_pending_spider_idx (one index probe
# per pair, not a pass over the backlog), each with its pending jobs counted up to :cap.
PENDING_BY_SPIDER = text("""
    WITH RECURSIVE pairs AS (
        (SELECT project, spider FROM spider_job WHERE status = 'pending' ORDER BY project, spider LIMIT 1)
        UNION ALL
        SELECT following.project, following.spider FROM pairs, LATERAL (
            SELECT project, spider FROM spider_job
            WHERE status = 'pending' AND (project, spider) > (pairs.project, pairs.spider)
            ORDER BY project, spider LIMIT 1
        ) AS following
    )
    SELECT p.project, p.spider, 'pending' AS state,
           (SELECT count(*) FROM (
               SELECT 1 FROM spider_job AS j
               WHERE j.status = 'pending' AND j.project = p.project AND j.spider = p.spider LIMIT :cap
           ) AS capped) AS jobs
    FROM (SELECT project, spider FROM pairs LIMIT :spiders) AS p
""")

# Delayed jobs per spider among the first :cap (spider_job_delayed_idx): waiting rows are bounded by the cap.
DELAYED_BY_SPIDER = text("""
    SELECT project, spider, 'delayed' AS state, count(*) AS jobs
    FROM (SELECT project, spider FROM spider_job WHERE status = 'delayed' ORDER BY run_at LIMIT :cap) AS capped
    GROUP BY project, spider
""")

# Running jobs per spider: bounded by the cluster's process slots.
RUNNING_BY_SPIDER = text("""
    SELECT project, spider, 'running' AS state, count(*) AS jobs FROM spider_job
    WHERE status = 'ongoing' GROUP BY project, spider
""")

# Kept finished jobs per spider and outcome (the newest :cap; terminated rows are pruned to finished_to_keep).
OUTCOMES_BY_SPIDER = text("""
    SELECT project, spider, outcome AS state, count(*) AS jobs FROM (
        SELECT project, spider, outcome FROM spider_job
        WHERE status = 'terminated' ORDER BY end_time DESC LIMIT :cap
    ) AS kept
    GROUP BY project, spider, outcome
""")

# Items each spider scraped over the minutes its jobs ran: the kept finished jobs (the newest :cap, by
# spider_job_terminated_idx) and the running ones (to now), those that reported stats; :spiders spiders at most. A
# count that is not a number (the crawl writes its own stats) counts as none.
ITEMS_BY_SPIDER = text("""
    SELECT project, spider, count(*) AS jobs,
           sum(CASE WHEN jsonb_typeof(stats->'item_scraped_count') = 'number'
                    THEN CAST(stats->>'item_scraped_count' AS numeric) ELSE 0 END) AS items,
           CAST(sum(extract(epoch FROM coalesce(end_time, now()) - start_time)) AS double precision) AS seconds
    FROM (
        (SELECT project, spider, start_time, end_time, stats FROM spider_job
         WHERE status = 'terminated' ORDER BY end_time DESC LIMIT :cap)
        UNION ALL
        (SELECT project, spider, start_time, NULL, stats FROM spider_job WHERE status = 'ongoing')
    ) AS j
    WHERE stats IS NOT NULL AND start_time IS NOT NULL
    GROUP BY project, spider ORDER BY project, spider
    LIMIT :spiders
""")

# Whether any job is delayed (spider_job_delayed_idx): the delayed column shows only then.
ANY_DELAYED = text("SELECT EXISTS (SELECT 1 FROM spider_job WHERE status = 'delayed')")

# Kept finished jobs per minute and outcome since :since (spider_job_terminated_idx), and the oldest kept end time:
# the charts cover what the table keeps.
PER_MINUTE = text("""
    SELECT date_trunc('minute', end_time) AS minute, outcome, count(*) AS jobs FROM spider_job
    WHERE status = 'terminated' AND end_time >= :since
    GROUP BY 1, 2 ORDER BY 1
""")
OLDEST_KEPT = text("SELECT min(end_time) FROM spider_job WHERE status = 'terminated'")

# Seconds the longest-waiting pending job has waited since it was due (database clock): the head of
# spider_job_pending_due_idx, whatever the backlog.
OLDEST_PENDING_AGE = text("""
    SELECT CAST(extract(epoch FROM now() - min(run_at)) AS double precision) FROM spider_job WHERE status = 'pending'
""")

# Live node processes' URLs by node name, the newest process per name: where a job's log link leads.
NODE_URLS = text("""
    SELECT DISTINCT ON (name) name, url FROM scrapyd_node WHERE stopped_time IS NULL ORDER BY name, started_time DESC
""")

# Nodes the queue wants, max_proc slots each, at most max_nodes (scrapyd_pgqueue_wanted_nodes, migrations 0008 and
# 0022): what an autoscaler asks, bounded whatever the backlog.
WANTED_NODES = text("SELECT scrapyd_pgqueue_wanted_nodes(:slots, :max_nodes)")


class OverviewStore(StorePerEngine):
    """Read-only views of the whole cluster, each bounded whatever the backlog."""

    @database_errors
    def depth_by_spider(self) -> list[SpiderDepth]:
        """Jobs per spider by state, each count capped at COUNT_CAP, ordered by project and spider."""
        depths: dict[tuple[str, str], SpiderDepth] = {}
        params = {"cap": COUNT_CAP, "spiders": MAX_SPIDERS}
        with db.autocommit(self.engine) as connection:
            queries = [PENDING_BY_SPIDER, RUNNING_BY_SPIDER, OUTCOMES_BY_SPIDER]
            if connection.execute(ANY_DELAYED).scalar():
                queries.append(DELAYED_BY_SPIDER)
            for query in queries:
                for row in connection.execute(query, params):
                    depth = depths.setdefault((row.project, row.spider), SpiderDepth(row.project, row.spider))
                    depth.counts[row.state] = row.jobs
        return [depths[key] for key in sorted(depths)]

    @database_errors
    def per_minute(self, since: datetime.datetime) -> tuple[list[MinuteCount], datetime.datetime | None]:
        """Kept finished jobs per minute and outcome since ``since``, and the oldest kept job's end time (this node's
        naive local times, as the dashboard shows them)."""
        with db.autocommit(self.engine) as connection:
            params = {"since": since.astimezone()}  # naive: this node's local time
            rows = [MinuteCount(local_time(row.minute), row.outcome, row.jobs)
                    for row in connection.execute(PER_MINUTE, params)]
            return rows, local_time(connection.execute(OLDEST_KEPT).scalar())

    @database_errors
    def items_by_spider(self) -> list[SpiderItems]:
        """Items per spider over the minutes its kept finished and running jobs ran (ITEMS_BY_SPIDER)."""
        with db.autocommit(self.engine) as connection:
            rows = connection.execute(ITEMS_BY_SPIDER, {"cap": COUNT_CAP, "spiders": MAX_SPIDERS})
            return [SpiderItems(row.project, row.spider, row.jobs, int(row.items), row.seconds or 0.0)
                    for row in rows]

    @database_errors
    def oldest_pending_age(self) -> float | None:
        """Seconds the longest-waiting pending job has waited since it was due; None: none waits."""
        with db.autocommit(self.engine) as connection:
            return connection.execute(OLDEST_PENDING_AGE).scalar()

    @database_errors
    def node_urls(self) -> dict[str, str | None]:
        with db.autocommit(self.engine) as connection:
            return {row.name: row.url for row in connection.execute(NODE_URLS)}

    @database_errors
    def wanted_nodes(self, slots_per_node: int, max_nodes: int) -> int:
        """Nodes of ``slots_per_node`` slots the work the queue has now needs, at most ``max_nodes``: 0 when idle."""
        with db.autocommit(self.engine) as connection:
            return connection.execute(WANTED_NODES, {"slots": slots_per_node, "max_nodes": max_nodes}).scalar()
