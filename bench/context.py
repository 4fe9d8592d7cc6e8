"""What every suite is given: the database, the sizes of this run (quick or full) and a place for files."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Profile:
    """The sizes of one benchmark run. ``QUICK`` is CI's smoke test (< 2 minutes on 2 cores), ``FULL`` the report."""

    name: str
    # throughput
    claimers: tuple[int, ...]  # concurrency levels; one process per claimer
    run_seconds: float  # length of each timed run
    repeats: int  # timed runs per (path, level), interleaved; the median is reported
    throughput_backlog: int  # pending jobs before every run: more than any run can claim
    # depth
    depths: tuple[int, ...]
    latency_samples: int  # timed claims per path and depth
    read_repeats: int  # timed count()/list()/list_pending() calls per depth
    small_project_seconds: float  # cap on sampling pop() of a small project behind the backlog (slow claims)
    # churn
    churn_jobs: int  # claims + finishes (+ prunes) to put the table through
    churn_processes: int
    churn_batch: int  # claim_next_jobs limit in the churn loop
    churn_backlog: int  # pending jobs kept in the table during the churn
    churn_sample_seconds: float  # how often table statistics are sampled while churning


QUICK = Profile(
    name="quick",
    # 64 spawned claimers cost ~50 s of start-up alone on 2 cores (each imports Scrapy, Scrapyd, SQLAlchemy):
    # too much for the 2-minute smoke test, so quick stops at 16. The full run measures 64.
    claimers=(1, 4, 16),
    run_seconds=0.5,
    repeats=1,
    throughput_backlog=10_000,
    depths=(1_000, 100_000),
    latency_samples=200,
    read_repeats=3,
    small_project_seconds=1.5,
    churn_jobs=20_000,
    churn_processes=4,
    churn_batch=10,
    churn_backlog=10_000,
    churn_sample_seconds=1.0,
)

FULL = Profile(
    name="full",
    claimers=(1, 4, 16, 64),
    run_seconds=3.0,
    repeats=3,
    throughput_backlog=30_000,
    depths=(1_000, 100_000, 1_000_000),
    latency_samples=2_000,
    read_repeats=5,
    small_project_seconds=15.0,
    churn_jobs=200_000,  # not 1,000,000: 21-40 min more on 2 cores, past a 30-min run (see README)
    churn_processes=4,
    churn_batch=10,
    churn_backlog=10_000,
    churn_sample_seconds=10.0,
)

PROFILES = {profile.name: profile for profile in (QUICK, FULL)}


def with_overrides(profile: Profile, **overrides) -> Profile:
    """``profile`` with the options given on the command line (``None`` means not given)."""
    given = {name: value for name, value in overrides.items() if value is not None}
    return dataclasses.replace(profile, **given)


@dataclass
class Context:
    database_url: str
    profile: Profile
    workdir: Path  # scratch space removed at the end (Scrapyd's sqlite queue lives here)
    started: float = dataclasses.field(default_factory=time.monotonic)
    log: Callable[[str], None] = dataclasses.field(default=None)

    def __post_init__(self):
        if self.log is None:
            self.log = self._log

    def _log(self, message: str) -> None:
        # Progress goes to stderr so that stdout holds only the tables.
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)
