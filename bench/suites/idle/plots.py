"""The idle suite's plot: statements per second against nodes, per poller and projects."""

from __future__ import annotations

from pathlib import Path

from bench import report
from bench.suites.idle.figures import _point
from bench.suites.idle.settings import SERIES


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    parameters, series = result["parameters"], result["series"]
    figure, axes = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"pgqueue": dict(linestyle="-", marker="o", markersize=10, markerfacecolor="none"),
              "stock": dict(linestyle="--", marker="s", markersize=5)}
    for kind in SERIES:
        for number, projects in enumerate(parameters["projects"]):
            points = [_point(series, kind, nodes, projects) for nodes in parameters["nodes"]]
            axes.plot(parameters["nodes"], [p["statements_per_second_at_default"] for p in points],
                      color=colours[number % len(colours)], label=f"{kind} (PostgresPoller)" if kind == "pgqueue"
                      else f"{kind} (QueuePoller)", **styles[kind])
            axes.lines[-1].set_label(f"{axes.lines[-1].get_label()}, P={projects}")
    report.log_axes(axes, parameters["nodes"], [str(nodes) for nodes in parameters["nodes"]])
    interval = parameters["reported_at_poll_interval"]
    report.finish_axes(axes, title="Idle load on Postgres (client-side statements; pgqueue lines coincide for every P)",
                       xlabel="idle nodes (K)", ylabel=f"statements/s, all nodes, at poll_interval {interval:g} s",
                       grid="both")
    return [report.save_figure(plt, figure, directory / "idle_statements.png")]
