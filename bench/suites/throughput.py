"""Claim throughput: claims per second with 1, 4, 16 (and 64) claimer processes, for every claim path.

Every run starts from the same state: the backlog its path reads is refilled to ``throughput_backlog`` pending
jobs (Postgres tables: TRUNCATE, one INSERT ... SELECT generate_series, VACUUM ANALYZE; Scrapyd's sqlite file:
recreated). Then the first ``n`` processes of one spawned pool build their claimer, make one untimed warm-up
claim, meet at a barrier and claim for ``run_seconds``. Rate = claims of all processes / the longest process's
time. Paths run one after another at each level and their order rotates between repeats, so each ratio
compares runs minutes apart at most; the median of the repeats is reported.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench import database, pgbench, report
from bench.claimers import KINDS, ClaimRun, claim_0013_statement
from bench.context import Context
from bench.stats import ratio
from bench.workers import ClaimerPool, WorkerResult

SUMMARY = "claims per second with 1-64 concurrent claimer processes: our paths, the seed, sqlite, the ceiling"
SERIES = tuple(KINDS)

PROJECT = "bench"
TARGET_CLAIMERS = 16

# (numerator, denominator): the ratios printed at every level.
RATIOS = (
    ("pgqueue_pop", "lean_claim"),
    ("bare_claim_statement", "lean_claim"),
    ("pgqueue_pop", "bare_claim_statement"),
    ("pgqueue_claim_next_jobs", "bare_claim_statement"),
    ("pgqueue_pop", "seed_lock_table"),
    ("pgqueue_claim_next_jobs", "seed_lock_table"),
    ("pgqueue_pop", "seed_lock_table_as_published"),
    ("pgqueue_pop", "scrapyd_sqlite"),
    ("bare_claim_statement", "seed_lock_table"),
    ("bare_claim_statement", "claim_0013"),
)

# (numerator, denominator, comparison, limit) at TARGET_CLAIMERS: the goals set for the claim path.
TARGETS = (
    ("pgqueue_pop", "lean_claim", ">=", 0.60),
    ("pgqueue_pop", "bare_claim_statement", ">=", 0.70),
    ("pgqueue_claim_next_jobs", "bare_claim_statement", ">=", 0.70),
    ("pgqueue_pop", "seed_lock_table", ">=", 2.5),
    ("pgqueue_claim_next_jobs", "seed_lock_table", ">=", 2.5),
    ("bare_claim_statement", "claim_0013", ">=", 0.95),  # node pools cost an untagged node nothing
)

SHORT_NAMES = {
    "pgqueue_pop": "(a) pop",
    "pgqueue_claim_next_jobs": "(a) poller",
    "seed_lock_table": "(b) seed",
    "seed_lock_table_as_published": "(b') seed as published",
    "scrapyd_sqlite": "(c) sqlite",
    "bare_claim_statement": "(d) ceiling",
    "lean_claim": "(e) lean",
    "claim_0013": "(f) before pools",
}


def ratio_name(numerator: str, denominator: str) -> str:
    return f"{numerator} / {denominator}"


def run(ctx: Context) -> dict:
    profile = ctx.profile
    runs = _measure_every_cell(ctx)
    series = {kind: _series(kind, runs[kind]) for kind in KINDS}
    ratios = _ratios(series, profile.claimers)
    server_only = _server_only(ctx)
    return {
        "parameters": {
            "claimers": list(profile.claimers),
            "run_seconds": profile.run_seconds,
            "repeats": profile.repeats,
            "backlog": profile.throughput_backlog,
            "project": PROJECT,
            "process_start": "multiprocessing spawn, one pool reused for every run, barrier per run",
            "seed_client": "psycopg2 directly (the article used a SQLAlchemy ORM session)",
        },
        "series": series,
        "server_only": server_only,
        "ratios": ratios,
        "targets": _targets(ratios),
        "notes": _notes(series),
    }


def _measure_every_cell(ctx: Context) -> dict[str, dict[int, list[dict]]]:
    """Every (path, level) ``repeats`` times: levels in turn, all paths at a level back to back."""
    profile = ctx.profile
    sqlite_dir = ctx.workdir / "scrapyd-dbs"
    sqlite_dir.mkdir(parents=True, exist_ok=True)
    runs = {kind: {level: [] for level in profile.claimers} for kind in KINDS}
    ctx.log(f"throughput: spawning {max(profile.claimers)} claimer processes")
    pool = ClaimerPool(max(profile.claimers), profile.claimers)
    try:
        for level in profile.claimers:
            for repeat in range(profile.repeats):
                for kind in _rotated(list(KINDS), repeat):
                    summary = _measure_once(ctx, pool, kind, level, sqlite_dir)
                    runs[kind][level].append(summary)
                    ctx.log(f"throughput: {kind} x{level} run {repeat + 1}/{profile.repeats}: "
                            f"{summary['claims_per_second']:,.0f} claims/s, {summary['errors']} errors")
    finally:
        pool.close()
    return runs


def _measure_once(ctx: Context, pool: ClaimerPool, kind: str, level: int, sqlite_dir: Path) -> dict:
    _refill(ctx, kind, sqlite_dir)
    claim_run = ClaimRun(kind, ctx.database_url, PROJECT, ctx.profile.run_seconds, str(sqlite_dir))
    return summarise_run(pool.run(claim_run, level))


def _server_only(ctx: Context) -> dict:
    """(d) and (b) sent by pgbench (bench/pgbench.py) at the target level (or the highest run): the server's side
    of each design alone, the ceiling of any client's ratio on a machine whose cores the clients share."""
    profile = ctx.profile
    level = TARGET_CLAIMERS if TARGET_CLAIMERS in profile.claimers else max(profile.claimers)
    scripts = {"bare_claim_statement": pgbench.claim_script(ctx.database_url, PROJECT),
               "seed_lock_table": pgbench.SEED_TRANSACTION,
               "lean_claim": pgbench.lean_claim_script(ctx.database_url),
               "claim_0013": pgbench.claim_script(ctx.database_url, PROJECT, statement=claim_0013_statement())}
    runs = {kind: [] for kind in scripts}
    for repeat in range(profile.repeats):
        for kind in _rotated(list(scripts), repeat):
            _refill(ctx, kind, ctx.workdir)
            runs[kind].append(pgbench.transactions_per_second(ctx.database_url, scripts[kind], level,
                                                              profile.run_seconds))
            ctx.log(f"throughput: server only, {kind} x{level}: {runs[kind][-1]:,.0f} transactions/s (pgbench)")
    rates = {kind: statistics.median(values) for kind, values in runs.items()}
    return {"claimers": level, "transactions_per_second": rates, "runs": runs,
            "ratio": ratio(rates["bare_claim_statement"], rates["seed_lock_table"]),
            "ratio_to_lean": ratio(rates["bare_claim_statement"], rates["lean_claim"]),
            "ratio_to_0013": ratio(rates["bare_claim_statement"], rates["claim_0013"])}


