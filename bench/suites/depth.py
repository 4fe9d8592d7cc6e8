"""Depth: does a claim cost the same with a thousand or a million jobs pending? And what do reads cost?

For each depth the queue is refilled with one INSERT ... SELECT generate_series (ten priority levels, five
projects), then VACUUM ANALYZE. Claim latency is measured with one claimer on both paths (see bench.latency),
then ``PostgresSpiderQueue.count()``, ``.list()`` and ``JobStore.list_pending(project, limit=100)`` are timed on
one project, which holds a fifth of the jobs.
"""

from __future__ import annotations

from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.latency import claim_paths, measure_claim_latency, measure_paths
from bench.stats import ratio, summarise_ms, time_calls

SUMMARY = "claim latency and count/list cost with 1,000 to 1,000,000 pending jobs"
SERIES = ("claim_latency", "reads", "claim_latency_small_project")

PROJECTS = ("depth0", "depth1", "depth2", "depth3", "depth4")
LIST_PENDING_LIMIT = 100
LATENCY_TARGET = 1.5  # highest / lowest depth

# A small project behind the backlog: SMALL_PROJECT_JOBS jobs below every other priority. Scrapyd's stock poller
# pops project by project, so pop() on such a project is a real case; it has no target.
SMALL_PROJECT = "small"
SMALL_PROJECT_JOBS = 100
SMALL_PROJECT_PRIORITY = -1.0
CLAIM_PATHS = ("pgqueue_pop", "pgqueue_claim_next_jobs")
DRIFT_FACTOR = 2.0  # last tenth of the samples over the first tenth, beyond which the table says so
PERCENTILES = ("p50_ms", "p99_ms")


def run(ctx: Context) -> dict:
    profile = ctx.profile
    points = []
    for depth in profile.depths:
        ctx.log(f"depth: filling {depth:,} pending jobs")
        database.fill_spider_job(ctx.database_url, depth, PROJECTS, prefix="depth-")
        ctx.log(f"depth: measuring at {depth:,}")
        points.append(
            {
                "pending": depth,
                "pending_in_project": _pending_in_first_project(depth),
                "claim_latency": measure_paths(ctx.database_url, PROJECTS, profile.latency_samples),
                "reads": _time_reads(ctx.database_url, profile.read_repeats),
                "small_project_pop": _small_project_latency(ctx.database_url, profile),
            }
        )
    ratios = _ratios(points)
    return {
        "parameters": {
            "depths": list(profile.depths),
            "projects": list(PROJECTS),
            "latency_samples": profile.latency_samples,
            "read_repeats": profile.read_repeats,
            "read_project": PROJECTS[0],
            "small_project": {"name": SMALL_PROJECT, "jobs": SMALL_PROJECT_JOBS, "priority": SMALL_PROJECT_PRIORITY,
                              "max_seconds": profile.small_project_seconds},
        },
        "series": {
            "claim_latency": {"points": [{"pending": p["pending"], **p["claim_latency"]} for p in points]},
            "reads": {"points": [{"pending": p["pending"], "pending_in_project": p["pending_in_project"],
                                  **p["reads"]} for p in points]},
            "claim_latency_small_project": {"points": [{"pending": p["pending"], **p["small_project_pop"]}
                                                       for p in points]},
        },
        "ratios": ratios,
        "targets": _targets(ratios, profile.depths),
        "notes": _notes(points),
    }


def _pending_in_first_project(depth: int) -> int:
    # FILL_SPIDER_JOB gives job i to PROJECTS[i % len(PROJECTS)]: the first project holds every i ≡ 0.
    return depth // len(PROJECTS)


