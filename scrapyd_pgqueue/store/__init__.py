"""Every queue operation, each one short statement: every query of the queue lives here.

No Twisted and no Scrapyd imports: the store is used by the Scrapyd adapters, the operator command and the
benchmark alike. Every method runs in its own short transaction (the enqueue command's stream aside: its whole
input is one); none is held while a crawl runs. Below it: ``scrapyd_pgqueue.database``, the connection layer (the
only code that knows the driver), and ``scrapyd_pgqueue.job_rules``, the rules a job request meets before any SQL.

Each query is a named ``text(...)`` constant, with a comment saying why, next to the operations that run it (the
claim, the hottest, is a plain string that ``db.fetch_all`` sends on the driver's cursor). The claim's steps are a
function in the database. ``schema.sql`` is the whole current schema as the migrations leave it (tables, indexes,
constraints, triggers, functions, grants), with the reason for each object and each of the claim's steps; a test
keeps the two in step.

One module per concern:

- ``base``: what the others share: channels, errors, shared rows, the operations' helpers.
- ``queue``: enqueue (delayed, unique), claim (due jobs, per-spider limits), waiting jobs, notify (``JobStore``).
- ``enqueue``: the rules of a job's columns and the one statement that stores a batch (delayed, unique, tree jobs).
- ``staging``: big batches by COPY (the enqueue command), each job checked as COPY reads it: straight into
  spider_job, or through the staging table for jobs whose unique key is held and tree jobs, ids reserved in the
  batch's order.
- ``finishing``: start, finish or retry, prune, terminated jobs (``JobEnds``, in ``JobStore``).
- ``nodes``: registration, heartbeat, lease recovery, hand-back, forgotten claims (``NodeLeases``, in ``JobStore``).
- ``trees``: crawl trees: children placed in their parent's tree, tree-scoped keys, the tree's view and cancel
  (``TreeQueries``, in ``AllJobsStore``; the open-job counts are kept by triggers, migration 0005).
- ``all_jobs``: every node's jobs, for the services, the pages and the CLI: status, lists, counts, cancel, logs
  (``AllJobsStore``).
- ``operator``: the operator command's queries (``OperatorQueries``, in ``AllJobsStore``).
- ``frontier``: the requests of a crawl spread over workers: stored deduplicated, leased, done (``FrontierStore``).
- ``eggs``: project eggs (``EggStore``).
- ``maintenance``: a VACUUM of the queue table when it is due, by the nodes that finish crawls (``QueueMaintenance``).
- ``overview``: bounded views of the whole cluster for the dashboard and /metrics (``OverviewStore``).
- ``schedules``: periodic jobs (the operator's, and their firing by every node; when each is due is
  ``job_rules.timing``) and per-spider limits (``ScheduleStore``).
- ``pools``: node pools: tags (checked, as a job's pool), routes per spider, pools no live node can run
  (``PoolStore``).
- ``webhooks``: the operator's webhooks, the outbox steps the statements that cause events carry, and the claim and
  record of deliveries (``WebhookStore``).
"""

from __future__ import annotations

from scrapyd_pgqueue.store.all_jobs import (
    MAX_PENDING_OFFSET,
    PENDING_COUNT_CAP,
    AllJobsStore,
    CancelRequest,
    ClusterCounts,
    FinishedJobRow,
    PendingJob,
    RunningJob,
    StoredLog,
    cancel_signal,
    signal_number,
)
from scrapyd_pgqueue.store.base import (
    CANCEL_CHANNEL,
    NOTIFY_CHANNEL,
    PROJECTS_CHANNEL,
    TREES_CHANNEL,
    ClaimedJob,
    DuplicateJobError,
    Enqueued,
    JobNotFoundError,
    JobRow,
    local_time,
)
from scrapyd_pgqueue.store.eggs import EggStore
from scrapyd_pgqueue.store.finishing import WatchdogLimits
from scrapyd_pgqueue.store.maintenance import QueueMaintenance
from scrapyd_pgqueue.store.nodes import NodeTick, ReleasedJob
from scrapyd_pgqueue.store.operator import NodeRow
from scrapyd_pgqueue.store.overview import COUNT_CAP, MinuteCount, OverviewStore, SpiderDepth
from scrapyd_pgqueue.store.queue import CLAIM_NEXT_JOBS, Claim, JobStore, notify_through_pool
from scrapyd_pgqueue.store.schedules import (
    OVERLAP,
    PERIODIC_CHANNEL,
    DuplicateScheduleError,
    FiredJob,
    Firing,
    PeriodicJobRow,
    ScheduleNotFoundError,
    ScheduleStore,
    SpiderLimitRow,
)
from scrapyd_pgqueue.store.trees import TreeView
from scrapyd_pgqueue.store.webhooks import WebhookNotFoundError, WebhookStore

__all__ = [
    # channels and limits
    "NOTIFY_CHANNEL",
    "CANCEL_CHANNEL",
    "PROJECTS_CHANNEL",
    "PERIODIC_CHANNEL",
    "PENDING_COUNT_CAP",
    "MAX_PENDING_OFFSET",
    "COUNT_CAP",
    "TREES_CHANNEL",
    # scheduling options
    "OVERLAP",
    # errors
    "DuplicateJobError",
    "JobNotFoundError",
    "DuplicateScheduleError",
    "ScheduleNotFoundError",
    # rows
    "ClaimedJob",
    "WatchdogLimits",
    "TreeView",
    "Claim",
    "Enqueued",
    "ReleasedJob",
    "JobRow",
    "PendingJob",
    "RunningJob",
    "FinishedJobRow",
    "ClusterCounts",
    "CancelRequest",
    "cancel_signal",
    "signal_number",
    "StoredLog",
    "NodeRow",
    "SpiderDepth",
    "MinuteCount",
    "PeriodicJobRow",
    "SpiderLimitRow",
    "FiredJob",
    "Firing",
    # stores
    "JobStore",
    "AllJobsStore",
    "EggStore",
    "QueueMaintenance",
    "OverviewStore",
    "ScheduleStore",
    "WebhookStore",
    "WebhookNotFoundError",
    "notify_through_pool",
    # how times from the database are shown (Scrapyd's naive local time)
    "local_time",
    # queries the tests and the benchmark read (their plans, their compiled SQL)
    "CLAIM_NEXT_JOBS",
    "NodeTick",
]
