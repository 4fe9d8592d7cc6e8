"""The soak's table and plot."""

from __future__ import annotations

from pathlib import Path

from bench import report


def _ms(value) -> str:
    return report.number(value, 0)


def _spread(values) -> str:
    return "-" if not values else f"{values[0]:,.0f}-{values[1]:,.0f}"


def format_table(result: dict) -> str:
    soak = result["series"]["soak"]
    jobs, schedule, parameters = soak["jobs"], soak["schedule"], result["parameters"]
    lines = [
        report.heading("Soak (issue 47)"),
        f"{parameters['nodes']} nodes, {parameters['rate']:g} jobs/s for {parameters['seconds']:g} s, a node SIGKILLed "
        f"every {parameters['restart_every']:g} s ({len(soak['restarts'])} restarts); Postgres autovacuum "
        f"{parameters['postgres']['autovacuum']}",
        f"jobs: {jobs['scheduled']} scheduled, {jobs['accepted']} accepted, {jobs['unique_existing']} unique-key "
        f"hits, cancels by prevstate {jobs['cancels']}; {jobs['expected_to_run']} to run (not cancelled), {jobs['ran']} ran "
        f"({jobs['cancelled_running_spider_created']} of {jobs['cancelled_running']} cancelled running had a spider)",
        f"ran twice {len(jobs['ran_twice'])} ({len(jobs['ran_twice_after_node_kill'])} after their node's SIGKILL, "
        f"{len(jobs['ran_twice_at_once'])} at once), lost {len(jobs['lost'])}, cancelled-while-waiting ran "
        f"{len(jobs['cancelled_waiting_ran'])}, unique hits ran {len(jobs['existing_ran'])}, started not closed "
        f"{len(jobs['started_not_closed'])} ({len(jobs['started_not_closed_cancelled'])} of them cancelled)",
        f"schedule.json: {schedule['calls']} calls, {len(schedule['errors'])} errors, p50 {_ms(schedule['p50_ms'])} ms, "
        f"p99 {_ms(schedule['p99_ms'])} ms, max {_ms(schedule['max_ms'])} ms; per-minute p99 without a restart "
        f"{_spread(schedule['p99_ms_without_restart'])} ms, with one {_spread(schedule['p99_ms_with_restart'])} ms",
        "",
        report.format_rows(["minute", "restart", "calls", "p50 ms", "p99 ms", "max ms"],
                           [[str(m["minute"]), "yes" if m["restart"] else "", str(m["calls"]), _ms(m["p50_ms"]),
                             _ms(m["p99_ms"]), _ms(m["max_ms"])] for m in schedule["minutes"]]),
        "",
        report.format_rows(["slowest call at s", "ms", "node", "s after own node ready", "s after last restart ready",
                            "last restarted"],
                           [[report.number(s["at_s"], 1), _ms(s["ms"]), s["node"],
                             report.number(s["after_own_ready_s"], 2), report.number(s["after_last_restart_ready_s"], 2),
                             s["last_restart_node"] or "-"] for s in schedule["slowest"]]),
        "",
        report.format_rows(["table", "first", "max", "last", "dead max", "dead last", "live last", "VACUUMs"],
                           [[name, report.megabytes(t["first_bytes"]), report.megabytes(t["max_bytes"]),
                             report.megabytes(t["last_bytes"]), report.number(t["max_dead"]),
                             report.number(t["last_dead"]), report.number(t["last_live"]), report.number(t["vacuums"])]
                            for name, t in soak["tables"].items()]),
        "",
        report.format_rows(["node", "connections max", "last", "by role (last)", "RSS first", "RSS last", "growth"],
                           [[node, str(c["max"]), str(c["last"]), str(c["roles_last"]),
                             report.megabytes(soak["rss"].get(node, {}).get("first")),
                             report.megabytes(soak["rss"].get(node, {}).get("last")),
                             f"{soak['rss'][node]['growth'] * 100:+.1f}%" if node in soak["rss"] else "-"]
                            for node, c in soak["connections"].items()]),
        "",
        f"log lines: nodes' logs {soak['logs']['node_logs']}; crawls' logs {soak['logs']['crawl_logs']}",
        *(f"  {line}" for line in soak["logs"]["examples"]),
        "",
        *(f"odd job {job}: {odd['plan'].get('kind')}, cancel {odd['plan'].get('cancel')}, runs {odd['runs']}, "
          f"closes {odd['ends']}" for job, odd in soak["odd_jobs"].items()),
        "",
    ]
    return report.table_text(result, lines)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    soak = result["series"]["soak"]
    started = soak["window"]["started"]
    figure, (calls, tables) = plt.subplots(1, 2, figsize=(12, 4))
    minutes = soak["schedule"]["minutes"]
    calls.plot([m["minute"] for m in minutes], [m["p99_ms"] for m in minutes], marker="o", label="p99")
    calls.plot([m["minute"] for m in minutes], [m["p50_ms"] for m in minutes], marker=".", label="p50")
    for restart in soak["restarts"]:
        calls.axvline((restart["ready"] - started) / 60, color="tab:red", alpha=0.3)
    calls.set_yscale("log")
    report.finish_axes(calls, title="schedule.json per minute (red: a node ready again)", xlabel="minute",
                       ylabel="ms")
    for name in ("spider_job", "job_log", "scrapyd_node"):
        points = [((s["at"] - started) / 60, s["tables"][name]["bytes"] / 2**20) for s in soak["samples"]
                  if name in s["tables"]]
        tables.plot(*zip(*points), marker=".", label=name)
    report.finish_axes(tables, title="table sizes, autovacuum off", xlabel="minute", ylabel="MB")
    return [report.save_figure(plt, figure, directory / "soak.png")]
