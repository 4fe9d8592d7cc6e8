"""The tables behind the shared queue (SQLAlchemy 2.0 typed models).

The schema is created and changed only by the migrations in ``migrations/``; these models describe it
for queries. A change here needs a new migration.
"""

from __future__ import annotations

import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Identity,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from scrapyd_pgqueue.store.statuses import (  # noqa: F401 - the models' names for them
    CANCELLED, DEAD, DELAYED, FAILED, FINISHED, INTERRUPTED, LOST, ONGOING, OUTCOMES, PENDING, STATUSES, TERMINATED,
)


class Base(DeclarativeBase):
    pass


class SpiderJob(Base):
    """One scheduled crawl: ``pending -> ongoing -> terminated``."""

    __tablename__ = "spider_job"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(Text)
    spider: Mapped[str] = mapped_column(Text)
    job: Mapped[str] = mapped_column(Text)  # Scrapyd's job id
    version: Mapped[str | None] = mapped_column(Text)  # egg version pinned at schedule time
    priority: Mapped[float] = mapped_column(server_default=text("0"))
    # Exactly what ISpiderQueue.add() received; NULL for jobs that never went through the queue.
    message: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(Text, server_default=text("'pending'"))
    outcome: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None]
    reason: Mapped[str | None] = mapped_column(Text)
    node: Mapped[str | None] = mapped_column(Text)  # name of the node that claimed it
    worker: Mapped[str | None] = mapped_column(Text)  # scrapyd_node.id of that node's process: the lease owner
    pid: Mapped[int | None]
    attempts: Mapped[int] = mapped_column(server_default=text("0"))  # claims so far
    cancel_requested: Mapped[bool] = mapped_column(server_default=text("false"))
    # cancel.json calls on the running job (each one signal, as in Scrapyd) and the signal of the latest (0002).
    cancel_requests: Mapped[int] = mapped_column(server_default=text("0"))
    cancel_signal: Mapped[str | None] = mapped_column(Text)
    # The database's clock (0007: timestamptz), whatever the nodes' clocks and zones; shown as Scrapyd does (naive
    # local time) by store.base.local_time.
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True))
    start_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    end_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    # Scheduling (0004): when the job is (or was) due (database clock), its unique key among waiting jobs, retries
    # allowed after failures and the backoff's base, failures so far, and the periodic job that fired it.
    run_at: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    unique_key: Mapped[str | None] = mapped_column(Text)
    retries: Mapped[int] = mapped_column(server_default=text("0"))
    retry_delay: Mapped[float] = mapped_column(server_default=text("0"))
    failures: Mapped[int] = mapped_column(server_default=text("0"))
    periodic: Mapped[str | None] = mapped_column(Text)
    # Trees (0005): the parent's job id and row, and the root's row id for every job of a tree with children or an
    # _on_complete.
    parent: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[int | None] = mapped_column(BigInteger)
    tree_id: Mapped[int | None] = mapped_column(BigInteger)
    # Scrapy's stats as the crawl last reported them to its node (0011): written by the node's tick while it runs
    # and with its finish; not indexed, so those updates stay HOT.
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    # The watchdog (0013): seconds the crawl may run, and may go without a new request, response or item, before
    # its node stops it (outcome 'timeout' or 'stalled'); NULL: the node's max_runtime and stall_timeout.
    max_runtime: Mapped[float | None]
    stall_timeout: Mapped[float | None]
    # Node pools (0014): the tags the job requires, sorted and joined by commas ('': none); only a node with all of
    # them claims it. Leading the pending indexes, it makes each pool's claim order an index range of its own.
    pool: Mapped[str] = mapped_column(Text, server_default=text("''"))

    __table_args__ = (
        CheckConstraint(f"status IN {STATUSES}", name="spider_job_status_check"),
        CheckConstraint(f"outcome IN {OUTCOMES}", name="spider_job_outcome_check"),
        # Two nodes given the same job id at the same instant cannot both accept it; a finished id may be reused.
        Index(
            "spider_job_live_job_key",
            "project",
            "job",
            unique=True,
            postgresql_where=text("status IN ('delayed', 'pending', 'ongoing')"),
        ),
        # Due delayed jobs, earliest first (the claim reads its head).
        Index("spider_job_delayed_idx", "run_at", postgresql_where=text("status = 'delayed'")),
        # Past-due counts: pending jobs by the time they became due.
        Index("spider_job_pending_due_idx", "run_at", postgresql_where=text("status = 'pending'")),
        # _unique_key: one waiting job per key and project.
        Index(
            "spider_job_waiting_unique_key",
            "project",
            "unique_key",
            unique=True,
            postgresql_where=text("status IN ('delayed', 'pending') AND unique_key IS NOT NULL"),
        ),
        # Per-spider limits: a limited spider's next pending jobs, and its running ones.
        Index(
            "spider_job_pending_spider_idx",
            "project",
            "spider",
            text("priority DESC"),
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("spider_job_ongoing_spider_idx", "project", "spider", postgresql_where=text("status = 'ongoing'")),
        # Claim order across projects, per pool: a claim reads the head of its pools, whatever the backlog.
        Index(
            "spider_job_pending_idx",
            "pool",
            text("priority DESC"),
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        # Claim order, count and list within one project (ISpiderQueue), per pool.
        Index(
            "spider_job_pending_project_idx",
            "pool",
            "project",
            text("priority DESC"),
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("spider_job_ongoing_worker_idx", "worker", postgresql_where=text("status = 'ongoing'")),
        Index("spider_job_terminated_idx", text("end_time DESC"), postgresql_where=text("status = 'terminated'")),
        Index("spider_job_job_idx", "job"),
        Index("spider_job_tree_idx", "tree_id", postgresql_where=text("tree_id IS NOT NULL")),
    )


class ScrapydNode(Base):
    """One running Scrapyd process. Its heartbeat is the lease on the jobs it claimed."""

    __tablename__ = "scrapyd_node"

    id: Mapped[str] = mapped_column(Text, primary_key=True)  # random per process start
    name: Mapped[str] = mapped_column(Text)
    url: Mapped[str | None] = mapped_column(Text)
    max_proc: Mapped[int | None]
    # Database clock (timestamptz), so that leases do not depend on the nodes' clocks.
    started_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    heartbeat_time: Mapped[datetime.datetime] = mapped_column(
        DateTime(timezone=True), server_default=text("now()")
    )
    stopped_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    # The node's tags (0014): it claims the jobs whose required tags it all has.
    tags: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=text("'{}'"))
    # Whether its poller has free slots and found nothing to claim (0016): a new job wakes nodes (NOTIFY) only
    # while one does. NULL (not said yet, or a node of an older version) counts as wanting.
    wants_work: Mapped[bool | None]

    __table_args__ = (
        Index("scrapyd_node_wanting_idx", "id",
              postgresql_where=text("wants_work IS NOT FALSE AND stopped_time IS NULL")),
    )


class ProjectEgg(Base):
    """One deployed version of a project (migration 0002): deployed once, runnable on every node."""

    __tablename__ = "project_egg"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(Text)
    egg: Mapped[bytes] = mapped_column(LargeBinary)
    sha256: Mapped[bytes] = mapped_column(LargeBinary)  # of egg, checked before a crawl runs it (migration 0010)
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))

    __table_args__ = (UniqueConstraint("project", "version", name="project_egg_project_version_key"),)


