"""What every concern of the store shares: channels, errors, shared rows and the operations' helpers."""

from __future__ import annotations

import datetime
import functools
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.database import clock, db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import text

# Channel of the NOTIFY that wakes idle nodes when jobs became claimable; the payload is empty (a constant: Postgres
# folds a transaction's identical notifications into one).
NOTIFY_CHANNEL = "scrapyd_pgqueue_jobs"
# Statements that may make jobs claimable send it only when scrapyd_nodes_want_work() (schema.sql) says a node
# needs waking.

# Channel of the NOTIFY sent with each cancel request on a running job; the payload is JSON (id, project, job,
# worker, requests, signal), and only the node running the job (its worker) acts on it.
CANCEL_CHANNEL = "scrapyd_pgqueue_cancel"
# Channel of the NOTIFY sent when a project's eggs change; the payload is the project.
PROJECTS_CHANNEL = "scrapyd_pgqueue_projects"


class DuplicateJobError(ValueError):
    """A pending or running job of the project already has this job id."""


class JobNotFoundError(LookupError):
    """No job with this id (in this project) is in the state the operation needs."""


# Channel of the NOTIFY sent when a crawl tree is done; the payload is JSON {"project", "root", "root_id"}.
TREES_CHANNEL = "scrapyd_pgqueue_trees"


@dataclass(frozen=True)
class Enqueued:
    """Where a scheduled job went: its row and job id, which are an existing waiting job's for a unique key."""

    id: int
    job: str
    existing: bool = False


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    project: str
    job: str
    attempt: int  # the claim's number: finishing it is conditional on it
    message: dict[str, Any]
    waited: float | None = None  # seconds from when it was due to its claim (database clock)


@dataclass(frozen=True)
class JobRow:
    id: int
    project: str
    spider: str
    job: str
    status: str
    outcome: str | None
    exit_code: int | None
    reason: str | None
    node: str | None
    pid: int | None
    attempts: int
    priority: float
    version: str | None
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None


# --- queries shared by all_jobs.py (job_status) and operator.py (requeue) --------------------------------------

# The newest row of job id :job (in :project, all projects when NULL): a reused job id reports its latest run.
# Reads spider_job_job_idx.
JOB_STATUS = text("""
    SELECT status FROM spider_job
    WHERE job = :job AND (CAST(:project AS text) IS NULL OR project = :project)
    ORDER BY id DESC
    LIMIT 1
""")

# The writes of a statement that must not happen once the caller gave up and answered "error" (a statement that
# reached a stalled server) are bound by the caller's deadline (:answer_by, database clock: clock.answer_by), read
# once as the statement starts: "WITH in_time AS MATERIALIZED (SELECT clock_timestamp() < to_timestamp(:answer_by)
# AS ok), ... WHERE ... AND (SELECT ok FROM in_time)", or "WHERE clock_timestamp() < to_timestamp(:answer_by)" in a
# statement of one write.

# --- operations ------------------------------------------------------------------------------------------------


# One clock: every time stored on a row is the database's. A time a node measured (a crawl's start or end, as naive
# local time like Scrapyd's) reaches a statement as that instant on the database's clock, ``on_database_clock``; the
# rest are the database's ``now()``. A node's time zone or skewed clock changes nothing.
def on_database_clock(*moments: datetime.datetime | None) -> list[datetime.datetime | None]:
    """Each moment this node measured (its naive local time, as Scrapyd's launcher keeps them, or aware) as the
    instant it was on the database's clock: its time zone made explicit, and how far this node's clock is off the
    database's (learnt from every heartbeat) added. So nodes in other time zones or with skewed clocks store the
    instants the database's clock would have, and the times between a node's moments stay exactly as measured."""
    offset = datetime.timedelta(seconds=clock.clock_offset())
    return [None if moment is None else moment.astimezone() + offset for moment in moments]


def local_time(moment: datetime.datetime | None) -> datetime.datetime | None:
    """A time from the database (aware) as Scrapyd shows times: this node's naive local time."""
    return None if moment is None else moment.astimezone().replace(tzinfo=None)


def read_rows(engine: Engine, row_class, query, params: dict[str, Any] | None = None) -> list:
    """Run a read-only ``query`` alone (autocommit) and give each row as ``row_class`` (a dataclass of its columns)."""
    with db.autocommit(engine) as connection:
        return [row_class(**row._asdict()) for row in connection.execute(query, params or {})]


def database_errors(method):
    """Driver errors leave the store as ``db.DatabaseError`` naming host and port, never the password; a refused
    first statement (a server restarting behind PgBouncer), or a read that lost its connection, is sent again
    within the operation's time (``db.when_served``)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with db.operation(self.engine):
            return db.when_served(lambda: method(self, *args, **kwargs), self.engine.url)

    return wrapper


class StorePerEngine:
    """A store over one engine (its pool), built once per engine and store class in a process: a service or page
    that asks for the store on every request gets the same one, and shares its engine's connections."""

    def __init__(self, engine: Engine):
        self.engine = engine

    @classmethod
    def for_url(cls, url: str):
        return cls.for_engine(db.get_engine(url))

    @classmethod
    def for_settings(cls, settings):
        """The store of a node, over an engine with the node's pool size and timeout."""
        return cls.for_engine(db.engine_for_settings(settings))

    @classmethod
    def for_engine(cls, engine: Engine, *arguments):
        return _store_per_engine(cls, engine, *arguments)


@functools.cache
def _store_per_engine(cls, engine: Engine, *arguments):
    return cls(engine, *arguments)

