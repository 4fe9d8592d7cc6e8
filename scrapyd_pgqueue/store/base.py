"""What every concern of the store shares: channels, limits, errors, shared rows and the operations' helpers."""

from __future__ import annotations

import datetime
import functools
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from scrapyd_pgqueue import db

# Channel of the NOTIFY sent with every enqueue; the payload is the project.
NOTIFY_CHANNEL = "scrapyd_pgqueue_jobs"

# Longest project, spider, job id or version stored: (project, job) is one index entry, which Postgres caps at
# 2704 bytes.
MAX_NAME_BYTES = 1000

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


# --- queries shared by cluster.py (job_status) and admin.py (requeue) ------------------------------------------

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

# --- operations ------------------------------------------------------------------------------------------------


def now() -> datetime.datetime:
    return datetime.datetime.now()


def database_errors(method):
    """Driver errors leave the store as ``db.DatabaseError`` naming host and port, never the password."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with db.operation(self.engine):
            return method(self, *args, **kwargs)

    return wrapper


def encode_message(message: dict[str, Any]) -> str:
    try:
        encoded = json.dumps(message, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidJobError(f"job arguments must be JSON-serialisable finite values: {e}") from e
    if "\x00" in encoded or "\\u0000" in encoded:
        raise InvalidJobError("job arguments may not contain NUL characters")
    if not _is_unicode(encoded):
        raise InvalidJobError("job arguments must be valid Unicode text")
    return encoded


def _is_unicode(value: str) -> bool:
    try:
        value.encode()  # a lone surrogate ("\udc80", from undecodable bytes) cannot be stored
    except UnicodeEncodeError:
        return False
    return True


def check_name(what: str, value: Any) -> str:
    """A project, spider, job id or version as the row's columns and indexes can hold it, else InvalidJobError."""
    if not isinstance(value, str):
        raise InvalidJobError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidJobError(f"{what} may not be empty")
    if "\x00" in value:
        raise InvalidJobError(f"{what} may not contain NUL characters")
    if not _is_unicode(value):
        raise InvalidJobError(f"{what} must be valid Unicode text")
    if len(value.encode()) > MAX_NAME_BYTES:
        raise InvalidJobError(f"{what} is longer than {MAX_NAME_BYTES} bytes")
    return value
