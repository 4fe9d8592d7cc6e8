"""The nodes' side of the queue: registration, heartbeat, stop, recovery of expired leases, hand-back and
forgotten claims. ``NodeLeases`` holds their operations; ``queue.JobStore`` inherits them.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from scrapyd_pgqueue.database import clock, db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import DriverError, text
from scrapyd_pgqueue.store.all_jobs import CancelRequest
from scrapyd_pgqueue.store.base import (
    NOTIFY_CHANNEL,
    ClaimedJob,
    database_errors,
    on_database_clock,
)


@dataclass(frozen=True)
class ReleasedJob:
    """A running job taken from its node: back to ``pending``, or ``terminated`` once out of attempts."""

    id: int
    project: str
    job: str
    status: str


# --- queries ---------------------------------------------------------------------------------------------------

# Register this Scrapyd process (or refresh it after a reconnect) with its tags; its heartbeat starts now.
REGISTER_NODE = text("""
    INSERT INTO scrapyd_node (id, name, url, max_proc, tags) VALUES (:worker, :name, :url, :max_proc, :tags)
    ON CONFLICT (id) DO UPDATE SET heartbeat_time = now(), stopped_time = NULL, tags = EXCLUDED.tags
    RETURNING CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS database_clock
""")

# Renew this process's lease on the jobs it runs (database clock: nodes' clocks may disagree).
# Returns the database's clock, from which the node learns how far its own clock is off (see clock.answer_by).
HEARTBEAT = text("""
    UPDATE scrapyd_node SET heartbeat_time = now() WHERE id = :worker
    RETURNING CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS database_clock
""")

# Mark this process stopped (graceful shutdown).
STOP_NODE = text("UPDATE scrapyd_node SET stopped_time = now() WHERE id = :worker")

# Whether this process wants work (free slots, nothing found to claim): new jobs NOTIFY only while a node does.
SET_WANTS_WORK = text("UPDATE scrapyd_node SET wants_work = :wants WHERE id = :worker")

# Hand this process's unfinished claims (pairs of job :ids and :attempts) back to the queue when it stops; or
# terminate them, as 'cancelled' when cancel.json asked for it, or as 'interrupted' once :max_attempts claims are
# used up. Only while each claim is still its own. Pending ones wake idle nodes (one NOTIFY, whatever their number)
# and drop their stats, as in recovery (NODE_TICK); an ended one keeps its stats and pid for the record, and writes
# its webhooks' events (trigger spider_job_ended).
HAND_BACK_CLAIMS = text("""
    WITH claim AS (
        SELECT j.id,
               CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempts >= :max_attempts THEN 'interrupted' END
                   AS outcome
        FROM spider_job AS j
        JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[])) AS mine(id, attempt)
          ON j.id = mine.id AND j.attempts = mine.attempt
        WHERE j.status = 'ongoing' AND j.worker = :worker
    ), handed_back AS (
        UPDATE spider_job AS j
        SET status = CASE WHEN claim.outcome IS NULL THEN 'pending' ELSE 'terminated' END,
            outcome = claim.outcome,
            unique_key = CASE WHEN claim.outcome IS NULL THEN spider_job_key_unless_taken(j.project, j.unique_key)
                              ELSE j.unique_key END,
            reason = CASE WHEN claim.outcome IS NOT NULL THEN format(
                'node %s stopped during attempt %s of %s', :node, j.attempts, :max_attempts
            ) END,
            stats = CASE WHEN claim.outcome IS NOT NULL THEN j.stats END,
            end_time = CASE WHEN claim.outcome IS NOT NULL THEN now() END,
            pid = CASE WHEN claim.outcome IS NOT NULL THEN j.pid END
        FROM claim
        WHERE j.id = claim.id
        RETURNING j.id, j.project, j.job, j.status
    )
    SELECT id, project, job, status,
           (SELECT pg_notify(:channel, '') WHERE status = 'pending' AND scrapyd_nodes_want_work()) AS notified
    FROM handed_back
""")

# Of this process's :ids/:attempts claims, those it no longer owns: recovered (back to pending, or claimed again,
# perhaps by another node) while this node could not renew its lease. Read after a heal, to say so per job.
CLAIMS_TAKEN_OVER = text("""
    SELECT j.id, j.project, j.job, j.status, j.node, j.outcome
    FROM spider_job AS j
    JOIN unnest(CAST(:ids AS bigint[]), CAST(:attempts AS integer[])) AS mine(id, attempt) ON j.id = mine.id
    WHERE j.worker IS DISTINCT FROM :worker OR j.attempts <> mine.attempt OR j.status = 'pending'
