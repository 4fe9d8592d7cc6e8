"""How a job is scheduled, beside what it runs: ``JobOptions`` and the values its fields may take."""

from __future__ import annotations

from dataclasses import dataclass

# What a second schedule of a waiting job's unique key does (_on_conflict).
REPLACE, KEEP, ERROR = "replace", "keep", "error"
ON_CONFLICT = (REPLACE, KEEP, ERROR)
# Where a unique key is unique: among the project's waiting jobs, or among every job of the parent's tree.
UNIQUE_SCOPES = ("waiting", "tree")


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
    workers: int | None = None  # a crawl spread over this many jobs sharing one frontier; None: a job of its own
    join: str | None = None  # the running crawl these workers join (its first job id)


NO_OPTIONS = JobOptions()
