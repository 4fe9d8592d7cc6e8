"""Delayed: does a claim cost the same with a million delayed jobs waiting as with none?

Every claim first promotes the delayed jobs that are due (``status = 'delayed' AND run_at <= now()``, read from the
head of ``spider_job_delayed_idx``) and reports when the next one is due (``min(run_at)``, the same index's first
entry). Neither should read the jobs still waiting. Measured side by side in one run, one claimer, on the same
pending backlog (1,000 jobs, five projects, as the depth suite fills it):

- ``empty``: the backlog alone, no delayed job;
- ``delayed``: the same backlog plus ``DELAYED_JOBS`` delayed jobs due over the next days (one
  ``INSERT ... SELECT generate_series`` with ``status = 'delayed'``, ``run_at = now() + interval``, then
  ``VACUUM ANALYZE``);
- ``delayed_due``: the same, plus ``DUE_JOBS`` delayed jobs that become due while each path is measured (their
  ``run_at`` spread over the next seconds), so the claims promote them;
- ``empty_again``: the delayed jobs removed (the backlog refilled as at first): how far the figures move between
  two measurements of the same table on this machine.

Each claim path is timed as in the depth suite (bench.latency: warm-up, then one untimed INSERT after each timed
claim keeps the backlog constant). The claim is also run once under ``EXPLAIN (ANALYZE, BUFFERS)`` in each state
(in a transaction rolled back, so no job is taken): the buffers it touched, per index it read.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from bench import database
from bench.context import Context
from bench.latency import measure_claim_latency
from bench.suites.delayed.explain import explain_claims
from bench.suites.delayed.figures import _notes, _ratios, _targets
from bench.suites.delayed.jobs import (
    COUNT_DELAYED,
    INSERT_DELAYED,
    _checkpoint,
    _count_delayed,
    _delayed_params,
    _without_returning,
    claim_paths,
    insert_delayed,
    promoted,
)
from bench.suites.delayed.settings import (
    DELAYED_FROM_SECONDS,
    DELAYED_JOBS,
    DELAYED_SPREAD_SECONDS,
    DUE_JOBS,
    PATH_PROJECTS,
    PENDING_JOBS,
    PROJECTS,
    RANDOM_SEED,
    SCENARIOS,
)
from bench.suites.delayed.table import format_table

SUMMARY = "claim latency with 1,000,000 delayed jobs waiting (and some falling due) against none"
SERIES = ("claim_latency", "explain")

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]


def run(ctx: Context) -> dict:
    profile, url = ctx.profile, ctx.database_url
    delayed_jobs = DELAYED_JOBS.get(profile.name, DELAYED_JOBS["full"])
    due_jobs = DUE_JOBS.get(profile.name, DUE_JOBS["full"])
    samples = profile.latency_samples
    scenarios, explains, promotion, durations = {}, {}, {}, {}

    def measure(scenario: str, due: int = 0) -> None:
        ctx.log(f"delayed: measuring '{scenario}'")
        explains[scenario] = explain_claims(url)
        scenarios[scenario] = {}
        for path, claim in claim_paths(url).items():
            due_ids = []
            if due:
                # Due over the time this path took in the previous state: the promotions are spread over the
                # measurement (each claim promotes what fell due since the one before).
                span = max(durations.get(path, 2.0), 0.5)
                due_ids = insert_delayed(url, due, PATH_PROJECTS[path], f"due-{path}-{uuid.uuid4().hex[:6]}-", 0.0,
                                         span, even=True)
            started = time.monotonic()
            scenarios[scenario][path] = measure_claim_latency(url, claim, samples)
            durations[path] = time.monotonic() - started
            scenarios[scenario][path]["seconds"] = durations[path]
            if due:
                promotion[path] = promoted(url, due_ids)
                scenarios[scenario][path]["promoted"] = promotion[path]["promoted"]

    ctx.log(f"delayed: filling {PENDING_JOBS:,} pending jobs, no delayed job")
    database.fill_spider_job(url, PENDING_JOBS, PROJECTS, prefix="pending-")
    measure("empty")

    ctx.log(f"delayed: adding {delayed_jobs:,} delayed jobs")
    started = time.monotonic()
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", (RANDOM_SEED,))
        cursor.execute(_without_returning(INSERT_DELAYED), _delayed_params(delayed_jobs, "waiting-",
                                                                           DELAYED_FROM_SECONDS,
                                                                           DELAYED_SPREAD_SECONDS, even=False))
        fill_seconds = time.monotonic() - started
        cursor.execute("VACUUM ANALYZE spider_job")
        checkpointed = _checkpoint(cursor)
        cursor.execute(COUNT_DELAYED)
        delayed_counted = cursor.fetchone()[0]
    ctx.log(f"delayed: {delayed_counted:,} delayed jobs inserted in {fill_seconds:.1f} s (+ VACUUM ANALYZE)")
    measure("delayed")
    measure("delayed_due", due=due_jobs)
    delayed_after = _count_delayed(url)

    ctx.log("delayed: removing the delayed jobs, backlog refilled as at first")
    database.fill_spider_job(url, PENDING_JOBS, PROJECTS, prefix="pending-")
    measure("empty_again")

    ratios = _ratios(scenarios)
    return {
        "parameters": {
            "pending_jobs": PENDING_JOBS,
            "projects": list(PROJECTS),
            "delayed_jobs": delayed_jobs,
            "delayed_due_from_seconds": DELAYED_FROM_SECONDS,
            "delayed_spread_seconds": DELAYED_SPREAD_SECONDS,
            "due_jobs_per_path": due_jobs,
            "latency_samples": samples,
            "delayed_fill_seconds": fill_seconds,
            "delayed_counted": delayed_counted,
            "delayed_left_after_due": delayed_after,
            "checkpoint_after_fill": checkpointed,
        },
        "series": {
            "claim_latency": {"points": [{"scenario": name, **scenarios[name]} for name in SCENARIOS]},
            "explain": {"points": [{"scenario": name, **explains[name]} for name in SCENARIOS]},
        },
        "ratios": ratios,
        "targets": _targets(ratios, delayed_jobs),
        "notes": _notes(scenarios, explains, due_jobs),
    }


def plot(result: dict, directory: Path) -> list[Path]:
    return []  # the table says it all: four states, three paths