""")

# A node's tick: everything an idle node sends and learns each heartbeat, in one statement (one round trip, one
# transaction) on its lease connection, in steps:
# - beat: renews its lease (NULL clock: the node row is gone, register again);
# - stats_written: the stats of this node's running crawls that changed (:stats, a JSON array of {id, attempt,
#   stats}; '[]' for none), each written while its claim owns the job: one statement per tick however many crawls
#   run. Only the stats column changes, which no index holds: the updates are HOT;
# - expired, recovered: when :recover, lease recovery: the jobs of every other process whose lease expired (no
#   heartbeat for :lease_seconds, database clock) or that stopped. A job lost with its node failed: with _retries it
#   waits out its backoff as 'delayed' (failure counted), or ends 'dead' once they are used up; without, it goes
#   back to pending at once (the claim stays counted in attempts) and ends 'lost' once :max_attempts claims are used
#   up. A cancel request ends it as 'cancelled' (a cancelled job never runs again). A job that runs again drops the
#   stats of the lost attempt (its next attempt reports its own); an ended one keeps them and its pid, and writes its
#   webhooks' events (trigger spider_job_ended). Reads spider_job_ongoing_worker_idx (running jobs only, by owner)
#   joined to the small node table, never the waiting or finished rows. Locks owner and job rows, skipping locked
#   ones: a heartbeat or a finish being written at this instant wins, and two nodes recovering at once share the
#   work. Only in a prompt tick: this node's previous heartbeat (the row as the statement's snapshot sees it, before
#   its own update) is at most :prompt_seconds old. A tick held up in a stalled server (sent before the stall, run
#   after it, when every node's heartbeat is old) recovers nothing: a stall is not a death;
# - released: when :release, hands back this process's claims that it runs no crawl for (the claim committed but
#   its reply was lost with the connection: a database restart or a killed session); only claims made before
#   :claimed_before (database clock: base.on_database_clock), so that a claim whose reply is still on its way is
#   never taken. Reads spider_job_ongoing_worker_idx;
# - pending settled jobs wake idle nodes.
# It reads what the node acts on: the cancel requests for its crawls (a floor under NOTIFY), the egg catalogue
# (which projects changed), in how many seconds the next periodic job is due and the next webhook event is (the head
# of webhook_event_due_idx). Recovery and release touch disjoint rows (other workers' jobs, this worker's), and a
# false flag costs nothing: the values are in the query string, so the planner drops that step. Its lock_timeout is
# short (250 ms): a lock held on spider_job (or another table it reads) must not hold up the lease, so past it the
# tick gives way to HEARTBEAT alone (see node_tick).
NODE_TICK = text("""SET LOCAL lock_timeout = 250;
    WITH beat AS (
        UPDATE scrapyd_node SET heartbeat_time = now() WHERE id = :worker
        RETURNING CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS database_clock
    ), stats_written AS (
        UPDATE spider_job AS j SET stats = s.stats
        FROM jsonb_to_recordset(CAST(:stats AS jsonb)) AS s(id bigint, attempt integer, stats jsonb)
        WHERE j.id = s.id AND j.attempts = s.attempt AND j.worker = :worker AND j.status = 'ongoing'
        RETURNING j.id
    ), expired AS (
        SELECT j.id, n.name,
               CASE WHEN j.cancel_requested THEN 'cancelled'
                    WHEN j.retries > 0 AND j.failures >= j.retries THEN 'dead'
                    WHEN j.retries = 0 AND j.attempts >= :max_attempts THEN 'lost' END AS outcome
        FROM spider_job AS j JOIN scrapyd_node AS n ON n.id = j.worker
        WHERE j.status = 'ongoing' AND j.worker <> :worker
          AND (n.heartbeat_time < now() - make_interval(secs => :lease_seconds) OR n.stopped_time IS NOT NULL)
          AND :recover AND EXISTS (
            SELECT FROM scrapyd_node AS me
            WHERE me.id = :worker AND me.heartbeat_time > now() - make_interval(secs => :prompt_seconds)
        )
        FOR UPDATE OF j, n SKIP LOCKED
    ), recovered AS (
        UPDATE spider_job AS j
        SET status = CASE WHEN expired.outcome IS NOT NULL THEN 'terminated'
                          WHEN j.retries > 0 THEN 'delayed' ELSE 'pending' END,
            outcome = expired.outcome,
            run_at = CASE WHEN expired.outcome IS NULL AND j.retries > 0
                          THEN now() + make_interval(secs => j.retry_delay * 2 ^ j.failures) ELSE j.run_at END,
            failures = j.failures + CASE WHEN j.retries > 0 AND NOT j.cancel_requested THEN 1 ELSE 0 END,
            unique_key = CASE WHEN expired.outcome IS NULL THEN spider_job_key_unless_taken(j.project, j.unique_key)
                              ELSE j.unique_key END,
            reason = CASE WHEN expired.outcome IS NOT NULL OR j.retries > 0 THEN format(
                'node %s stopped heart-beating during attempt %s of %s', expired.name, j.attempts, :max_attempts
            ) END,
            stats = CASE WHEN expired.outcome IS NOT NULL THEN j.stats END,
            end_time = CASE WHEN expired.outcome IS NOT NULL THEN now() END,
            pid = CASE WHEN expired.outcome IS NOT NULL THEN j.pid END
        FROM expired
        WHERE j.id = expired.id
        RETURNING j.id, j.project, j.job, j.status
    ), released AS (
        UPDATE spider_job SET status = 'pending', unique_key = spider_job_key_unless_taken(project, unique_key)
        WHERE :release AND status = 'ongoing' AND worker = :worker AND NOT (id = ANY(:known_ids))
          AND start_time < :claimed_before
        RETURNING id, project, job, status
    ), settled AS (
        SELECT id, project, job, status, true AS recovered FROM recovered
        UNION ALL SELECT id, project, job, status, false FROM released
    )
    SELECT (SELECT database_clock FROM beat) AS database_clock,
           (SELECT json_agg(json_build_object('id', id, 'project', project, 'job', job, 'status', status,
                                              'recovered', recovered)) FROM settled) AS settled,
           (SELECT count(*) FROM settled
            WHERE status = 'pending' AND scrapyd_nodes_want_work() AND pg_notify(:channel, '') IS NULL) AS notified,
           (SELECT json_agg(json_build_object('id', id, 'project', project, 'job', job, 'worker', worker,
                                              'requests', cancel_requests, 'signal', cancel_signal))
            FROM spider_job WHERE status = 'ongoing' AND worker = :worker AND cancel_requests > 0) AS cancels,
           (SELECT json_object_agg(project, json_build_array(eggs, newest)) FROM (
                SELECT project, count(*) AS eggs, max(id) AS newest FROM project_egg GROUP BY project
            ) AS catalogue) AS eggs,
           (SELECT CAST(extract(epoch FROM min(next_fire_time) - now()) AS double precision) FROM periodic_job
            WHERE NOT paused) AS periodic_due_in,
           (SELECT count(*) FROM stats_written) AS stats_written,
           (SELECT CAST(extract(epoch FROM min(due_time) - now()) AS double precision) FROM webhook_event)
               AS webhooks_due_in
