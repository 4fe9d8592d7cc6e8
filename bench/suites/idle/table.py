"""The idle suite's table: one row per cell and poller."""

from __future__ import annotations

from bench import report
from bench.suites.idle.figures import _point
from bench.suites.idle.settings import SERIES


def format_table(result: dict) -> str:
    parameters, series = result["parameters"], result["series"]
    with_statements = any(point["server_statements_per_tick"] is not None
                          for kind in SERIES for point in series[kind]["points"])
    rows = []
    for nodes in parameters["nodes"]:
        for projects in parameters["projects"]:
            for kind in SERIES:
                point = _point(series, kind, nodes, projects)
                row = [f"K={nodes} P={projects}", kind,
                       report.number(point["statements_per_tick"], 2),
                       report.number(point["transactions_per_tick"], 2),
                       report.number(point["statements_per_second_at_default"], 1),
                       report.number(point["transactions_per_second_at_default"], 1)]
                if with_statements:
                    row.append(report.number(point["server_statements_per_second_at_default"], 1))
                row += [report.number(point["statements_per_second_simulated"], 0),
                        f"{point['ticks']:,} / {point['window_seconds']:.1f} s ({point['ticks_on_time']:.0%})",
                        f"{point['transactions_unexplained']:+d}"]
                rows.append(row)
    headers = ["nodes x projects", "poller", "stmt/tick", "xact/tick", "stmt/s @5s", "xact/s @5s"]
    if with_statements:
        headers.append("server stmt/s @5s")
    headers += [f"stmt/s @{parameters['simulated_poll_interval']:g}s sim", "ticks / window (on time)",
                "xact unexplained"]
    lines = [
        report.heading("Idle load"),
        f"K simulated idle nodes with P projects, empty queue: real poller objects ({parameters['max_proc']} free "
        f"slots each, listen_notify {parameters['listen_notify']}) ticking every "
        f"{parameters['simulated_poll_interval']:g} s "
        f"in one process. stmt = statements the pollers send (client-side, SQLAlchemy); xact = transactions the server "
        f"counted (pg_stat_database). Per tick = per node; @5s = all K nodes at Scrapyd's default "
        f"{parameters['reported_at_poll_interval']:g} s interval; sim = achieved by the simulation",
        report.format_rows(headers, rows),
        "",
    ]
    return report.table_text(result, lines, ratios="ratio (statements per tick)")
