"""Wake-up: from a ``schedule.json`` response to the crawl process being spawned, over three real Scrapyd nodes.

For each mode (LISTEN/NOTIFY on, then polling only) a fresh ``LocalCluster`` of ``NODES`` real Scrapyd nodes is
started on the bench's database (``max_proc`` 2, Scrapyd's default ``poll_interval`` 5 s, ``listen_notify`` on or
off) and left to become idle (every node answers, every node's listener is connected when NOTIFY is on, and
every node has run ``scrapy list`` once, which Scrapyd caches). Then, one job at a time, ``schedule.json`` is
POSTed to the nodes in turn (project ``example``, spider ``sleeper``, a unique job id); the wall clock is read
right after the HTTP response, and the job's row is watched until the launcher has recorded the crawl's pid.
The row's ``start_time`` is then the launcher's ``datetime.now()`` just before ``spawnProcess`` (naive local
time, the same clock as the bench's ``datetime.now()``): latency = start_time - response time. It can be slightly
negative (the spawn can beat the HTTP response); the signed value is kept. Each job is waited for until it has
finished, then a seeded random pause keeps scheduling out of step with the nodes' poll timers: 0-1 s with NOTIFY,
0-5 s (one poll interval) when polling only, since a shorter pause phase-locks with the timer (see PAUSE_SECONDS).

Scrapy's own start-up (about 0.4 s of Python and Scrapy imports before the spider exists) comes after the spawn:
it is excluded, and no queue can remove it.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import random
import statistics
import time
import uuid
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.stats import percentile, ratio

SUMMARY = "schedule.json to crawl-process spawn latency over 3 real Scrapyd nodes, NOTIFY against polling only"
SERIES = ("notify", "polling")

NODES = 3
MAX_PROC = 2
POLL_INTERVAL = 5.0  # Scrapyd's default
MODES = {"notify": "on", "polling": "off"}  # series name -> listen_notify
PROJECT, SPIDER = "example", "sleeper"
# Jobs per mode. Quick is the CI smoke test (all suites under 2 minutes, this one ~45 s): a job costs ~2.7 s with
# NOTIFY (a crawl through scrapyd.runner takes ~2.2 s here, plus the pause) and ~6 s polling only (wait for a tick,
# crawl, a pause of up to one interval), and each mode starts a cluster (~6.5 s).
JOBS = {"quick": {"notify": 5, "polling": 3}, "full": {"notify": 40, "polling": 40}}
# Upper bound of the seeded random pause after each job, per mode. Polling: a whole poll interval. A crawl here takes
# 2.5-5 s, close to the 5 s interval, and with a 0-1 s pause the next schedule.json kept landing at the same point
# of the nodes' timer cycle (measured: latencies either ~0.2 s or ~4.5 s, mean 2.8 s). A pause uniform over one
# interval makes the schedule's phase against any timer uniform, whatever the crawl's duration. NOTIFY does not
# depend on the timer: 0-1 s is enough there.
PAUSE_SECONDS = {"notify": 1.0, "polling": POLL_INTERVAL}
RANDOM_SEED = 20240613
START_DEADLINE = POLL_INTERVAL * 2 + 20.0  # seconds for a job to be spawned before the run gives up
FINISH_DEADLINE = 60.0  # seconds for a spawned crawl to finish
IDLE_DEADLINE = 60.0
WATCH_PERIOD = 0.01  # how often the job's row is read (the latency comes from the row, not from this)
NOTIFY_P50_TARGET_MS = 50.0
NOTIFY_P99_TARGET_MS = 250.0
RATIO_FLOOR_MS = 1.0  # NOTIFY latencies are within a few ms of 0, either side: a plain ratio would be meaningless

JOB_ROW = "SELECT pid, start_time, status, outcome, node FROM spider_job WHERE project = %s AND job = %s"
LIVE_JOBS = "SELECT count(*) FROM spider_job WHERE status IN ('pending', 'ongoing')"
LISTENERS = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE 'scrapyd-pgqueue-listener %%'
"""


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    jobs = JOBS[ctx.profile.name]
    pauses = random.Random(RANDOM_SEED)
    series = {}
    for name, listen_notify in MODES.items():
        _clear_queue(ctx.database_url)
        config = {"max_proc": str(MAX_PROC), "poll_interval": f"{POLL_INTERVAL:g}", "listen_notify": listen_notify}
        ctx.log(f"wakeup: starting {NODES} nodes, listen_notify {listen_notify}")
        started = time.monotonic()
        with LocalCluster(ctx.database_url, NODES, directory=ctx.workdir / f"wakeup-{name}", config=config) as cluster:
            _wait_idle(ctx, cluster, listening=listen_notify == "on")
            ctx.log(f"wakeup: {name}: nodes idle after {time.monotonic() - started:.1f} s; {jobs[name]} jobs")
            ready = time.monotonic()
            samples = [_one_job(ctx, cluster, name, index, pauses, PAUSE_SECONDS[name])
                       for index in range(jobs[name])]
            measured = time.monotonic()
        series[name] = {"listen_notify": listen_notify, **_summarise(samples),
                        "start_up_s": ready - started, "jobs_s": measured - ready, "jobs": samples}
        ctx.log(f"wakeup: {name}: p50 {series[name]['p50_ms']:.1f} ms, p99 {series[name]['p99_ms']:.1f} ms")
    _clear_queue(ctx.database_url)
    ratios = _ratios(series)
    return {
        "parameters": {
            "nodes": NODES,
            "max_proc": MAX_PROC,
            "poll_interval": POLL_INTERVAL,
            "jobs_per_mode": jobs,
            "project": PROJECT,
            "spider": SPIDER,
            "pause_seconds": {name: [0.0, longest] for name, longest in PAUSE_SECONDS.items()},
            "random_seed": RANDOM_SEED,
        },
        "series": series,
        "ratios": ratios,
        "targets": [
            report.target("NOTIFY p50 (ms)", series["notify"]["p50_ms"], "<=", NOTIFY_P50_TARGET_MS,
                          "schedule.json response -> spawnProcess"),
            report.target("NOTIFY p99 (ms)", series["notify"]["p99_ms"], "<=", NOTIFY_P99_TARGET_MS,
                          f"nearest rank of {jobs['notify']} samples"
                          + (": the maximum" if jobs["notify"] < 100 else "")),
        ],
        "notes": _notes(series),
    }


