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

from bench import database, report
from bench.context import Context
from bench.latency import measure_claim_latency
from bench.stats import ratio

SUMMARY = "claim latency with 1,000,000 delayed jobs waiting (and some falling due) against none"
SERIES = ("claim_latency", "explain")

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

# Delayed jobs as the store's enqueue makes them (status 'delayed', run_at on the database's clock), spread over
# :projects, due :from_seconds to :from_seconds + :spread_seconds from now at random (or evenly when :even).
INSERT_DELAYED = """
    INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
    SELECT project, spider, job, floor(random() * 10),
           jsonb_build_object('name', spider, '_job', job, 'settings', jsonb_build_object(), 'category', 'bench'),
           'delayed',
           now() + make_interval(secs => %(from_seconds)s + %(spread_seconds)s *
                                 CASE WHEN %(even)s THEN (i - 1)::float8 / %(count)s ELSE random() END),
           localtimestamp
    FROM (
        SELECT i, (%(projects)s::text[])[1 + i %% cardinality(%(projects)s::text[])] AS project,
               'spider' || (i %% 13) AS spider,
               %(prefix)s || i AS job
        FROM generate_series(1, %(count)s) AS i
    ) AS generated
    RETURNING id
"""

# What became of a set of delayed jobs: how many were promoted (no longer delayed).
PROMOTED = "SELECT count(*) FILTER (WHERE status <> 'delayed'), count(*) FROM spider_job WHERE id = ANY(%(ids)s)"
DELETE_STILL_DELAYED = "DELETE FROM spider_job WHERE id = ANY(%(ids)s) AND status = 'delayed'"
COUNT_DELAYED = "SELECT count(*) FROM spider_job WHERE status = 'delayed'"


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


# --- the claim paths --------------------------------------------------------------------------------------------


def claim_paths(url: str) -> dict:
    """``pop()`` of one project (Scrapyd's poller), ``claim_next_jobs`` of that project and of all five (ours)."""
    from scrapyd.config import Config

    from scrapyd_pgqueue import PostgresSpiderQueue
    from scrapyd_pgqueue.store import JobStore

    node = "bench-delayed"
    queue = PostgresSpiderQueue(Config(values={"database_url": url, "node_name": node}), PROJECTS[0])
    store = JobStore.for_url(url)
    worker = uuid.uuid4().hex

    def pop():
        return PROJECTS[0] if queue.pop() is not None else None

    def claim_of(projects):
        def claim():
            claimed = store.claim_next_jobs(list(projects), 1, node=node, worker=worker).jobs
            return claimed[0].project if claimed else None

        return claim

    return {
        "pgqueue_pop": pop,
        "claim_next_jobs_project": claim_of(PROJECTS[:1]),
        "claim_next_jobs_projects": claim_of(PROJECTS),
    }


def _delayed_params(count: int, prefix: str, from_seconds: float, spread_seconds: float, even: bool,
                    projects=PROJECTS) -> dict:
    return {"projects": list(projects), "prefix": prefix, "count": count, "from_seconds": from_seconds,
            "spread_seconds": spread_seconds, "even": even}


def _without_returning(statement: str) -> str:
    return statement.replace("RETURNING id", "")


def insert_delayed(url: str, count: int, projects, prefix: str, from_seconds: float, spread_seconds: float,
                   even: bool) -> list[int]:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(INSERT_DELAYED, _delayed_params(count, prefix, from_seconds, spread_seconds, even, projects))
        return [row[0] for row in cursor.fetchall()]


