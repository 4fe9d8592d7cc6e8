"""Single-claimer claim latency, measured the same way by the depth and churn suites.

Each timed claim is followed by an untimed INSERT of one pending job into the claimed job's project, so the
backlog stays at the depth being measured however many samples are taken.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence

from bench import database
from bench.stats import summarise_ms

WARMUP_CLAIMS = 20  # untimed: connection, plan and page caches
MIN_SAMPLES = 10  # even when a time limit cuts a measurement short

_replacement_numbers = itertools.count(1)


def claim_paths(url: str, projects: Sequence[str]) -> dict[str, Callable[[], str | None]]:
    """The two paths measured, each returning the claimed job's project (None when nothing was pending).

    ``pgqueue_pop``: what Scrapyd's poller calls, ``PostgresSpiderQueue(config, projects[0]).pop()``.
    ``pgqueue_claim_next_jobs``: this project's poller, one claim across all ``projects``.
    """
    from scrapyd.config import Config

    from scrapyd_pgqueue import PostgresSpiderQueue
    from scrapyd_pgqueue.store import JobStore

    node = "bench-latency"
    queue = PostgresSpiderQueue(Config(values={"database_url": url, "node_name": node}), projects[0])
    store = JobStore.for_url(url)
    worker = uuid.uuid4().hex

    def pop() -> str | None:
        return projects[0] if queue.pop() is not None else None

    def claim_next_jobs() -> str | None:
        claimed = store.claim_next_jobs(list(projects), 1, node=node, worker=worker).jobs
        return claimed[0].project if claimed else None

    return {"pgqueue_pop": pop, "pgqueue_claim_next_jobs": claim_next_jobs}


def measure_claim_latency(
    url: str,
    claim: Callable[[], str | None],
    samples: int,
    *,
    max_seconds: float | None = None,
    replacement_priority: float | None = None,
    warmup: int = WARMUP_CLAIMS,
) -> dict:
    """p50/p99/mean/max in ms of ``samples`` claims, the backlog kept constant by one insert per claim.

    ``max_seconds`` stops early (after at least ``MIN_SAMPLES``) when claims are slow enough that the full count
    would take too long; the result says how many were taken.
    """
    prefix = f"replacement-{uuid.uuid4().hex[:8]}-"
    durations = []
    started = time.monotonic()
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        for sample in range(warmup + samples):
            start = time.perf_counter()
            project = claim()
            elapsed = time.perf_counter() - start
            if project is None:
                raise RuntimeError("claim latency: the backlog ran dry; the suite must keep jobs pending")
            database.insert_pending(cursor, 1, [project], prefix, first=next(_replacement_numbers),
                                    priority=replacement_priority)
            if sample >= warmup:
                durations.append(elapsed)
            if _out_of_time(started, max_seconds, len(durations)):
                break
    return summarise_ms(durations)


def _out_of_time(started: float, max_seconds: float | None, taken: int) -> bool:
    return max_seconds is not None and taken >= MIN_SAMPLES and time.monotonic() - started > max_seconds


def measure_paths(url: str, projects: Sequence[str], samples: int) -> dict[str, dict]:
    return {name: measure_claim_latency(url, claim, samples) for name, claim in claim_paths(url, projects).items()}