def _ratios(series: dict) -> dict:
    """polling / NOTIFY, each NOTIFY figure floored at RATIO_FLOOR_MS: it is signed and can be 0 or negative."""
    ratios = {}
    for statistic in ("p50_ms", "mean_ms", "p99_ms"):
        notify = series["notify"][statistic]
        ratios[f"polling / notify {statistic[:-3]} (notify floored at {RATIO_FLOOR_MS:g} ms)"] = ratio(
            series["polling"][statistic], max(notify, RATIO_FLOOR_MS))
    for statistic in ("p50_ms", "mean_ms"):
        ratios[f"polling - notify {statistic[:-3]} (ms)"] = series["polling"][statistic] - series["notify"][statistic]
    return ratios


def _clear_queue(url: str) -> None:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(database.TRUNCATE_SPIDER_JOB)


def _wait_idle(ctx: Context, cluster, listening: bool) -> None:
    """Every node idle: ``scrapy list`` cached (a node's first schedule.json runs it), listeners connected."""
    # Fills each node's spider-list cache (``scrapy list`` in a subprocess), all nodes at once.
    with concurrent.futures.ThreadPoolExecutor(len(cluster.nodes)) as pool:
        for answer in pool.map(lambda node: node.get("listspiders.json", timeout=60, project=PROJECT), cluster.nodes):
            if SPIDER not in answer.get("spiders", ()):
                raise RuntimeError(f"wakeup: spider {SPIDER} not in project {PROJECT}: {answer}")
    deadline = time.monotonic() + IDLE_DEADLINE
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute(LIVE_JOBS)
            live = cursor.fetchone()[0]
            cursor.execute(LISTENERS)
            listeners = cursor.fetchone()[0]
            if live == 0 and (not listening or listeners >= len(cluster.nodes)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"wakeup: nodes not idle after {IDLE_DEADLINE:g} s "
                                   f"({live} live jobs, {listeners} listeners)")
            time.sleep(0.1)
    time.sleep(0.3)  # let the start-up's own first ticks and claims pass


def _one_job(ctx: Context, cluster, mode: str, index: int, pauses: random.Random, longest_pause: float) -> dict:
    node = cluster.nodes[index % len(cluster.nodes)]
    job = f"wakeup-{mode}-{index}-{uuid.uuid4().hex[:8]}"
    sent = datetime.datetime.now().astimezone()  # start_time is on the database's clock, aware (0007)
    answer = node.post("schedule.json", project=PROJECT, spider=SPIDER, jobid=job)
    responded = datetime.datetime.now().astimezone()
    if answer.get("status") != "ok":
        raise RuntimeError(f"wakeup: schedule.json on {node.name} refused job {job}: {answer}")
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        row = _watch(cursor, job, lambda row: row is not None and row[0] is not None, START_DEADLINE,
                     f"spawned (pid recorded) within {START_DEADLINE:g} s", cluster)
        pid, start_time, _, _, ran_on = row
        latency = (start_time - responded).total_seconds()
        spawned = time.monotonic()
        finished = _watch(cursor, job, lambda row: row is None or row[2] == "terminated", FINISH_DEADLINE,
                          f"finished within {FINISH_DEADLINE:g} s", cluster)
    crawl = time.monotonic() - spawned
    pause = pauses.uniform(0.0, longest_pause)
    time.sleep(pause)
    return {
        "job": job,
        "scheduled_on": node.name,
        "ran_on": ran_on,
        "latency_ms": latency * 1000,
        "from_request_ms": (start_time - sent).total_seconds() * 1000,  # never negative: the answer's way included
        "outcome": None if finished is None else finished[3],
        "crawl_s": crawl,  # from the pid seen in the row to the row terminated: not a measure, the run's cost
        "pause_s": pause,
    }


