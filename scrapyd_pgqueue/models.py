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
    DateTime,
    ForeignKey,
    Index,
    LargeBinary,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

PENDING, ONGOING, TERMINATED = "pending", "ongoing", "terminated"
STATUSES = (PENDING, ONGOING, TERMINATED)

# How a terminated job ended. "lost": recovery gave up after max_attempts claims by nodes that died;
# "interrupted": its node stopped (SIGTERM) before the crawl ended; "cancelled": cancel.json.
FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED = "finished", "failed", "cancelled", "lost", "interrupted"
OUTCOMES = (FINISHED, FAILED, CANCELLED, LOST, INTERRUPTED)


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
    # Naive local times with microseconds, as Scrapyd uses.
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime)
    start_time: Mapped[datetime.datetime | None] = mapped_column(DateTime)
    end_time: Mapped[datetime.datetime | None] = mapped_column(DateTime)

    __table_args__ = (
        CheckConstraint(f"status IN {STATUSES}", name="spider_job_status_check"),
        CheckConstraint(f"outcome IN {OUTCOMES}", name="spider_job_outcome_check"),
        # Two nodes given the same job id at the same instant cannot both accept it; a finished id may be reused.
        Index(
            "spider_job_live_job_key",
            "project",
            "job",
            unique=True,
            postgresql_where=text("status IN ('pending', 'ongoing')"),
        ),
        # Claim order across projects: a claim reads the head of this index, whatever the backlog.
        Index(
            "spider_job_pending_idx",
            text("priority DESC"),
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        # Claim order, count and list within one project (ISpiderQueue).
        Index(
            "spider_job_pending_project_idx",
            "project",
            text("priority DESC"),
            "id",
            postgresql_where=text("status = 'pending'"),
        ),
        Index("spider_job_ongoing_worker_idx", "worker", postgresql_where=text("status = 'ongoing'")),
        Index("spider_job_terminated_idx", text("end_time DESC"), postgresql_where=text("status = 'terminated'")),
        Index("spider_job_job_idx", "job"),
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


class ProjectEgg(Base):
    """One deployed version of a project (migration 0002): deployed once, runnable on every node."""

    __tablename__ = "project_egg"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    project: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(Text)
    egg: Mapped[bytes] = mapped_column(LargeBinary)
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))

    __table_args__ = (UniqueConstraint("project", "version", name="project_egg_project_version_key"),)


class JobLog(Base):
    """The log of a finished job, its tail capped at ``log_max_bytes`` (migration 0002); goes with its row."""

    __tablename__ = "job_log"

    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("spider_job.id", ondelete="CASCADE"), primary_key=True)
    log: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(BigInteger)  # of the whole log file, before the cap
    created_time: Mapped[datetime.datetime] = mapped_column(DateTime(timezone=True), server_default=text("now()"))
