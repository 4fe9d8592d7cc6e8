"""What every concern of the store shares: channels, limits, errors, shared rows and the operations' helpers."""

from __future__ import annotations

import datetime
import functools
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import msgspec

from scrapyd_pgqueue.store import db
from scrapyd_pgqueue.store.pool import Engine
from scrapyd_pgqueue.store.sql import text

# Channel of the NOTIFY that wakes idle nodes when jobs became claimable; the payload is empty (a constant: Postgres
# folds a transaction's identical notifications into one).
NOTIFY_CHANNEL = "scrapyd_pgqueue_jobs"
# Whether a node may need waking: one has free slots and found nothing to claim (0016; NULL: not said yet). Every
# notifying transaction commits one at a time (Postgres's lock on its notification queue) and wakes every
# listening backend, so a job sent to a cluster whose nodes are all busy sends none: they claim again when a slot
# frees. One probe of scrapyd_node_wanting_idx.
NODES_WANT_WORK = "EXISTS (SELECT 1 FROM scrapyd_node WHERE wants_work IS NOT FALSE AND stopped_time IS NULL)"

# Longest project, spider, job id or version stored: (project, job) is one index entry, which Postgres caps at
# 2704 bytes.
MAX_NAME_BYTES = 1000

# Beyond 2 ** 53 a double (the priority column) no longer tells consecutive integers apart: p + 1 would run as p.
MAX_PRIORITY = 2**53

# Channel of the NOTIFY sent with each cancel request on a running job; the payload is JSON (id, project, job,
# worker, requests, signal), and only the node running the job (its worker) acts on it.
CANCEL_CHANNEL = "scrapyd_pgqueue_cancel"
# Channel of the NOTIFY sent when a project's eggs change; the payload is the project.
PROJECTS_CHANNEL = "scrapyd_pgqueue_projects"


class DuplicateJobError(ValueError):
    """A pending or running job of the project already has this job id."""


class InvalidJobError(ValueError):
    """The job cannot be stored as given (reason in the message)."""


class JobNotFoundError(LookupError):
    """No job with this id (in this project) is in the state the operation needs."""


# What a second schedule of a waiting job's unique key does (_on_conflict).
REPLACE, KEEP, ERROR = "replace", "keep", "error"
ON_CONFLICT = (REPLACE, KEEP, ERROR)
# Where a unique key is unique: among the project's waiting jobs, or among every job of the parent's tree.
UNIQUE_SCOPES = ("waiting", "tree")
# Channel of the NOTIFY sent when a crawl tree is done; the payload is JSON {"project", "root", "root_id"}.
TREES_CHANNEL = "scrapyd_pgqueue_trees"


@dataclass(frozen=True)
class JobOptions:
    """How a job is scheduled, beside what it runs (none of it reaches the spider)."""

    run_at: float | None = None  # Unix seconds; or
    delay: float | None = None  # seconds from now, on the database's clock
    unique_key: str | None = None  # one waiting job per key and project
    on_conflict: str = REPLACE
    retries: int = 0  # runs again after this many failures at most, then ends "dead"
    retry_delay: float = 0.0  # the backoff's base: retry n waits retry_delay * 2 ** (n - 1)
    periodic: str | None = None  # the periodic job that fired it
    parent: str | None = None  # the job id of the job that scheduled it (same project): it joins its tree
    unique_scope: str = "waiting"  # or "tree": unique_key is scheduled once in the parent's tree, ever
    on_complete: str | None = None  # on a root: the spider enqueued once when the whole tree has ended
    on_complete_args: dict[str, str] | None = None
    max_runtime: float | None = None  # seconds the crawl may run before its node stops it ("timeout")
    stall_timeout: float | None = None  # seconds without a new request, response or item before it does ("stalled")
    tags: tuple[str, ...] | None = None  # the tags a node needs to run it (checked, sorted); None: its spider's route


NO_OPTIONS = JobOptions()


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

# A job going back to waiting keeps its unique key unless a new waiting job of the project took it meanwhile (a
# running job does not hold its key): SET unique_key = KEY_UNLESS_TAKEN.format(row=<the updated table's alias>).
KEY_UNLESS_TAKEN = """
    CASE WHEN EXISTS (
        SELECT 1 FROM spider_job AS waiting
        WHERE waiting.project = {row}.project AND waiting.unique_key = {row}.unique_key
          AND waiting.status IN ('delayed', 'pending')
    ) THEN NULL ELSE {row}.unique_key END
"""