def _watch(cursor, job: str, done, timeout: float, what: str, cluster):
    deadline = time.monotonic() + timeout
    while True:
        cursor.execute(JOB_ROW, (PROJECT, job))
        row = cursor.fetchone()
        if done(row):
            return row
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {node.name}:\n{node.log_tail(10)}" for node in cluster.nodes)
            raise RuntimeError(f"wakeup: job {job} not {what} (row {row})\n{tails}")
        time.sleep(WATCH_PERIOD)


def _summarise(samples: list[dict]) -> dict:
    latencies = [sample["latency_ms"] for sample in samples]
    return {
        "samples": len(latencies),
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "mean_ms": statistics.fmean(latencies),
        "min_ms": min(latencies),
        "max_ms": max(latencies),
        "negative": sum(1 for value in latencies if value < 0),
        "ran_on_scheduling_node": sum(1 for sample in samples if sample["ran_on"] == sample["scheduled_on"]),
        "outcomes": _counts(sample["outcome"] for sample in samples),
    }


def _counts(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def _notes(series: dict) -> list[str]:
    polling = series["polling"]
    notes = [
        "latency = the job row's start_time (launcher's datetime.now() just before spawnProcess) - the bench's "
        "datetime.now() right after the schedule.json response; signed: negative when the spawn beat the response "
        f"(notify: {series['notify']['negative']}, polling: {polling['negative']} of "
        f"{series['notify']['samples']} / {polling['samples']})",
        "Scrapy's own start-up (~0.4 s of imports before the spider exists) comes after the spawn and is "
        "excluded; no queue can remove it",
        f"polling only: {NODES} nodes tick every {POLL_INTERVAL:g} s each; with independent phases the first tick "
        f"after a schedule comes {POLL_INTERVAL / (NODES + 1):.2f} s later on average ({POLL_INTERVAL / 2:.1f} s for "
        "Scrapyd's single node); nodes started together have close phases, which moves it towards "
        f"{POLL_INTERVAL / 2:.1f} s. Measured mean {polling['mean_ms'] / 1000:.2f} s",
        f"random pause after each finished job: 0-{PAUSE_SECONDS['notify']:g} s with NOTIFY, "
        f"0-{PAUSE_SECONDS['polling']:g} s polling only (a 0-1 s pause phase-locked with the 5 s timer when a crawl "
        "took ~4.5 s)",
    ]
    for name, data in series.items():
        bad = {outcome: n for outcome, n in data["outcomes"].items() if outcome not in ("finished", "None")}
        if bad:
            notes.append(f"{name}: crawl outcomes other than finished: {bad}")
    return notes


# --- output ----------------------------------------------------------------------------------------------------


def format_table(result: dict) -> str:
    parameters, series = result["parameters"], result["series"]
    rows = [
        [name, data["listen_notify"], report.number(data["samples"]), report.number(data["p50_ms"], 1),
         report.number(data["p99_ms"], 1), report.number(data["mean_ms"], 1), report.number(data["min_ms"], 1),
         report.number(data["max_ms"], 1), f"{data['ran_on_scheduling_node']}/{data['samples']}"]
        for name, data in series.items()
    ]
    timing_rows = [[name, report.number(data["start_up_s"], 1), report.number(data["jobs_s"], 1),
                    report.number(statistics.median(job["crawl_s"] for job in data["jobs"]), 2)]
                   for name, data in series.items()]
    lines = [
        report.heading("Wake-up"),
        f"{parameters['nodes']} real Scrapyd nodes (max_proc {parameters['max_proc']}, poll_interval "
        f"{parameters['poll_interval']:g} s), one job at a time, schedule.json round-robin; latency = spawn "
        "(row start_time) - schedule.json response, in ms, signed",
        report.format_rows(["mode", "listen_notify", "jobs", "p50 ms", "p99 ms", "mean ms", "min ms", "max ms",
                            "ran on scheduling node"], rows),
        "",
        report.format_ratios(result, digits=1),
        "",
        report.format_rows(["mode", "nodes start + idle (s)", "jobs (s)", "crawl median (s)"], timing_rows),
        "",
    ]
    return report.table_text(result, lines)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(8, 5))
    for name, data in result["series"].items():
        latencies = sorted(job["latency_ms"] for job in data["jobs"])
        fractions = [(rank + 1) / len(latencies) for rank in range(len(latencies))]
        axes.step(latencies, fractions, where="post", marker=".",
                  label=f"{name} (listen_notify {data['listen_notify']})")
    for target_ms in (NOTIFY_P50_TARGET_MS, NOTIFY_P99_TARGET_MS):
        axes.axvline(target_ms, color="grey", linestyle=":", linewidth=1)
    axes.set_xscale("symlog", linthresh=10)
    parameters = result["parameters"]
    title = f"Wake-up latency, {parameters['nodes']} Scrapyd nodes, poll_interval {parameters['poll_interval']:g} s"
    xlabel = "schedule.json response -> crawl spawned (ms, symlog; dotted: NOTIFY targets 50 / 250 ms)"
    report.finish_axes(axes, title=title, xlabel=xlabel, ylabel="fraction of jobs")
    return [report.save_figure(plt, figure, directory / "wakeup_latency.png")]
