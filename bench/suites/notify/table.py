"""The notify suite's table and plot."""

from __future__ import annotations

from pathlib import Path

from bench import report

DESIGN_NAMES = {"slots": "listen slots", "listen": "every session listens"}


def format_table(result: dict) -> str:
    rows = []
    for mode in ("busy", "wanting"):
        for data in result["series"][mode].values():
            for way in ("schedule", "enqueue"):
                figures = data[way]
                latency = (f"{figures['answer_p50_ms']:.1f} / {figures['answer_p99_ms']:.1f}" if way == "schedule"
                           else f"{figures['batch_ms']:.1f} a batch")
                tries = figures["slot_tries"] / figures["seconds"] if figures["seconds"] else None
                cores = " / ".join(report.number(figures["cpu_s"].get(name, 0.0) / figures["seconds"], 2)
                                   for name in ("client", "backends", "machine_busy"))
                rows.append([mode, report.number(data["sessions"]), DESIGN_NAMES[data["design"]],
                             report.number(data["listening"]), way, report.number(figures["jobs"]),
                             report.number(figures["jobs_per_s"]), latency,
                             report.number(figures["notifies_per_listener"], 1),
                             report.number(figures["heard_by_pollers"]), report.number(figures["heard_by_stand_in"]),
                             report.number(tries), report.number(figures["slot_try_mean_ms"], 2),
                             report.number(figures["slots_won_by_pollers"]), cores])
    pickups = [[report.number(data["sessions"]), DESIGN_NAMES[data["design"]], report.number(data["samples"]),
                report.number(data["p50_ms"], 1), report.number(data["p99_ms"], 1), report.number(data["max_ms"], 1),
                report.number(data["from_request_p50_ms"], 1), report.number(data["from_request_p99_ms"], 1),
                f"{data['node_held_a_slot_after']} / {data['samples']}", report.number(data["listening"]),
                report.number(data["notifications_received"]), report.number(data["heard_by_pollers"]),
                report.number(data["slots_won_by_pollers"])]
               for data in result["series"]["pickup"].values()]
    return report.table_text(result, [
        report.heading("NOTIFY with idle nodes' sessions: listen slots against every session listening"),
        report.format_rows(["mode", "sessions", "design", "listening", "way in", "jobs", "jobs/s",
                            "answer p50 / p99 ms", "notifies per listener", "heard by pollers",
                            "heard by stand-in", "slot tries/s", "try ms", "slots won",
                            "cores: sessions / their backends / machine"], rows),
        "",
        report.format_rows(["sessions", "design", "pickups", "p50 ms", "p99 ms", "max ms", "from request p50 ms",
                            "from request p99 ms", "node held its slot", "listening", "heard by listeners",
                            "heard by pollers", "slots won"], pickups),
        "",
    ], ratios="ratio")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(7, 4))
    for mode, marker in (("busy", "o"), ("wanting", "s")):
        for design, style in (("slots", "-"), ("listen", "--")):
            rows = sorted((data for data in result["series"][mode].values()
                           if data["design"] == design or data["sessions"] == 0), key=lambda data: data["sessions"])
            if not any(data["design"] == design for data in rows):
                continue
            axes.plot([max(data["sessions"], 1) for data in rows], [data["schedule"]["jobs_per_s"] for data in rows],
                      marker=marker, linestyle=style, label=f"schedule.json, {mode}, {DESIGN_NAMES[design]}")
    axes.set_xscale("log")
    report.finish_axes(axes, title="schedule.json from 8 clients against idle nodes' sessions",
                       xlabel="idle nodes' sessions (0 drawn at 1)", ylabel="jobs per second")
    return [report.save_figure(plt, figure, directory / "notify.png")]
