"""Crawl trees: jobs scheduled by jobs (placed in their parent's tree, keys unique in a tree), the tree's view and
its cancel; ``TreeQueries``, part of ``cluster.AllJobsStore``, and the enqueue steps ``queue.JobStore`` runs.

A tree's open-job count is kept by triggers (migration 0005) in the same transaction as every insert and final
state; this module only opens trees and reads them.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scrapyd_pgqueue.database import clock, db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.store.base import CANCEL_CHANNEL, Enqueued, JobRow, database_errors

# --- queries ---------------------------------------------------------------------------------------------------

# The newest row of each parent job id of :project, with its tree (its own id for a root). Reads
# spider_job_live_job_key or spider_job_job_idx.
PARENTS = text("""
    SELECT DISTINCT ON (job) job, id, coalesce(tree_id, id) AS tree_id
    FROM spider_job WHERE project = :project AND job = ANY(:parents)
    ORDER BY job, id DESC
""")

# Of the parent job ids of :project a crawl names (their newest rows), those outside the tree of the crawl's own row
# :row_id: a crawl schedules into its own tree only. Unknown parents are left to PARENTS ("not found").
PARENTS_OUTSIDE_TREE = text("""
    SELECT parent.job FROM (
        SELECT DISTINCT ON (job) job, coalesce(tree_id, id) AS tree_id
        FROM spider_job WHERE project = :project AND job = ANY(:parents)
        ORDER BY job, id DESC
    ) AS parent
    WHERE parent.tree_id IS DISTINCT FROM (SELECT coalesce(tree_id, id) FROM spider_job WHERE id = :row_id)
""")

# Open the trees of roots getting their first child: the root joins its own tree (its row lock serialises two first
# children scheduled at once: the second finds tree_id set and opens nothing) and counts as open until its own crawl
# ends. The children's inserts then count themselves (trigger).
OPEN_TREES = text("""
    WITH roots AS (
        UPDATE spider_job SET tree_id = id
        WHERE id = ANY(:root_ids) AND tree_id IS NULL
        RETURNING id, project, job, status
    )
    INSERT INTO spider_tree (root_id, project, root_job, open_jobs, total)
    SELECT id, project, job, CASE WHEN status = 'terminated' THEN 0 ELSE 1 END, 1 FROM roots
    ON CONFLICT (root_id) DO NOTHING
""")

# Open the trees of new roots with an _on_complete or a tree-scoped key: open, with the root alone.
START_TREES = text("""
    WITH roots AS (
        UPDATE spider_job AS j SET tree_id = j.id
        FROM unnest(CAST(:ids AS bigint[])) AS r(id)
        WHERE j.id = r.id
        RETURNING j.id, j.project, j.job
    )
    INSERT INTO spider_tree (root_id, project, root_job, open_jobs, total, on_complete)
    SELECT roots.id, roots.project, roots.job, 1, 1, c.on_complete
    FROM roots JOIN unnest(CAST(:ids AS bigint[]), CAST(:on_completes AS jsonb[])) AS c(id, on_complete)
         ON c.id = roots.id
    ON CONFLICT (root_id) DO UPDATE SET on_complete = EXCLUDED.on_complete
""")

# The job counts and completion of :tree_ids, their rows locked until the enqueue commits (in one order: no deadlock
# between two batches of several trees), so that two batches scheduled at once into a full tree cannot both pass its
# cap, and a tree's last job ending at the same time either completes the tree before (this reads it done) or after
# the children are counted (it finds them open); the insert's trigger takes the same lock anyway. NO KEY UPDATE, as
# the trigger's update: FOR UPDATE would wait for the key share that another batch's tree keys hold on the row
# (their foreign key), while it waits for ours: a deadlock.
LOCK_TREES = text("""
    SELECT root_id, root_job, total, done_time, completion_job FROM spider_tree WHERE root_id = ANY(:tree_ids)
    ORDER BY root_id
    FOR NO KEY UPDATE
