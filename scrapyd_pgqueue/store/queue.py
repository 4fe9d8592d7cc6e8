"""The queue itself: enqueue (its statement and rules in ``enqueue``), claim (due jobs, per-spider limits), waiting
jobs, notify; ``JobStore``, which also holds how jobs end (``finishing.JobEnds``) and the nodes' leases
(``nodes.NodeLeases``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable
from typing import Any, NamedTuple

from scrapyd_pgqueue.database import db, waits
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.job_rules.options import ERROR, NO_OPTIONS, JobOptions
from scrapyd_pgqueue.store import enqueue, frontier, staging, trees
from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL, ClaimedJob, Enqueued, StorePerEngine, database_errors
from scrapyd_pgqueue.store.finishing import JobEnds
from scrapyd_pgqueue.store.nodes import NodeLeases

# --- queries ---------------------------------------------------------------------------------------------------

# Claim the next :limit pending jobs of :projects (all when NULL) for this node, in one round trip: the database
# function claim_spider_jobs. Its SQL, and the reason for each of its steps, are in store/schema.sql. Its rows
# (ClaimRow): the jobs claimed, then a summary row (id NULL) unless the first statement filled every slot. A node
# without tags leaves out p_tags (its default: none), so its statement is the one every schema since 0006 answers.
CLAIM_NEXT_JOBS = """
    SELECT id, project, job, attempts, message, priority, waited, promoted, next_due_in
    FROM claim_spider_jobs(CAST(%(projects)s AS text[]), %(limit)s, %(node)s, %(worker)s, %(channel)s)
"""
# The same for a node with :tags: only the jobs whose required tags it all has (migration 0014).
CLAIM_NEXT_JOBS_WITH_TAGS = """
    SELECT id, project, job, attempts, message, priority, waited, promoted, next_due_in
    FROM claim_spider_jobs(CAST(%(projects)s AS text[]), %(limit)s, %(node)s, %(worker)s, %(channel)s,
                           CAST(%(tags)s AS text[]))
"""


class ClaimRow(NamedTuple):
    """A row of CLAIM_NEXT_JOBS, in its columns' order (the driver's plain tuples, named without a copy per field)."""

    id: int | None
    project: str | None
    job: str | None
    attempts: int | None
    message: dict[str, Any] | None
    priority: float | None
    waited: float | None
    promoted: int | None  # on the summary row: delayed jobs that became due
    next_due_in: float | None  # seconds until the next delayed job is due

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
# delayed by due time. Each part reads its own index in order (spider_job_pending_project_idx, each pool's range
# merged by priority; spider_job_delayed_project_idx) up to :limit, so the first hundred of a big backlog cost what a
# small one does.
LIST_PENDING = text("""
    SELECT id, message FROM (
        (SELECT 0 AS part, head.id, head.message, head.priority, NULL::timestamptz AS run_at
         FROM spider_job_pending_pools() AS pending(pool), LATERAL (
             SELECT id, message, priority FROM spider_job
             WHERE status = 'pending' AND pool = pending.pool AND project = :project
             ORDER BY priority DESC, id LIMIT :limit) AS head
         ORDER BY head.priority DESC, head.id LIMIT :limit)
        UNION ALL
        (SELECT 1, id, message, priority, run_at FROM spider_job
         WHERE status = 'delayed' AND project = :project ORDER BY run_at, id LIMIT :limit)
    ) AS waiting
    ORDER BY part, run_at, priority DESC, id
    LIMIT :limit
""")

# Delete waiting jobs by id; a job claimed meanwhile is left alone.
DELETE_PENDING = text("""
    DELETE FROM spider_job WHERE id = ANY(:ids) AND status IN ('delayed', 'pending') AND project = :project
""")

# Delete every waiting job of a project.
CLEAR_PENDING = text("DELETE FROM spider_job WHERE status IN ('delayed', 'pending') AND project = :project")

# --- operations ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim's jobs, how many delayed jobs it found due (pending now, and claimable by the same claim), and in how
    many seconds the next delayed job is due (None: none waits; 0 or less: more were due than one claim promotes)."""

    jobs: list[ClaimedJob]
    became_due: int
    next_due_in: float | None