class ProjectUser(Base):
    """A project's own uid for its crawls (migration 0017), assigned at its first crawl on any node."""

    __tablename__ = "project_user"

    project: Mapped[str] = mapped_column(Text, primary_key=True)
    uid: Mapped[int] = mapped_column(Integer, unique=True)
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))


class JobLog(Base):
    """The log of a finished job, its tail capped at ``log_max_bytes`` (migration 0002); goes with its row."""

    __tablename__ = "job_log"

    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("spider_job.id", ondelete="CASCADE"), primary_key=True)
    log: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(BigInteger)  # of the whole log file, before the cap
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))


class SpiderLimit(Base):
    """At most ``max_running`` crawls of one spider at once in the whole cluster (migration 0004)."""

    __tablename__ = "spider_limit"

    project: Mapped[str] = mapped_column(Text, primary_key=True)
    spider: Mapped[str] = mapped_column(Text, primary_key=True)
    max_running: Mapped[int]
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))

    __table_args__ = (CheckConstraint("max_running > 0", name="spider_limit_max_running_check"),)


class SpiderRoute(Base):
    """The pool a spider's jobs go to when scheduled without _tags (migration 0014): routes for clients that know
    nothing of tags."""

    __tablename__ = "spider_route"

    project: Mapped[str] = mapped_column(Text, primary_key=True)
    spider: Mapped[str] = mapped_column(Text, primary_key=True)
    pool: Mapped[str] = mapped_column(Text)
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))


class PeriodicJob(Base):
    """A job fired by a cron expression or every N seconds by whichever node is alive (migration 0004)."""

    __tablename__ = "periodic_job"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    project: Mapped[str] = mapped_column(Text)
    spider: Mapped[str] = mapped_column(Text)
    cron: Mapped[str | None] = mapped_column(Text)
    timezone: Mapped[str] = mapped_column(Text, server_default=text("'UTC'"))
    every_seconds: Mapped[float | None]
    priority: Mapped[float] = mapped_column(server_default=text("0"))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    overlap: Mapped[str] = mapped_column(Text, server_default=text("'skip'"))  # skip | queue
    paused: Mapped[bool] = mapped_column(server_default=text("false"))
    # The compare-and-set of a firing: only the node that moves next_fire_time on from the value it read fires.
    next_fire_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True))
    last_fire_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)  # spider_job.id of the last firing (overlap)
    last_job: Mapped[str | None] = mapped_column(Text)
    fired: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    skipped: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    # Each firing's job's _max_runtime and _stall_timeout (0013).
    max_runtime: Mapped[float | None]
    stall_timeout: Mapped[float | None]
    # Each firing's job's pool (0014); NULL: its spider's route at each firing.
    pool: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="periodic_job_cron_or_every_check"),
        CheckConstraint("every_seconds IS NULL OR every_seconds > 0", name="periodic_job_every_check"),
        CheckConstraint("overlap IN ('skip', 'queue')", name="periodic_job_overlap_check"),
    )