def _small_project_latency(url: str, profile) -> dict:
    """pop() on a project whose few jobs all rank below the whole backlog (see SMALL_PROJECT)."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        database.insert_pending(cursor, SMALL_PROJECT_JOBS, [SMALL_PROJECT], "small-", first=1,
                                priority=SMALL_PROJECT_PRIORITY)
        cursor.execute("ANALYZE spider_job")
    pop = claim_paths(url, [SMALL_PROJECT])["pgqueue_pop"]
    # Its claims may be slow: sampling stops after small_project_seconds (with at least 10 samples).
    return measure_claim_latency(url, pop, profile.latency_samples, max_seconds=profile.small_project_seconds,
                                 replacement_priority=SMALL_PROJECT_PRIORITY, warmup=3)


def _notes(points: list[dict]) -> list[str]:
    notes = [note for point in points for note in _drift_notes(point)]
    figures = ", ".join(f"{point['small_project_pop']['p50_ms']:.2f} ms at {point['pending']:,}" for point in points)
    notes.append(f"pop() of a {SMALL_PROJECT_JOBS}-job project ranked below the backlog, p50: {figures} pending")
    return notes


def _drift_notes(point: dict) -> list[str]:
    """Claim paths whose cost grew while they were being measured (each claim leaves more to step over)."""
    notes = []
    for path, figures in point["claim_latency"].items():
        first, last = figures["p50_first_tenth_ms"], figures["p50_last_tenth_ms"]
        if ratio(last, first) > DRIFT_FACTOR:
            notes.append(f"{path} at {point['pending']:,} pending slowed down while measured: p50 {first:.2f} ms "
                         f"over the first tenth of the samples, {last:.2f} ms over the last")
    return notes


def _time_reads(url: str, repeats: int) -> dict:
    from scrapyd.config import Config

    from scrapyd_pgqueue import PostgresSpiderQueue
    from scrapyd_pgqueue.store import JobStore

    queue = PostgresSpiderQueue(Config(values={"database_url": url, "node_name": "bench-reads"}), PROJECTS[0])
    store = JobStore.for_url(url)
    return {
        "count": summarise_ms(time_calls(queue.count, repeats)),
        "list": summarise_ms(time_calls(queue.list, repeats)),
        "list_pending_100": summarise_ms(
            time_calls(lambda: store.list_pending(PROJECTS[0], limit=LIST_PENDING_LIMIT), repeats)
        ),
    }


def _ratios(points: list[dict]) -> dict:
    """Latency at the highest depth over the lowest, for each claim path and percentile."""
    if len(points) < 2:
        return {}
    low, high = points[0], points[-1]
    return {
        _ratio_name(path, percentile, high["pending"], low["pending"]): ratio(
            high["claim_latency"][path][percentile], low["claim_latency"][path][percentile]
        )
        for path in CLAIM_PATHS
        for percentile in PERCENTILES
    }


def _ratio_name(path: str, percentile: str, high: int, low: int) -> str:
    return f"{path} {percentile} at {high} / at {low}"


def _targets(ratios: dict, depths) -> list[dict]:
    high, low = max(depths), min(depths)
    note = "" if high >= 1_000_000 else f"quick mode: measured to {high:,} only"
    return [
        report.target(
            f"claim {percentile[:3]} {path}, {high:,} / {low:,} pending",
            ratios.get(_ratio_name(path, percentile, high, low)),
            "<=",
            LATENCY_TARGET,
            note,
        )
        for path in CLAIM_PATHS
        for percentile in PERCENTILES
    ]


# --- output ----------------------------------------------------------------------------------------------------


def format_table(result: dict) -> str:
    latency = result["series"]["claim_latency"]["points"]
    reads = result["series"]["reads"]["points"]
    latency_rows = []
    for point in latency:
        for path in CLAIM_PATHS:
            figures = point[path]
            latency_rows.append(_latency_row(point["pending"], path, figures))
    for point in result["series"]["claim_latency_small_project"]["points"]:
        latency_rows.append(_latency_row(point["pending"], f"pgqueue_pop, project '{SMALL_PROJECT}'", point))
    read_rows = []
    for point in reads:
        for name in ("count", "list", "list_pending_100"):
            figures = point[name]
            read_rows.append([f"{point['pending']:,}", f"{point['pending_in_project']:,}", name,
                              report.number(figures["p50_ms"], 2), report.number(figures["max_ms"], 2)])
    parameters = result["parameters"]
    return report.table_text(result, [
        report.heading("Depth"),
        f"one claimer; {parameters['latency_samples']:,} timed claims per path and depth, backlog kept constant; "
        f"{len(parameters['projects'])} projects, 10 priority levels",
        report.format_rows(["pending", "claim path", "p50 ms", "p99 ms", "mean ms", "samples",
                            "p50 first 10%", "p50 last 10%"], latency_rows),
        f"project '{SMALL_PROJECT}': {SMALL_PROJECT_JOBS} jobs at priority {SMALL_PROJECT_PRIORITY:g}, below the "
        "whole backlog (not a target; see notes)",
        "",
        f"reads on project {parameters['read_project']} ({parameters['read_repeats']} calls each): "
        "PostgresSpiderQueue.count(), .list(), JobStore.list_pending(limit=100)",
        report.format_rows(["pending", "in project", "read", "p50 ms", "max ms"], read_rows),
        "",
    ])


def _latency_row(pending: int, path: str, figures: dict) -> list[str]:
    return [f"{pending:,}", path, *(report.number(figures[key], 3) for key in ("p50_ms", "p99_ms", "mean_ms")),
            str(figures["samples"]),
            *(report.number(figures[key], 3) for key in ("p50_first_tenth_ms", "p50_last_tenth_ms"))]


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    latency = result["series"]["claim_latency"]["points"]
    reads = result["series"]["reads"]["points"]
    depths = [point["pending"] for point in latency]

    figure, axes = plt.subplots(figsize=(8, 5))
    for path in CLAIM_PATHS:
        for percentile, style in (("p50_ms", "-o"), ("p99_ms", "--s")):
            axes.plot(depths, [point[path][percentile] for point in latency], style,
                      label=f"{path} {percentile[:3]}")
    small = result["series"]["claim_latency_small_project"]["points"]
    axes.plot(depths, [point["p50_ms"] for point in small], ":^", label=f"pgqueue_pop p50, project '{SMALL_PROJECT}'")
    _depth_axes(axes, depths, "claim latency (ms, log)", "Claim latency by queue depth (one claimer)")
    axes.set_yscale("log")
    paths = [report.save_figure(plt, figure, directory / "depth_claim_latency.png")]

    figure, axes = plt.subplots(figsize=(8, 5))
    for name in ("count", "list", "list_pending_100"):
        axes.plot(depths, [point[name]["p50_ms"] for point in reads], "-o", label=f"{name} p50")
    _depth_axes(axes, depths, "ms (log)", "Reads by queue depth (one project = 1/5 of the jobs)")
    axes.set_yscale("log")
    paths.append(report.save_figure(plt, figure, directory / "depth_reads.png"))
    return paths


def _depth_axes(axes, depths, ylabel: str, title: str) -> None:
    axes.set_xscale("log")
    axes.set_xticks(depths, [f"{depth:,}" for depth in depths])
    report.finish_axes(axes, title=title, xlabel="pending jobs", ylabel=ylabel, grid="both")