class JobStore(StorePerEngine, NodeLeases, JobEnds):
    """The queue operations over one database."""

    def __init__(self, engine: Engine, tree_max_jobs: int = 0):
        self.engine = engine
        self.tree_max_jobs = tree_max_jobs  # the jobs a crawl tree may have; 0: no cap

    @classmethod
    def for_url(cls, url: str, tree_max_jobs: int = 0) -> JobStore:
        return cls.for_engine(db.get_engine(url), tree_max_jobs)

    @classmethod
    def for_settings(cls, settings) -> JobStore:
        """The store of a node, over an engine with the node's pool size and timeout."""
        return cls.for_engine(db.engine_for_settings(settings), settings.tree_max_jobs)

    @database_errors
    def notify(self, channel: str, payload: str) -> None:
        with db.autocommit(self.engine) as connection:
            connection.execute(NOTIFY, {"channel": channel, "payload": payload})

    @database_errors
    def enqueue(
        self, project: str, message: dict[str, Any], priority: float = 0.0, options: JobOptions = NO_OPTIONS
    ) -> Enqueued:
        """Add ``message`` (ISpiderQueue's message: spider arguments plus ``name``) as a job; say where it went."""
        return self._enqueue(project, enqueue.job_rows(project, [(message, priority, options)], numbered=False))[0]

    @database_errors
    def enqueue_many(
        self, project: str, jobs: Iterable[tuple[dict[str, Any], float] | tuple[dict[str, Any], float, JobOptions]]
    ) -> list[Enqueued]:
        """Add many (message, priority[, options]) jobs at once, all or none, in their order; say where each went.

        A unique key with ``on_conflict="error"`` held by a waiting job refuses the whole batch (DuplicateJobError).
        """
        return self._enqueue(project, enqueue.job_rows(project, jobs, numbered=True))

    @database_errors
    def enqueue_crawl(self, project: str, message: dict[str, Any], priority: float, options: JobOptions,
                      workers: int) -> list[Enqueued]:
        """One crawl of ``workers`` jobs sharing a frontier, all or none: the first job is the crawl (its id is the
        crawl's), the others its children, ``<job>-2`` to ``<job>-N``, so that the tree's completion, cancel and
        view are the crawl's."""
        first = enqueue.job_rows(project, [(message, priority, options)], numbered=False)
        with db.transaction(self.engine) as connection:
            [crawl] = self._store_rows(connection, project, first, StoreSteps.of(first))
            if crawl.existing:  # its unique key is a waiting crawl's: that crawl, unchanged
                return [crawl]
            child = dataclasses.replace(options, parent=crawl.job, unique_key=None, unique_scope="waiting",
                                        on_complete=None, on_complete_args=None)
            rows = enqueue.job_rows(project, [({**message, "_job": f"{crawl.job}-{n}"}, priority, child)
                                              for n in range(2, workers + 1)], numbered=True)
            jobs = [crawl, *(self._store_rows(connection, project, rows, StoreSteps.of(rows)) if rows else [])]
            connection.execute(frontier.JOIN_CRAWL, {"crawl": crawl.id, "ids": [job.id for job in jobs]})
        return jobs

    @database_errors
    def join_crawl(self, project: str, crawl: str, spider: str, workers: int, priority: float, options: JobOptions,
                   max_workers: int) -> list[Enqueued]:
        """``workers`` more workers for crawl ``crawl`` (its first job id), all or none: children of its first job
        running its spider with its arguments and settings, numbered after its last worker. InvalidJobError for an
        unknown crawl, another spider, past ``max_workers`` in all, or a crawl whose tree is done."""
        with db.transaction(self.engine) as connection:
            found = connection.execute(frontier.CRAWL_TO_JOIN, {"project": project, "job": crawl}).first()
            if found is None:
                raise InvalidJobError(f"crawl '{crawl}' not found in project '{project}'")
            if found.spider != spider:
                raise InvalidJobError(f"crawl '{crawl}' is a crawl of spider '{found.spider}', not '{spider}'")
            if found.workers + workers > max_workers:
                raise InvalidJobError(f"crawl '{crawl}' has {found.workers} workers and may have at most "
                                      f"{max_workers} (max_workers)")
            child = dataclasses.replace(options, parent=crawl, unique_key=None, unique_scope="waiting",
                                        on_complete=None, on_complete_args=None, workers=None, join=None)
            rows = enqueue.job_rows(project, [({**found.message, "_job": f"{crawl}-{n}"}, priority, child)
                                              for n in range(found.workers + 1, found.workers + workers + 1)],
                                    numbered=True)
            jobs = self._store_rows(connection, project, rows, StoreSteps.of(rows))
            connection.execute(frontier.JOIN_CRAWL, {"crawl": found.id, "ids": [job.id for job in jobs]})
        return jobs

    @database_errors
    def parents_outside_tree(self, project: str, parents: list[str], row_id: int) -> list[str]:
        """Which of ``parents`` (job ids of ``project``) are not in the tree of the row ``row_id``."""
        params = {"project": project, "parents": parents, "row_id": row_id}
        with db.autocommit(self.engine) as connection:
            return [row.job for row in connection.execute(trees.PARENTS_OUTSIDE_TREE, params)]

    def enqueue_batches(self, project: str, batches: Iterable[Collection], stored: Callable[[int], None]) -> int:
        """Add every batch of ``batches`` (collections of (message, priority[, options]), read as they come: a stream
        of any length; a batch's length bounds how many jobs it yields) in one transaction, all or none;
        ``stored(n)`` after each batch of n jobs. How many jobs.

        A process that can COPY checks each batch's jobs while the database stores the ones before them
        (``staging.stream_jobs``). An error of a batch (InvalidJobError, DuplicateJobError naming the job's index in
        its batch), or one raised by ``batches`` itself (a bad line), rolls every batch back. Not retried:
        ``batches`` is read once.
        """
        total = 0
        # The transaction lasts as long as the stream; each batch has the time of one operation.
        with db.operation(self.engine, math.inf), db.transaction(self.engine) as connection:
            for jobs in batches:
                with waits.deadline(self.engine.timeout):
                    if waits.copy_allowed():
                        count = len(self._copy_jobs(connection, project, jobs))
                    else:
                        rows = enqueue.job_rows(project, jobs, numbered=True)
                        count = len(self._store_rows(connection, project, rows, StoreSteps.of(rows))) if rows else 0
                total += count
                stored(count)
        return total

    @database_errors
    def enqueue_by_copy(self, project: str, jobs: Collection) -> list[Enqueued]:
        """``enqueue_many`` for a process that can COPY (``waits.copy_allowed``): each job is checked while the
        database stores the ones before it (``staging.stream_jobs``), in one transaction, all or none."""
        if not jobs:
            return []
        with db.transaction(self.engine) as connection:
            return self._copy_jobs(connection, project, jobs).enqueued()

    def _copy_jobs(self, connection, project: str, jobs: Collection) -> staging.StreamedBatch:
        """One batch of ``jobs`` by ``staging.stream_jobs`` in the caller's transaction; where each went."""
        streamed = staging.stream_jobs(
            connection, project, jobs, len(jobs),
            lambda rows, positions, ids: self._store_rows(connection, project, rows, StoreSteps.of(rows), positions,
                                                          ids))
        if streamed is None:
            raise db.too_late(self.engine, "no job was stored")
        return streamed

    def _enqueue(self, project: str, rows: list[dict[str, Any]]) -> list[Enqueued]:
        if not rows:
            return []
        steps = StoreSteps.of(rows)
        with (db.transaction if steps.in_trees or steps.refuses_existing else db.autocommit)(self.engine) as connection:
            return self._store_rows(connection, project, rows, steps)

    def _store_rows(self, connection, project: str, rows: list[dict[str, Any]], steps: StoreSteps,
                    positions: list[int] | None = None, ids: list[int] | None = None) -> list[Enqueued]:
        """Store ``rows`` on ``connection`` (in a transaction unless a single statement does it all), in one pass:
        placed in their trees, inserted (or staged), keys refused, trees started. ``positions`` and reserved ``ids``:
        a batch's jobs set aside by ``staging.stream_jobs``, at those places in its batch."""
        known = trees.place_in_trees(connection, project, rows, self.tree_max_jobs) if steps.in_trees else {}
        new = [index for index in range(len(rows)) if index not in known]
        new_rows = [rows[index] for index in new]
        if not new_rows:
            inserted = []
        elif ids is not None:
            inserted = staging.stage_jobs(connection, project, new_rows, [ids[index] for index in new])
        else:
            inserted = enqueue.insert_jobs(connection, project, new_rows)
        if new_rows and not inserted:
            raise db.too_late(self.engine, "no job was stored")
        if steps.refuses_existing:  # rolls the batch back
            enqueue.refuse_existing_keys(new_rows, inserted, None if positions is None else
                                         [positions[index] for index in new])
        if steps.in_trees:
            trees.start_trees(connection, new_rows, inserted)
        placed = iter(inserted)
        return [known[index] if index in known else next(placed) for index in range(len(rows))]

    @database_errors
    def claim_next_jobs(self, projects: Iterable[str] | None, limit: int, *, node: str, worker: str,
                        tags: Iterable[str] = ()) -> Claim:
        """Move up to ``limit`` of the best pending jobs that a node with ``tags`` may run to ``ongoing`` for this
        node, in claim order (``.jobs``); say too what the poller needs for its next claim: delayed jobs that became
        due, and when the next one will."""
        params = {"limit": max(limit, 0), "node": node, "worker": worker, "channel": NOTIFY_CHANNEL,
                  "projects": None if projects is None else list(projects), "tags": list(tags)}
        if params["projects"] == []:
            return Claim([], 0, None)
        # Without the SET LOCAL timeouts: the function sets its own lock_timeout, and each of its statements reads
        # a bounded head of an index (no statement_timeout needed; the caller's deadline bounds its wait).
        statement = CLAIM_NEXT_JOBS_WITH_TAGS if params["tags"] else CLAIM_NEXT_JOBS
        rows = [ClaimRow._make(row) for row in db.fetch_all(self.engine, statement, params, timeouts=False)]
        jobs = sorted((row for row in rows if row.id is not None), key=lambda row: (-row.priority, row.id))
        # The summary row (id NULL) comes last; a claim that filled its slots at once has none, and its rows carry
        # the next due time themselves (nothing became due).
        summary = rows[-1] if rows[-1].id is None else rows[0]._replace(promoted=0)
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



class StoreSteps(NamedTuple):
    """What a batch of rows needs besides its insert, asked once: trees (a parent, or a root that starts a tree) and
    the refusal of a unique key already held (checked after the insert, which the refusal rolls back). Either makes
    the store a transaction of several statements."""

    in_trees: bool
    refuses_existing: bool

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> StoreSteps:
        return cls(trees.needs_trees(rows), any(row["on_conflict"] == ERROR for row in rows if row["unique_key"]))


def notify_through_pool(settings):
    """``notify(channel, payload)`` through the node's pool."""
    return JobStore.for_settings(settings).notify