# Whether the caller still waits for the answer (:answer_by, database clock: db.answer_by), read once as the
# statement starts, for the writes of a statement that must not happen once the caller gave up and answered "error"
# (a statement that reached a stalled server): WITH {IN_TIME}, ... WHERE ... AND (SELECT ok FROM in_time).
IN_TIME = "in_time AS MATERIALIZED (SELECT clock_timestamp() < to_timestamp(:answer_by) AS ok)"

# --- operations ------------------------------------------------------------------------------------------------


# One clock: every time stored on a row is the database's. A time a node measured (a crawl's start or end, as naive
# local time like Scrapyd's) reaches a statement as that instant on the database's clock, ``on_database_clock``; the
# rest are the database's ``now()``. A node's time zone or skewed clock changes nothing.
def on_database_clock(*moments: datetime.datetime | None) -> list[datetime.datetime | None]:
    """Each moment this node measured (its naive local time, as Scrapyd's launcher keeps them, or aware) as the
    instant it was on the database's clock: its time zone made explicit, and how far this node's clock is off the
    database's (learnt from every heartbeat) added. So nodes in other time zones or with skewed clocks store the
    instants the database's clock would have, and the times between a node's moments stay exactly as measured."""
    offset = datetime.timedelta(seconds=db.clock_offset())
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


def encode_message(message: dict[str, Any]) -> str:
    """A job's message as JSON text for its jsonb column (InvalidJobError when it cannot be stored)."""
    try:
        if _plain(message):  # what schedule.json and batches make: msgspec, several times faster, is exact there
            encoded = _MESSAGE_ENCODER.encode(message).decode()
        else:  # any value: json refuses NaN and infinities, where msgspec would write null
            encoded = json.dumps(message, ensure_ascii=False, allow_nan=False)
            encoded.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
        raise InvalidJobError("job arguments must be valid Unicode text") from None
    except (TypeError, ValueError) as e:
        raise InvalidJobError(f"job arguments must be JSON-serialisable finite values: {e}") from e
    if "\x00" in encoded or "\\u0000" in encoded:
        raise InvalidJobError("job arguments may not contain NUL characters")
    return encoded


_MESSAGE_ENCODER = msgspec.json.Encoder()


def _plain(message: dict[str, Any]) -> bool:
    """Whether every value is a string, or an object of strings (the settings), under string keys."""
    for key, value in message.items():
        if type(key) is not str:
            return False
        if type(value) is not str:
            if type(value) is not dict:
                return False
            for name, setting in value.items():
                if type(name) is not str or type(setting) is not str:
                    return False
    return True


def check_priority(priority: Any) -> float:
    """A job's priority, by every way in (schedule.json's number, a batch's or a line's JSON, the Python API, a
    periodic job): a number, not a boolean, finite, of magnitude at most MAX_PRIORITY; else InvalidJobError."""
    if type(priority) is float and -MAX_PRIORITY <= priority <= MAX_PRIORITY:  # most: no NaN or infinity passes
        return priority
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not is_finite(priority):
        raise InvalidJobError(f"priority must be a finite number, not {priority!r}")
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidJobError(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}, not {priority!r}")
    return float(priority)


def is_finite(number: int | float) -> bool:
    """Finite as a float: JSON's integers have any size, and a float cannot hold them all."""
    return abs(number) <= sys.float_info.max if isinstance(number, int) else math.isfinite(number)


def check_name(what: str, value: Any) -> str:
    """A project, spider, job id or version as the row's columns and indexes can hold it, else InvalidJobError."""
    if type(value) is str and value.isascii() and 0 < len(value) <= MAX_NAME_BYTES and "\x00" not in value:
        return value  # most: ASCII text is as many bytes as characters, and always valid
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidJobError(f"{what} may not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{what} may not contain NUL characters")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
        raise InvalidJobError(f"{what} must be valid Unicode text") from None
    if size > MAX_NAME_BYTES:
        raise InvalidJobError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return value


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