def _rotated(kinds: list[str], shift: int) -> list[str]:
    shift %= len(kinds)
    return kinds[shift:] + kinds[:shift]


def _refill(ctx: Context, kind: str, sqlite_dir: Path) -> None:
    backlog, store = ctx.profile.throughput_backlog, KINDS[kind].store
    if store == "spider_job":
        database.fill_spider_job(ctx.database_url, backlog, [PROJECT], prefix="tp-")
    elif store in (database.LEAN_TABLE, database.CLAIM_0013_TABLE):
        database.fill_spider_job(ctx.database_url, backlog, [PROJECT], prefix="tp-", table=store)
    elif store == "sqlite":
        database.fill_scrapyd_sqlite_queue(sqlite_dir, PROJECT, backlog)
    else:
        database.fill_seed_table(ctx.database_url, store, backlog, PROJECT)


def summarise_run(results: list[WorkerResult]) -> dict:
    claims = sum(result.claims for result in results)
    seconds = max(result.seconds for result in results)
    errors = [result.first_error for result in results if result.first_error]
    return {
        "claims": claims,
        "seconds": seconds,
        "claims_per_second": claims / seconds if seconds else 0.0,
        "errors": sum(result.errors for result in results),
        "empty": sum(result.empty for result in results),
        "first_error": errors[0] if errors else None,
        "per_process_claims": [result.claims for result in results],
    }