class SpiderTree(Base):
    """A crawl tree: its open jobs, kept exact by triggers (migration 0005), and its completion."""

    __tablename__ = "spider_tree"

    root_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # spider_job.id of the root
    project: Mapped[str] = mapped_column(Text)
    root_job: Mapped[str] = mapped_column(Text)
    open_jobs: Mapped[int]  # waiting, running or due for a retry, the root included until its crawl ends
    total: Mapped[int]
    on_complete: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # {"spider": ..., "args": {...}}
    completion_job: Mapped[str | None] = mapped_column(Text)
    cancelled: Mapped[bool] = mapped_column(server_default=text("false"))
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    done_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (CheckConstraint("open_jobs >= 0", name="spider_tree_open_jobs_check"),)


class SpiderTreeKey(Base):
    """A key scheduled once in a tree (_unique_scope=tree), whatever became of its job."""

    __tablename__ = "spider_tree_key"

    tree_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("spider_tree.root_id", ondelete="CASCADE"), primary_key=True
    )
    unique_key: Mapped[str] = mapped_column(Text, primary_key=True)
    job: Mapped[str] = mapped_column(Text)


class Webhook(Base):
    """An operator's webhook: where to post which events (migration 0012). The secret signs the body; the node role
    reads it, nothing shows it."""

    __tablename__ = "webhook"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(ARRAY(Text))
    project: Mapped[str | None] = mapped_column(Text)  # None: every project's
    format: Mapped[str] = mapped_column(Text, server_default=text("'json'"))  # json | slack
    secret: Mapped[str | None] = mapped_column(Text)
    deliveries: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))  # events delivered
    failures: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))  # events given up
    last_error: Mapped[str | None] = mapped_column(Text)
    last_error_time: Mapped[datetime.datetime | None] = mapped_column(DateTime(timezone=True))
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))

    __table_args__ = (
        CheckConstraint("format IN ('json', 'slack')", name="webhook_format_check"),
        CheckConstraint("cardinality(events) > 0", name="webhook_events_check"),
    )


class WebhookEvent(Base):
    """The outbox: an event for one hook, written with what caused it, until delivered or given up (migration
    0012)."""

    __tablename__ = "webhook_event"

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    webhook_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("webhook.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(Text)
    fields: Mapped[dict[str, Any]] = mapped_column(JSONB)  # what the cause's row gave, for the body
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
    # When it may be sent next: a claim moves it a lease ahead (a node killed mid-delivery loses nothing).
    due_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"),
                                                        index=True)
    attempts: Mapped[int] = mapped_column(server_default=text("0"))
    claimed_by: Mapped[str | None] = mapped_column(Text)  # the worker that holds its lease
    last_error: Mapped[str | None] = mapped_column(Text)


class SpiderJobStaging(Base):
    """A big batch of new jobs on its way into spider_job (migration 0015): COPY streams the rows in, and the same
    transaction moves them to spider_job (store/staging.py: REPLACE_STAGED_JOBS, MOVE_STAGED_JOBS), keyed by its
    transaction's id. The table has no primary key (the index on batch and n is not unique); the mapper needs one
    named."""

    __tablename__ = "spider_job_staging"
    __table_args__ = (Index("spider_job_staging_batch_idx", "batch", "n"), {"prefixes": ["UNLOGGED"]})

    batch: Mapped[int] = mapped_column(BigInteger, server_default=text("txid_current()"), primary_key=True)
    id: Mapped[int] = mapped_column(BigInteger)  # reserved for the job in its batch's order (spider_job.id)
    n: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # the job's place in its transaction
    spider: Mapped[str] = mapped_column(Text)
    job: Mapped[str] = mapped_column(Text)
    version: Mapped[str | None] = mapped_column(Text)
    priority: Mapped[float]
    message: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    run_at_epoch: Mapped[float | None]
    delay: Mapped[float | None]
    unique_key: Mapped[str | None] = mapped_column(Text)
    retries: Mapped[int]
    retry_delay: Mapped[float]
    periodic: Mapped[str | None] = mapped_column(Text)
    parent: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[int | None] = mapped_column(BigInteger)
    tree_id: Mapped[int | None] = mapped_column(BigInteger)
    max_runtime: Mapped[float | None]
    stall_timeout: Mapped[float | None]
    pool: Mapped[str | None] = mapped_column(Text)  # the job's own required tags; None: its spider's route