""")

# Which of :tree_ids were cancelled (cancel.json _tree=1): their new children are cancelled at once.
CANCELLED_TREES = text("SELECT root_id FROM spider_tree WHERE root_id = ANY(:tree_ids) AND cancelled")

# Take each (tree, key) for its job, or find the job that took it first (a no-op update, so that RETURNING gives
# the existing row even when another transaction committed it after this statement's snapshot).
CLAIM_TREE_KEYS = text("""
    INSERT INTO spider_tree_key AS k (tree_id, unique_key, job)
    SELECT * FROM unnest(CAST(:tree_ids AS bigint[]), CAST(:keys AS text[]), CAST(:jobs AS text[]))
    ON CONFLICT (tree_id, unique_key) DO UPDATE SET job = k.job
    RETURNING tree_id, unique_key, job, xmax <> 0 AS existing
""")

# Cancel children just scheduled into a cancelled tree: nothing of it may wait or run again. Their webhooks' events
# (ended) are written with them (trigger spider_job_ended).
CANCEL_NEW_CHILDREN = text("""
    UPDATE spider_job
    SET status = 'terminated', outcome = 'cancelled', reason = 'its tree was cancelled', cancel_requested = true,
        end_time = now()
    WHERE id = ANY(:ids) AND status IN ('delayed', 'pending')
""")

# The newest row of job :job (of :project, any when NULL), its parent and its tree's root.
LINEAGE = text("""
    SELECT j.id, j.project, j.job, j.parent, coalesce(j.tree_id, j.id) AS tree_id,
           coalesce(t.root_job, j.job) AS root
    FROM spider_job AS j LEFT JOIN spider_tree AS t ON t.root_id = j.tree_id
    WHERE j.job = :job AND (CAST(:project AS text) IS NULL OR j.project = :project)
    ORDER BY j.id DESC
    LIMIT 1
""")

# A tree's kept jobs by state and outcome, and its times (spider_job_tree_idx; the root alone has no tree row).
TREE_JOBS = text("""
    SELECT status, outcome, count(*) AS jobs, min(created_time) AS created, min(start_time) AS started,
           max(end_time) AS ended
    FROM spider_job WHERE tree_id = :tree_id OR id = :tree_id
    GROUP BY status, outcome
""")

# The tree's own row: exact open and total counts, completion.
TREE = text("SELECT * FROM spider_tree WHERE root_id = :tree_id")

# The newest jobs of a tree that did not end well.
TREE_FAILURES = text("""
    SELECT id, project, spider, job, status, outcome, exit_code, reason, node, pid, attempts, priority, version,
           start_time, end_time
    FROM spider_job
    WHERE (tree_id = :tree_id OR id = :tree_id)
      AND outcome IN ('failed', 'lost', 'interrupted', 'dead', 'timeout', 'stalled')
    ORDER BY end_time DESC, id DESC
    LIMIT :limit