def _series(kind: str, runs_by_level: dict[int, list[dict]]) -> dict:
    points = []
    for level, runs in runs_by_level.items():
        points.append(
            {
                "claimers": level,
                "claims_per_second": statistics.median(run["claims_per_second"] for run in runs),
                "errors": sum(run["errors"] for run in runs),
                "empty": sum(run["empty"] for run in runs),
                "runs": runs,
            }
        )
    return {"label": KINDS[kind].label, "points": points}


def _rate(series: dict, kind: str, level: int) -> float:
    for point in series[kind]["points"]:
        if point["claimers"] == level:
            return point["claims_per_second"]
    return float("nan")


def _ratios(series: dict, levels) -> dict:
    return {
        ratio_name(numerator, denominator): {
            str(level): ratio(_rate(series, numerator, level), _rate(series, denominator, level)) for level in levels
        }
        for numerator, denominator in RATIOS
    }


def _targets(ratios: dict) -> list[dict]:
    at = str(TARGET_CLAIMERS)

    def value(numerator, denominator):
        return ratios[ratio_name(numerator, denominator)].get(at)

    return [
        report.target(f"{SHORT_NAMES[numerator]} / {SHORT_NAMES[denominator]}, {at} claimers",
                      value(numerator, denominator), comparison, limit)
        for numerator, denominator, comparison, limit in TARGETS
    ]


def _notes(series: dict) -> list[str]:
    notes = []
    for kind, data in series.items():
        for point in data["points"]:
            if point["empty"]:
                notes.append(f"{kind} x{point['claimers']}: the backlog ran dry ({point['empty']} empty claims)")
            if point["errors"]:
                first = next((run["first_error"] for run in point["runs"] if run["first_error"]), "")
                notes.append(f"{kind} x{point['claimers']}: {point['errors']} errors, first: {first}")
    return notes


# --- output ----------------------------------------------------------------------------------------------------


def format_table(result: dict) -> str:
    parameters = result["parameters"]
    levels = parameters["claimers"]
    header = ["claims per second", *(f"x{level}" for level in levels)]
    rows = [
        [data["label"], *(report.number(_rate(result["series"], kind, level)) for level in levels)]
        for kind, data in result["series"].items()
    ]
    errors = [
        [f"{data['label']}: errors", *(str(point["errors"]) for point in data["points"])]
        for data in result["series"].values()
        if any(point["errors"] for point in data["points"])
    ]
    ratio_rows = [
        [f"{SHORT_NAMES[numerator]} / {SHORT_NAMES[denominator]}",
         *(report.number(result["ratios"][ratio_name(numerator, denominator)][str(level)], 2) for level in levels)]
        for numerator, denominator in RATIOS
    ]
    lines = [
        report.heading("Claim throughput"),
        f"{parameters['backlog']:,} pending jobs refilled before every run; {parameters['repeats']} run(s) of "
        f"{parameters['run_seconds']:g} s per cell, median; xN = N claimer processes",
        report.format_rows(header, rows + errors),
        "",
        report.format_rows(["ratio", *(f"x{level}" for level in levels)], ratio_rows),
        "",
        _format_server_only(result["server_only"]),
        "",
    ]
    return report.table_text(result, lines)


def _format_server_only(server_only: dict) -> str:
    rates = server_only["transactions_per_second"]
    return (f"server side alone (pgbench, {server_only['claimers']} connections, no Python client): (d) claim "
            f"{rates['bare_claim_statement']:,.0f}/s, (b) seed LOCK TABLE {rates['seed_lock_table']:,.0f}/s, "
            f"(e) lean claim {rates['lean_claim']:,.0f}/s, (f) claim before node pools {rates['claim_0013']:,.0f}/s; "
            f"(d) / (b) {server_only['ratio']:.2f}, (d) / (e) {server_only['ratio_to_lean']:.2f}, "
            f"(d) / (f) {server_only['ratio_to_0013']:.2f}")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(8, 5))
    for kind, data in result["series"].items():
        points = data["points"]
        axes.plot([p["claimers"] for p in points], [p["claims_per_second"] for p in points], marker="o",
                  label=data["label"])
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(result["parameters"]["claimers"], [str(level) for level in result["parameters"]["claimers"]])
    report.finish_axes(axes, title="Claim throughput", xlabel="concurrent claimer processes",
                       ylabel="claims per second (log)", grid="both")
    return [report.save_figure(plt, figure, directory / "throughput.png")]
