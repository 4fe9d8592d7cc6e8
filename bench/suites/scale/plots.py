"""The scale suite's plots: claim latency and transactions against nodes, the real nodes' wake-up."""

from __future__ import annotations

from pathlib import Path

from bench import report
from bench.suites.scale.figures import _get
from bench.suites.scale.settings import MODES


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    series = result["series"]
    points = series["simulated"]["points"]
    nodes = [point["nodes"] for point in points]
    paths = []

    figure, axes = plt.subplots(figsize=(8, 5))
    axes.plot(nodes, [p["claim_ms"]["p50"] for p in points], marker="o", label="claim_next_jobs p50")
    axes.plot(nodes, [p["claim_ms"]["p99"] for p in points], marker="s", label="claim_next_jobs p99")
    axes.plot(nodes, [p["heartbeat_ms"]["p99"] for p in points], marker="^", linestyle=":", label="heartbeat p99")
    report.log_axes(axes, nodes)
    report.finish_axes(axes, title="Claim and heartbeat latency against the number of nodes",
                       xlabel="simulated nodes (through PgBouncer, pool 20)", ylabel="latency (ms, log)", grid="both")
    paths.append(report.save_figure(plt, figure, directory / "scale_claim_latency.png"))

    figure, axes = plt.subplots(figsize=(8, 5))
    rate = result["parameters"]["sizes"]["sim_jobs_per_second"]
    axes.plot(nodes, [p["transactions_per_second"] for p in points], marker="o",
              label=f"simulated ({rate:g} jobs/s enqueued): server xact/s")
    axes.plot(nodes, [p["operations_per_second"] for p in points], marker="s", linestyle="--",
              label="simulated: store calls/s (PgBouncer's clients' transactions)")
    for name, marker in (("poll_only", "D"), ("listeners_direct", "v")):
        data = series[name]
        if "idle" not in data:
            continue
        axes.plot([data["nodes"]], [data["idle"]["transactions_per_second"]], marker=marker, linestyle="none",
                  markersize=9, label=f"real nodes idle, {name.replace('_', ' ')} (poll {data['poll_interval']:g} s)")
    report.log_axes(axes, sorted(set(nodes) | {series["poll_only"]["nodes"]}) or [1])
    report.finish_axes(axes, title="Server transactions per second against the number of nodes", xlabel="nodes",
                       ylabel="per second (log)", grid="both")
    paths.append(report.save_figure(plt, figure, directory / "scale_transactions.png"))

    figure, axes = plt.subplots(figsize=(8, 5))
    for name in MODES:
        data = series[name]
        for key, style, what in (("to_spawn_ms_values", "-", "spawn (row start_time)"),
                                 ("to_spider_ms_values", "--", "spider (runs.jsonl)")):
            values = _get(data, "jobs", key) or []
            if values:
                axes.step(values, [(rank + 1) / len(values) for rank in range(len(values))], where="post",
                          linestyle=style, label=f"{name.replace('_', ' ')} (poll {data['poll_interval']:g} s): {what}")
    axes.set_xscale("symlog", linthresh=10)
    report.finish_axes(axes, title=f"Wake-up, {series['poll_only']['nodes']} real nodes behind PgBouncer",
                       xlabel="ms after the schedule.json response (symlog)", ylabel="fraction of jobs")
    paths.append(report.save_figure(plt, figure, directory / "scale_wakeup.png"))
    return paths