""")

# --- operations ------------------------------------------------------------------------------------------------


LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout


@dataclass(frozen=True)
class NodeTick:
    """What one tick renewed and learned (see NODE_TICK)."""

    registered: bool  # False: the node row is gone (the caller registers again)
    recovered: list[ReleasedJob]  # other nodes' jobs whose lease expired
    released: list[ReleasedJob]  # this node's forgotten claims, handed back
    cancels: list[CancelRequest]  # for this node's crawls
    eggs: dict[str, tuple[int, int]] | None  # project -> (eggs, newest egg id), as EggStore.egg_catalogue; None: unread
    periodic_due_in: float | None  # seconds until the next periodic job is due; None: no active schedule
    stats_written: int | None = 0  # running jobs whose stats it wrote; None: the tick gave way (none written)
    webhooks_due_in: float | None = None  # seconds until the next webhook event is due; None: none (or unread)


@dataclass(frozen=True)
class TakenOverJob:
    """A job recovered from this node while it could not renew its lease: where it is now."""

    id: int
    project: str
    job: str
    status: str
    node: str | None  # the node that claimed it last
    outcome: str | None


def _released(rows) -> list[ReleasedJob]:
    return [ReleasedJob(row.id, row.project, row.job, row.status) for row in rows]


class NodeLeases:
    """A node's registration and leases over one database (part of ``JobStore``)."""

    engine: Engine

    @database_errors
    def register_node(self, *, worker: str, name: str, url: str | None, max_proc: int | None,
                      tags: Iterable[str] = ()) -> None:
        with db.autocommit(self.engine) as connection:
            sent = time.time()
            params = {"worker": worker, "name": name, "url": url, "max_proc": max_proc, "tags": list(tags)}
            database_clock = connection.execute(REGISTER_NODE, params).scalar()
        clock.learn_clock_offset(database_clock, sent, time.time())  # before this node claims anything

    @database_errors
    def heartbeat(self, worker: str) -> bool:
        """Renew the lease; False when the node row is gone (the caller registers again)."""
        with db.autocommit(self.engine) as connection:
            sent = time.time()
            database_clock = connection.execute(HEARTBEAT, {"worker": worker}).scalar()
        if database_clock is None:
            return False
        clock.learn_clock_offset(database_clock, sent, time.time())
        return True

    @database_errors
    def node_tick(
        self, *, worker: str, lease_seconds: float, max_attempts: int, recover: bool, release: bool,
        known_ids: Iterable[int], claimed_before: datetime.datetime, prompt_seconds: float,
        stats: Iterable[tuple[ClaimedJob, dict]] = (),
    ) -> NodeTick:
        """Renew the lease and learn the cluster's news in one statement (NODE_TICK); ``recover`` and ``release``
        say whether to take other nodes' expired jobs (only while this node's previous heartbeat is at most
        ``prompt_seconds`` old) and to hand back this node's forgotten claims. ``stats``: (claim, stats dict) of
        this node's running crawls whose stats changed, written on their rows."""
        params = {
            "worker": worker, "lease_seconds": float(lease_seconds), "max_attempts": max_attempts,
            "recover": recover, "release": release, "known_ids": list(known_ids),
            "claimed_before": on_database_clock(claimed_before)[0], "channel": NOTIFY_CHANNEL,
            "prompt_seconds": float(prompt_seconds),
            "stats": json.dumps([{"id": claimed.id, "attempt": claimed.attempt, "stats": job_stats}
                                 for claimed, job_stats in stats], separators=(",", ":")),
        }
        try:
            with db.autocommit(self.engine) as connection:
                sent = time.time()
                row = connection.execute(NODE_TICK, params).one()
        except DriverError as e:
            if getattr(e.orig, "pgcode", None) != LOCK_NOT_AVAILABLE:
                raise
            # A table the tick reads is locked (a migration, an operator's lock): the lease alone, news next time.
            return NodeTick(registered=self.heartbeat(worker), recovered=[], released=[], cancels=[], eggs=None,
                            periodic_due_in=None, stats_written=None)
        if row.database_clock is not None:
            clock.learn_clock_offset(row.database_clock, sent, time.time())
        settled = [(job.pop("recovered"), ReleasedJob(**job)) for job in row.settled or []]
        return NodeTick(
            registered=row.database_clock is not None,
            recovered=[job for recovered, job in settled if recovered],
            released=[job for recovered, job in settled if not recovered],
            cancels=[CancelRequest(**request) for request in row.cancels or []],
            eggs={project: tuple(figures) for project, figures in (row.eggs or {}).items()},
            periodic_due_in=row.periodic_due_in, webhooks_due_in=row.webhooks_due_in,
            stats_written=row.stats_written,
        )

    @database_errors
    def stop_node(self, worker: str) -> None:
        with db.autocommit(self.engine) as connection:
            connection.execute(STOP_NODE, {"worker": worker})

    @database_errors
    def set_wants_work(self, worker: str, wants: bool) -> None:
        with db.autocommit(self.engine) as connection:
            connection.execute(SET_WANTS_WORK, {"worker": worker, "wants": wants})

    @database_errors
    def hand_back(
        self, claims: Iterable[ClaimedJob], *, worker: str, node: str, max_attempts: int
    ) -> list[ReleasedJob]:
        """Give up claims of a stopping node: back to pending, or 'interrupted' once out of attempts."""
        claims = list(claims)
        if not claims:
            return []
        return self._settle(HAND_BACK_CLAIMS, ids=[claimed.id for claimed in claims],
                            attempts=[claimed.attempt for claimed in claims], worker=worker, node=node,
                            max_attempts=max_attempts)

    def _settle(self, statement, **params) -> list[ReleasedJob]:
        """Run a statement that settles claims (HAND_BACK_CLAIMS): pending jobs wake idle nodes on NOTIFY_CHANNEL."""
        with db.autocommit(self.engine) as connection:
            return _released(connection.execute(statement, {**params, "channel": NOTIFY_CHANNEL}))

    @database_errors
    def claims_taken_over(self, claims: Iterable[ClaimedJob], *, worker: str) -> list[TakenOverJob]:
        """Of this process's ``claims``, those recovered from it meanwhile, with who runs them now."""
        claims = list(claims)
        if not claims:
            return []
        params = {"ids": [c.id for c in claims], "attempts": [c.attempt for c in claims], "worker": worker}
        with db.autocommit(self.engine) as connection:
            return [TakenOverJob(**row._asdict()) for row in connection.execute(CLAIMS_TAKEN_OVER, params)]