def promoted(url: str, ids: list[int]) -> dict:
    """How many of ``ids`` the claims promoted; the rest (not yet due) are deleted so that the next path starts
    clean."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(PROMOTED, {"ids": ids})
        count, total = cursor.fetchone()
        cursor.execute(DELETE_STILL_DELAYED, {"ids": ids})
    return {"promoted": count, "inserted": total}


def _checkpoint(cursor) -> bool:
    """Write out the fill's dirty pages now (best effort: CHECKPOINT needs superuser or pg_checkpoint), so that a
    checkpoint triggered by the fill's WAL does not land on the measurement that follows it (a suspect, not proven:
    one run without it measured 'delayed' about 2x slower than 'delayed_due' right after, on the same table)."""
    import psycopg2

    try:
        cursor.execute("CHECKPOINT")
    except psycopg2.Error:
        return False
    return True


def _count_delayed(url: str) -> int:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(COUNT_DELAYED)
        return cursor.fetchone()[0]


# --- EXPLAIN ----------------------------------------------------------------------------------------------------


def explain_claims(url: str) -> dict:
    """The claim of one project and of the five, each statement it runs explained (ANALYZE, BUFFERS), rolled back:
    what it read."""
    from scrapyd_pgqueue.store import queue as store
    from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL

    statement = store.CLAIM_NEXT_JOBS
    params = {"limit": 1, "node": "bench-delayed-explain", "worker": uuid.uuid4().hex,
              "channel": NOTIFY_CHANNEL}
    explained = {}
    for name, projects in EXPLAINED:
        connection = database.connect(url)
        try:
            plans = database.explain_nested(connection, statement, {**params, "projects": projects})
        finally:
            connection.rollback()  # ANALYZE ran the claim: give the job back
            connection.close()
        explained[name] = summarise_plans(plans)
    return explained


EXPLAINED = (  # name, the claim's :projects
    ("claim_project", [PROJECTS[0]]),
    ("claim_projects", list(PROJECTS)),
    ("claim_project_without_delayed", [PROJECT_WITHOUT_DELAYED]),
)


def summarise_plans(plans: list[dict]) -> dict:
    """What the claim's statements read, together (the last plan is the call itself: its time is the claim's)."""
    *inner, outer = plans
    nodes = []
    for document in inner:
        _walk(document["Plan"], nodes)
    return {
        "execution_ms": outer["Plan"].get("Actual Total Time"),
        "shared_hit": sum(document["Plan"].get("Shared Hit Blocks", 0) for document in inner),
        "shared_read": sum(document["Plan"].get("Shared Read Blocks", 0) for document in inner),
        "statements": len(inner),
        # Per node that reads spider_job or one of its indexes (an index scan's buffers include its heap fetches).
        "scans": nodes,
    }


def _walk(node: dict, out: list) -> None:
    if node.get("Relation Name") or node.get("Index Name"):
        out.append({
            "node": node["Node Type"],
            "relation": node.get("Relation Name"),
            "index": node.get("Index Name"),
            "rows": node.get("Actual Rows"),
            "loops": node.get("Actual Loops"),
            "shared_hit": node.get("Shared Hit Blocks", 0),
            "shared_read": node.get("Shared Read Blocks", 0),
            "cte": node.get("Subplan Name"),
        })
    for child in node.get("Plans", []):
        _walk(child, out)


DELAYED_INDEXES = ("spider_job_delayed_idx", "spider_job_delayed_project_idx")  # all projects; one project


def _delayed_index_blocks(explained: dict) -> int:
    return sum(scan["shared_hit"] + scan["shared_read"] for scan in explained["scans"]
               if scan["index"] in DELAYED_INDEXES)


# --- figures ----------------------------------------------------------------------------------------------------


def _ratio_name(path: str, percentile: str, scenario: str) -> str:
    return f"{path} {percentile} {scenario} / empty"


def empty_reference(scenarios: dict, path: str, percentile: str) -> float:
    """The empty table's figure: the mean of its measurements before and after the delayed ones, which bracket
    them in time (a drift of the machine's load between the first and the last cancels out to first order)."""
    return (scenarios["empty"][path][percentile] + scenarios["empty_again"][path][percentile]) / 2


def _ratios(scenarios: dict) -> dict:
    ratios = {}
    for path in CLAIM_PATHS:
        for percentile in PERCENTILES:
            for scenario in COMPARED:
                ratios[_ratio_name(path, percentile, scenario)] = ratio(
                    scenarios[scenario][path][percentile], empty_reference(scenarios, path, percentile))
            # The noise floor: the same empty table measured twice, minutes apart.
            ratios[f"{path} {percentile} empty_again / empty"] = ratio(
                scenarios["empty_again"][path][percentile], scenarios["empty"][path][percentile])
    return ratios


def _targets(ratios: dict, delayed_jobs: int) -> list[dict]:
    note = "" if delayed_jobs >= 1_000_000 else f"quick mode: {delayed_jobs:,} delayed jobs only"
    return [
        report.target(f"claim {percentile[:3]} {path}, {delayed_jobs:,} delayed / empty",
                      ratios.get(_ratio_name(path, percentile, "delayed")), "<=", LATENCY_TARGET, note)
        for path in CLAIM_PATHS
        for percentile in PERCENTILES
    ]


def _notes(scenarios: dict, explains: dict, due_jobs: int) -> list[str]:
    promoted_counts = ", ".join(f"{path} {scenarios['delayed_due'][path].get('promoted', 0)}/{due_jobs}"
                                for path in CLAIM_PATHS)
    return [f"delayed_due: delayed jobs promoted by the measured claims (the rest were not due yet when it ended): "
            f"{promoted_counts}"]


def format_table(result: dict) -> str:
    parameters = result["parameters"]
    points = {point["scenario"]: point for point in result["series"]["claim_latency"]["points"]}
    rows = []
    for path in CLAIM_PATHS:
        for scenario in SCENARIOS:
            figures = points[scenario][path]
            ratios = [report.number(ratio(figures[key], empty_reference(points, path, key)), 2)
                      if scenario in COMPARED else "" for key in PERCENTILES]
            rows.append([path, scenario, *(report.number(figures[key], 3) for key in ("p50_ms", "p99_ms", "mean_ms")),
                         str(figures["samples"]), str(figures["promoted"]) if "promoted" in figures else "", *ratios])
    explain_rows = []
    for point in result["series"]["explain"]["points"]:
        for statement, _ in EXPLAINED:
            explained = point[statement]
            delayed_scans = [scan for scan in explained["scans"] if scan["index"] in DELAYED_INDEXES]
            explain_rows.append([
                point["scenario"], statement,
                report.number(explained["shared_hit"] + explained["shared_read"]),
                report.number(explained["shared_read"]),
                report.number(_delayed_index_blocks(explained)),
                " + ".join(f"{scan['node'].replace(' Scan', '')} {scan['shared_hit'] + scan['shared_read']}"
                           for scan in delayed_scans) or "-",
                report.number(explained["execution_ms"], 3),
            ])
    return report.table_text(result, [
        report.heading("Delayed"),
        f"one claimer; {parameters['latency_samples']:,} timed claims per path and state; {parameters['pending_jobs']:,} "
        f"pending jobs over {len(parameters['projects'])} projects kept constant; 'delayed': + "
        f"{parameters['delayed_counted']:,} delayed jobs due in 1 h to 3 days (inserted in "
        f"{parameters['delayed_fill_seconds']:.1f} s); 'delayed_due': + {parameters['due_jobs_per_path']} more per path "
        "falling due during its measurement; 'empty_again': delayed jobs removed",
        report.format_rows(["claim path", "table", "p50 ms", "p99 ms", "mean ms", "samples", "promoted",
                            "p50 / empty", "p99 / empty"], rows),
        "x / empty: over the mean of 'empty' and 'empty_again' (measured before and after); same table twice, "
        "empty_again / empty (p50, p99): " + ", ".join(
            f"{path} {ratio(points['empty_again'][path]['p50_ms'], points['empty'][path]['p50_ms']):.2f}, "
            f"{ratio(points['empty_again'][path]['p99_ms'], points['empty'][path]['p99_ms']):.2f}"
            for path in CLAIM_PATHS),
        "",
        "Each statement of one claim explained (auto_explain: ANALYZE, BUFFERS; rolled back), shared buffers summed; "
        "pop() and claim_next_jobs([p]) send claim_project, claim_next_jobs(5 projects) claim_projects",
        report.format_rows(["table", "statement", "buffers", "read", "delayed idx", "delayed idx scans",
                            "exec ms"], explain_rows),
        "",
    ])


def plot(result: dict, directory: Path) -> list[Path]:
    return []  # the table says it all: four states, three paths