""")

# The tree's row, locked until the cancel commits, before CANCEL_TREE takes its snapshot: a batch of children being
# scheduled into the tree holds this lock (LOCK_TREES) until it commits, so CANCEL_TREE sees its children waiting;
# a batch that comes after waits for the cancel and then finds the tree cancelled (CANCELLED_TREES).
LOCK_TREE_FOR_CANCEL = text("SELECT root_id FROM spider_tree WHERE root_id = :tree_id FOR NO KEY UPDATE")

# Cancel a whole tree: mark it (children scheduled later are cancelled as they come), cancel its waiting jobs, and
# ask the nodes running its running jobs to signal them (one request each, NOTIFY as cancel.json does). Only while
# the caller still waits for the answer (in_time), as one job's. The waiting jobs' webhooks' events (ended) are
# written with them (trigger spider_job_ended).
CANCEL_TREE = text("""
    WITH in_time AS MATERIALIZED (SELECT clock_timestamp() < to_timestamp(:answer_by) AS ok), tree AS (
        UPDATE spider_tree SET cancelled = true WHERE root_id = :tree_id AND (SELECT ok FROM in_time)
        RETURNING root_id
    ), waiting AS (
        UPDATE spider_job
        SET status = 'terminated', outcome = 'cancelled', reason = 'its tree was cancelled', cancel_requested = true,
            end_time = now()
        WHERE (tree_id = :tree_id OR id = :tree_id) AND status IN ('delayed', 'pending') AND (SELECT ok FROM in_time)
        RETURNING id
    ), running AS (
        UPDATE spider_job
        SET cancel_requested = true, cancel_requests = cancel_requests + 1, cancel_signal = :signal
        WHERE (tree_id = :tree_id OR id = :tree_id) AND status = 'ongoing' AND (SELECT ok FROM in_time)
        RETURNING id, project, job, worker, cancel_requests, cancel_signal
    ), notified AS (
        SELECT pg_notify(:channel, CAST(json_build_object(
            'id', id, 'project', project, 'job', job, 'worker', worker, 'requests', cancel_requests,
            'signal', cancel_signal) AS text))
        FROM running
    )
    SELECT (SELECT count(*) FROM waiting) AS cancelled, (SELECT count(*) FROM running) AS signalled,
           (SELECT count(*) FROM notified) AS notified, (SELECT count(*) FROM tree) AS trees,
           (SELECT ok FROM in_time) AS in_time
""")

# The second half of a tree's cancel, in a statement of its own: a job a node claimed while CANCEL_TREE ran was
# pending in that statement's snapshot and ongoing once its row lock was released, so neither part saw it running.
# A new snapshot does; only jobs not asked yet. Not bound by the answer's time: it completes a cancel made in time.
SIGNAL_MISSED = text("""
    WITH running AS (
        UPDATE spider_job
        SET cancel_requested = true, cancel_requests = cancel_requests + 1, cancel_signal = :signal
        WHERE (tree_id = :tree_id OR id = :tree_id) AND status = 'ongoing' AND NOT cancel_requested
        RETURNING id, project, job, worker, cancel_requests, cancel_signal
    )
    SELECT count(pg_notify(:channel, CAST(json_build_object(
        'id', id, 'project', project, 'job', job, 'worker', worker, 'requests', cancel_requests,
        'signal', cancel_signal) AS text))) AS signalled
    FROM running
""")

# --- the enqueue's steps ---------------------------------------------------------------------------------------


def needs_trees(rows: list[dict[str, Any]]) -> bool:
    return any(row["parent"] is not None or _starts_tree(row) for row in rows)


def _starts_tree(row: dict[str, Any]) -> bool:
    """A root whose tree opens with it: it has an _on_complete, or a key in the tree it starts."""
    return row["parent"] is None and (row["on_complete"] is not None or row["tree_key"] is not None)


def place_in_trees(connection, project: str, rows: list[dict[str, Any]], max_jobs: int = 0) -> dict[int, Enqueued]:
    """Give each row with a parent its parent's row and tree (opening the tree on a root's first child), and take
    its tree-scoped key. Rows whose key the tree already had are not to be inserted: returned by index with the
    job that has the key. InvalidJobError when a new job's tree is done, or when the new jobs would take a tree past
    ``max_jobs`` (0: no cap)."""
    parents = sorted({row["parent"] for row in rows if row["parent"] is not None})
    if not parents:
        return {}
    found = {r.job: r for r in connection.execute(PARENTS, {"project": project, "parents": parents})}
    missing = [parent for parent in parents if parent not in found]
    if missing:
        raise InvalidJobError(f"parent job '{missing[0]}' not found in project '{project}'")
    roots = sorted({r.tree_id for r in found.values() if r.tree_id == r.id})
    if roots:
        connection.execute(OPEN_TREES, {"root_ids": roots})
    for row in rows:
        if row["parent"] is not None:
            row["parent_id"], row["tree_id"] = found[row["parent"]].id, found[row["parent"]].tree_id
    known = _take_tree_keys(connection, rows)
    _refuse_done_or_full(connection, [row for i, row in enumerate(rows) if i not in known], max_jobs)
    return known


def _refuse_done_or_full(connection, new_rows: list[dict[str, Any]], max_jobs: int) -> None:
    """InvalidJobError naming the first tree that is done (a done tree stays done: its _on_complete ran, or has
    nothing to run) or that ``new_rows`` (the children to insert) would take past ``max_jobs`` jobs (every job it
    ever had, pruned ones included; 0: no cap); the caller's transaction rolls back."""
    adding: dict[int, int] = {}
    for row in new_rows:
        if row["tree_id"] is not None:
            adding[row["tree_id"]] = adding.get(row["tree_id"], 0) + 1
    if not adding:
        return
    for tree in connection.execute(LOCK_TREES, {"tree_ids": sorted(adding)}):
        if tree.done_time is not None:
            completion = f", its _on_complete job '{tree.completion_job}' enqueued" if tree.completion_job else ""
            raise InvalidJobError(
                f"the tree of root job '{tree.root_job}' is done (its last job ended{completion}) and takes no new "
                f"job: {adding[tree.root_id]} refused; schedule without a parent to run outside any tree"
            )
        if 0 < max_jobs < tree.total + adding[tree.root_id]:
            room = max(max_jobs - tree.total, 0)
            raise InvalidJobError(
                f"the tree of root job '{tree.root_job}' has {tree.total} jobs and may have at most {max_jobs} "
                f"(tree_max_jobs): {adding[tree.root_id]} more refused ({room} would fit)"
            )


