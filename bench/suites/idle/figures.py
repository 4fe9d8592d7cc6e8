"""The idle suite's ratios and notes, and reading one cell of the grid."""

from __future__ import annotations

from bench.stats import ratio
from bench.suites.idle.settings import DEFAULT_POLL_INTERVAL, LISTEN_NOTIFY, SERIES, Sizes


def _point(series: dict, kind: str, nodes: int, projects: int) -> dict | None:
    for point in series[kind]["points"]:
        if point["nodes"] == nodes and point["projects"] == projects:
            return point
    return None


def _growth_name(kind: str, nodes: int, sizes: Sizes) -> str:
    return f"{kind} K={nodes}: statements/s P={max(sizes.projects)} / P={min(sizes.projects)}"


def _ratios(series: dict, sizes: Sizes) -> dict:
    low, high = min(sizes.projects), max(sizes.projects)
    ratios = {}
    for kind in SERIES:
        for nodes in sizes.nodes:
            ratios[_growth_name(kind, nodes, sizes)] = ratio(
                _point(series, kind, nodes, high)["statements_per_tick"],
                _point(series, kind, nodes, low)["statements_per_tick"])
    for kind in SERIES:
        nodes = max(sizes.nodes)
        ratios[f"{kind} K={nodes}: server transactions/s P={high} / P={low}"] = ratio(
            _point(series, kind, nodes, high)["transactions_per_tick"],
            _point(series, kind, nodes, low)["transactions_per_tick"])
    for nodes in sizes.nodes:
        for projects in sizes.projects:
            ratios[f"stock / pgqueue statements/s, K={nodes} P={projects}"] = ratio(
                _point(series, "stock", nodes, projects)["statements_per_tick"],
                _point(series, "pgqueue", nodes, projects)["statements_per_tick"])
    return ratios


def _notes(series: dict, sizes: Sizes, statements_source: str | None) -> list[str]:
    notes = [
        "Scrapyd's QueuePoller calls count() for every project on every tick, on every node: its "
        "idle load grows with nodes x projects; PostgresPoller sends one claim per tick whatever the projects",
        f"simulated at a {sizes.interval:g} s interval; per-second figures are per tick x K / "
        f"{DEFAULT_POLL_INTERVAL:g} s (Scrapyd's default interval), per tick figures are per node",
        f"listen_notify {LISTEN_NOTIFY} for the measure: with it on (as nodes run), each pgqueue node adds one LISTEN "
        "connection, which sends LISTEN once at connect and nothing while idle; with it on, the server would count "
        "that LISTEN transaction late, inside the window",
        "stmt = client-side count (SQLAlchemy before_cursor_execute on the package's engine): the SQL the pollers "
        "send, one count() or one claim each, each in autocommit with the package's SET LOCAL timeouts in the same "
        "query string (one round trip, one transaction). Nothing else goes to the server: no BEGIN/COMMIT, and no "
        "ping (a pooled connection is checked by looking at its socket, scrapyd_pgqueue.database.db)",
        "xact = pg_stat_database xact_commit + xact_rollback deltas of the bench database, exact: ticking stops and "
        "the pool is closed at both ends of the window, so every backend has reported; the bench's own reads and "
        "the connections the simulation opens are subtracted. 'xact unexplained' = xact - stmt: what the "
        "client side does not account for (autovacuum, ...)",
    ]
    if statements_source is None:
        notes.append("pg_stat_statements is not in shared_preload_libraries of this server: no server-side "
                     "statement count; each count() or claim is one query string on the wire (the SET LOCAL prefix and the "
                     "statement), one autocommit transaction")
    else:
        notes.append("server stmt = pg_stat_statements calls in the bench database (each query string counts "
                     "three: the two SET LOCAL of the prefix and the statement), the bench's own reads subtracted")
    behind = [p for kind in SERIES for p in series[kind]["points"] if p["ticks_on_time"] < 0.9]
    if behind:
        worst = min(behind, key=lambda p: p["ticks_on_time"])
        notes.append(
            f"the simulation fell behind its interval in {len(behind)} cell(s) (worst: {worst['poller']} K="
            f"{worst['nodes']} P={worst['projects']}, {worst['ticks_on_time']:.0%} of ticks on time): the stock "
            "poller's synchronous count() blocks the reactor; per-tick figures are unaffected")
    errors = [p for kind in SERIES for p in series[kind]["points"] if p["errors"]]
    for point in errors:
        notes.append(f"{point['poller']} K={point['nodes']} P={point['projects']}: poll loops stopped: "
                     f"{point['errors'][:2]}")
    return notes
