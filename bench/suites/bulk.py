"""Scheduling in bulk: jobs per second into the queue, one ``schedule.json`` each against batches.

Three ways in, on the bench's database, each timed from its first request to its last answer:
- ``schedule.json``: one HTTP request a job to a real Scrapyd node (the only way before batches), one client;
- ``schedule_batch.json``: the same node, batches of 10,000 jobs, one client;
- ``enqueue``: the operator command (``scrapyd-pgqueue enqueue``, a real process) streaming a JSON Lines file,
  start-up included.
The node claims nothing (``poll_interval`` of an hour, no NOTIFY), so every job stays pending and is counted
afterwards: each way must have stored exactly what it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.crawls import post_batch
from bench.stats import ratio

SUMMARY = "jobs per second into the queue: schedule.json one by one, schedule_batch.json, scrapyd-pgqueue enqueue"
SERIES = ("schedule.json", "schedule_batch.json", "enqueue")

SIZES = {"quick": {"schedule.json": 200, "schedule_batch.json": 20_000, "enqueue": 20_000},
         "full": {"schedule.json": 2_000, "schedule_batch.json": 200_000, "enqueue": 1_000_000}}
BATCH = 10_000
TARGET_JOBS_PER_SECOND = 20_000
PENDING = "SELECT count(*) FROM spider_job WHERE status = 'pending' AND job LIKE %s"


def _job(prefix: str, index: int) -> dict:
    return {"spider": "sleeper", "jobid": f"{prefix}-{index:07}", "priority": index % 3,
            "args": {"url": f"https://example.com/listing/{index}"}}


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    sizes = SIZES[ctx.profile.name]
    series = {}
    config = {"poll_interval": "3600", "listen_notify": "off"}
    with LocalCluster(ctx.database_url, 1, directory=ctx.workdir / "bulk", config=config) as cluster:
        [node] = cluster.nodes
        node.get("listspiders.json", timeout=60, project="example")
        series["schedule.json"] = _timed(ctx, "one", sizes["schedule.json"],
                                         lambda: _post_one_by_one(node, sizes["schedule.json"]))
        series["schedule_batch.json"] = _timed(ctx, "batch", sizes["schedule_batch.json"],
                                               lambda: _post_batches(node.url, sizes["schedule_batch.json"]))
    path = ctx.workdir / "bulk.jsonl"
    with open(path, "w") as file:
        for index in range(sizes["enqueue"]):
            file.write(json.dumps(_job("file", index)) + "\n")
    command = [str(Path(sys.executable).parent / "scrapyd-pgqueue"), "enqueue", "--project", "example", str(path)]
    env = {**os.environ, "SCRAPYD_DATABASE_URL": ctx.database_url}  # not on the command line (ps)
    series["enqueue"] = _timed(ctx, "file", sizes["enqueue"],
                               lambda: subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800))
    ratios = {f"{name} / schedule.json": ratio(data["jobs_per_s"], series["schedule.json"]["jobs_per_s"])
              for name, data in series.items() if name != "schedule.json"}
    return {
        "parameters": {"sizes": sizes, "batch": BATCH},
        "series": series,
        "ratios": ratios,
        "targets": [report.target("enqueue, jobs/s", series["enqueue"]["jobs_per_s"], ">=", TARGET_JOBS_PER_SECOND,
                                  "one client, a JSON Lines file, start-up included"),
                    report.target("schedule_batch.json, jobs/s", series["schedule_batch.json"]["jobs_per_s"], ">=",
                                  TARGET_JOBS_PER_SECOND, f"batches of {BATCH:,}, one client")],
        "notes": ["the node claims nothing: every job stays pending and is counted after each way"],
    }


def _post_one_by_one(node, total: int) -> None:
    for index in range(total):
        job = _job("one", index)
        answer = node.post("schedule.json", project="example", spider="sleeper", jobid=job["jobid"],
                           priority=str(job["priority"]), **job["args"])
        if answer.get("status") != "ok":
            raise RuntimeError(f"bulk: schedule.json refused a job: {answer.get('message')}")


def _post_batches(url: str, total: int) -> None:
    for start in range(0, total, BATCH):
        jobs = [_job("batch", i) for i in range(start, min(start + BATCH, total))]
        post_batch(url, {"project": "example", "jobs": jobs}, 300, "bulk")


def _timed(ctx: Context, prefix: str, jobs: int, work) -> dict:
    ctx.log(f"bulk: {jobs:,} jobs ({prefix})")
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        cursor.execute(PENDING, (f"{prefix}-%",))
        stored = cursor.fetchone()[0]
    if stored != jobs:
        raise RuntimeError(f"bulk: {prefix}: {stored} jobs stored of {jobs}")
    return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds}


def format_table(result: dict) -> str:
    rows = [[name, report.number(data["jobs"]), report.number(data["seconds"], 2), report.number(data["jobs_per_s"])]
            for name, data in result["series"].items()]
    return report.table_text(result, [
        report.heading("Bulk scheduling"),
        report.format_rows(["way in", "jobs", "seconds", "jobs/s"], rows),
        "",
    ], ratios="ratio", ratio_digits=1)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(7, 4))
    names = list(result["series"])
    axes.bar(names, [result["series"][name]["jobs_per_s"] for name in names])
    axes.axhline(TARGET_JOBS_PER_SECOND, color="grey", linestyle=":", label="target")
    axes.set_yscale("log")
    report.finish_axes(axes, title="Scheduling in bulk, one client", ylabel="jobs per second (log)", legend_size=None,
                       grid=None)
    return [report.save_figure(plt, figure, directory / "bulk.png")]
