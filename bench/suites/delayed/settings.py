"""The delayed suite's constants: the backlog, the delayed jobs, the states and claim paths measured."""

from __future__ import annotations

PROJECTS = ("delayed0", "delayed1", "delayed2", "delayed3", "delayed4")
PENDING_JOBS = 1_000
DELAYED_JOBS = {"full": 1_000_000, "quick": 20_000}
DUE_JOBS = {"full": 300, "quick": 30}
# Delayed jobs are due from an hour to three days from now: none falls due during the run.
DELAYED_FROM_SECONDS = 3_600.0
DELAYED_SPREAD_SECONDS = 3 * 86_400.0
LATENCY_TARGET = 1.5  # delayed / empty, per path and percentile
PERCENTILES = ("p50_ms", "p99_ms")
RANDOM_SEED = 0.17

SCENARIOS = ("empty", "delayed", "delayed_due", "empty_again")
CLAIM_PATHS = ("pgqueue_pop", "claim_next_jobs_project", "claim_next_jobs_projects")
COMPARED = ("delayed", "delayed_due")  # over "empty"
PATH_PROJECTS = {  # the projects each path claims: the due jobs of delayed_due go there
    "pgqueue_pop": PROJECTS[:1],
    "claim_next_jobs_project": PROJECTS[:1],
    "claim_next_jobs_projects": PROJECTS,
}
# A project with no delayed job (nor pending): its claim's due/min(run_at) parts find nothing in the delayed index
# for it; EXPLAINed only, to see whether they read the whole index to learn that.
PROJECT_WITHOUT_DELAYED = "nodelayed"