def _take_tree_keys(connection, rows: list[dict[str, Any]]) -> dict[int, Enqueued]:
    keyed = [(i, row) for i, row in enumerate(rows) if row["tree_key"] is not None and row["parent"] is not None]
    if not keyed:
        return {}
    first: dict[tuple[int, str], int] = {}
    for index, row in keyed:
        first.setdefault((row["tree_id"], row["tree_key"]), index)
    params = {
        "tree_ids": [tree_id for tree_id, _ in first],
        "keys": [key for _, key in first],
        "jobs": [rows[index]["job"] for index in first.values()],
    }
    taken = {(r.tree_id, r.unique_key): r for r in connection.execute(CLAIM_TREE_KEYS, params)}
    existing = {}
    for index, row in keyed:
        key = (row["tree_id"], row["tree_key"])
        if taken[key].existing or first[key] != index:
            existing[index] = Enqueued(0, taken[key].job, existing=True)
    return existing


def start_trees(connection, rows: list[dict[str, Any]], enqueued: list[Enqueued]) -> None:
    """Open the trees of new roots with an _on_complete or a tree-scoped key (the root takes the key in its own
    tree: a descendant scheduling it gets the root's job id), and cancel children that joined a cancelled tree."""
    roots = [(result.id, row) for row, result in zip(rows, enqueued) if _starts_tree(row) and not result.existing]
    if roots:
        connection.execute(START_TREES, {
            "ids": [job_id for job_id, _ in roots],
            "on_completes": [None if row["on_complete"] is None else
                             json.dumps({"spider": row["on_complete"], "args": row["on_complete_args"] or {}})
                             for _, row in roots],
        })
        keyed = [(job_id, row) for job_id, row in roots if row["tree_key"] is not None]
        if keyed:
            connection.execute(CLAIM_TREE_KEYS, {
                "tree_ids": [job_id for job_id, _ in keyed],
                "keys": [row["tree_key"] for _, row in keyed],
                "jobs": [row["job"] for _, row in keyed],
            })
    tree_ids = sorted({row["tree_id"] for row in rows if row.get("tree_id") is not None})
    if tree_ids:
        cancelled = set(connection.execute(CANCELLED_TREES, {"tree_ids": tree_ids}).scalars())
        ids = [result.id for row, result in zip(rows, enqueued) if row.get("tree_id") in cancelled]
        if ids:
            connection.execute(CANCEL_NEW_CHILDREN, {"ids": ids})


# --- the tree's view and cancel --------------------------------------------------------------------------------


class Lineage(NamedTuple):
    """Where a job stands in its tree: its parent (None for a root) and its tree's root (a root is its own)."""

    parent: str | None
    root: str


@dataclass(frozen=True)
class TreeView:
    """A tree at a glance (tree.json, ``scrapyd-pgqueue tree``)."""

    root: str
    project: str
    total: int  # every job ever in the tree (pruned ones included)
    open: int  # waiting, running or due for a retry
    done: bool
    by_state: dict[str, int]  # of the kept jobs: pending (delayed included), running, finished
    by_outcome: dict[str, int]  # of the kept finished jobs
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None  # when it was done
    completion_job: str | None
    cancelled: bool
    failures: list[JobRow] = field(default_factory=list)


SCRAPYD_STATES = {"delayed": "pending", "pending": "pending", "ongoing": "running", "terminated": "finished"}


class TreeQueries:
    """Crawl trees over one database (part of ``AllJobsStore``)."""

    engine: Engine

    @database_errors
    def lineage(self, job: str, project: str | None = None) -> Lineage | None:
        """The parent and root of the newest run of ``job``; None when unknown."""
        with db.autocommit(self.engine) as connection:
            row = connection.execute(LINEAGE, {"job": job, "project": project}).first()
        return None if row is None else Lineage(row.parent, row.root)

    @database_errors
    def tree(self, project: str, job: str, failures: int = 10) -> TreeView | None:
        """The tree of which ``job`` is the root (or any job of it)."""
        with db.autocommit(self.engine) as connection:
            found = connection.execute(LINEAGE, {"job": job, "project": project}).first()
            if found is None:
                return None
            params = {"tree_id": found.tree_id, "limit": failures}
            tree = connection.execute(TREE, params).first()
            groups = connection.execute(TREE_JOBS, params).all()
            failed = [JobRow(**row._asdict()) for row in connection.execute(TREE_FAILURES, params)]
        by_state, by_outcome = {}, {}
        for group in groups:
            state = SCRAPYD_STATES[group.status]
            by_state[state] = by_state.get(state, 0) + group.jobs
            if group.outcome is not None:
                by_outcome[group.outcome] = by_outcome.get(group.outcome, 0) + group.jobs
        open_jobs = tree.open_jobs if tree else by_state.get("pending", 0) + by_state.get("running", 0)
        started = min((g.started or g.created for g in groups if g.started or g.created), default=None)
        ended = tree.done_time if tree else max((g.ended for g in groups if g.ended), default=None)
        return TreeView(
            root=found.root, project=found.project, total=tree.total if tree else sum(by_state.values()),
            open=open_jobs, done=open_jobs == 0, by_state=by_state, by_outcome=by_outcome,
            start_time=started, end_time=ended if open_jobs == 0 else None,
            completion_job=tree.completion_job if tree else None, cancelled=bool(tree and tree.cancelled),
            failures=failed,
        )

    @database_errors
    def cancel_tree(self, project: str, root: str, signal: str = "INT") -> dict[str, int] | None:
        """Cancel every waiting job of the tree of ``root`` and signal its running ones; None when unknown."""
        with db.transaction(self.engine) as connection:
            found = connection.execute(LINEAGE, {"job": root, "project": project}).first()
            if found is None:
                return None
            params = {"tree_id": found.tree_id, "signal": signal, "channel": CANCEL_CHANNEL,
                      "answer_by": clock.answer_by()}
            connection.execute(LOCK_TREE_FOR_CANCEL, params)
            row = connection.execute(CANCEL_TREE, params).one()
            if not row.in_time:
                raise db.too_late(self.engine, "nothing was cancelled")
            missed = connection.execute(SIGNAL_MISSED, params).scalar_one()
        return {"cancelled": row.cancelled, "signalled": row.signalled + missed}
