"""Scheduling in bulk: jobs per second into the queue, one ``schedule.json`` each against batches, against ``COPY``.

Every way in, on the bench's database, each timed from its first request to its last answer, every job counted
afterwards (each way must have stored exactly what it was given):
- ``enqueue``: the operator command (``scrapyd-pgqueue enqueue``, a real process, start-up included) streaming a
  JSON Lines file into an empty queue: 10% of the jobs with a unique key, 10% delayed by an hour;
- ``replace``: the same command re-scheduling every unique key of that file (``on_conflict`` replace);
- ``UPDATE in place``: replace's ceiling, not a way in: just before it, the rows it will update set as it sets them
  by one bare ``UPDATE`` (no client, no check, no staging; rolled back, then VACUUM), what any replace that keeps
  each job's row costs the server with spider_job's indexes (a changed priority and due time: no HOT update, a new
  entry in each of the row's 8 indexes);
- ``COPY``: the reference. The rows ``enqueue`` wrote, read back as they are, copied into the emptied ``spider_job``
  (same indexes) with ``COPY ... FROM STDIN`` from a file, as ``psql``'s ``\copy`` does;
- ``schedule.json``: one HTTP request a job to a real Scrapyd node (the only way before batches), one client;
- ``schedule_batch.json``: the same node, batches of 10,000 jobs (the same mix as the file), one client; the bodies
  are made before the clock starts, as the files of the others are written before theirs.
The node claims nothing (``poll_interval`` of an hour, no NOTIFY), so every job stays waiting.
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

SUMMARY = ("jobs per second into the queue: enqueue, replace, schedule.json one by one, schedule_batch.json, against "
           "COPY of the same rows")
SERIES = ("enqueue", "replace", "UPDATE in place", "COPY", "schedule.json", "schedule_batch.json")

SIZES = {"quick": {"schedule.json": 200, "schedule_batch.json": 20_000, "enqueue": 20_000},
         "full": {"schedule.json": 2_000, "schedule_batch.json": 200_000, "enqueue": 1_000_000}}
BATCH = 10_000
TARGET_JOBS_PER_SECOND = 20_000
# Each way's jobs per second against COPY's rows per second.
TARGET_RATIOS = {"enqueue": 0.6, "schedule_batch.json": 0.5, "replace": 0.4}
STORED = "SELECT count(*) FROM spider_job WHERE status IN ('pending', 'delayed') AND job LIKE %s"
# Re-scheduled keys show the new priority, on the job (and job id) the key had.
REPLACED = "SELECT count(*) FROM spider_job WHERE unique_key LIKE 'key-%%' AND priority = 5 AND job LIKE %s"
# The rows replace will update (every waiting row with a key), updated as it updates them.
UPDATE_IN_PLACE = """UPDATE spider_job SET priority = 5, run_at = now(), message = message || '{"again": 2}'
                     WHERE project = 'example' AND unique_key IS NOT NULL AND status IN ('delayed', 'pending')"""
# The columns a new job's row gets, in id order: what COPY writes again.
WRITTEN_COLUMNS = ("project, spider, job, version, priority, message, status, run_at, unique_key, retries, "
                   "retry_delay, periodic, parent, parent_id, tree_id, max_runtime, stall_timeout, created_time")


def _job(prefix: str, index: int) -> dict:
    job = {"spider": "sleeper", "jobid": f"{prefix}-{index:07}", "priority": index % 3,
           "args": {"url": f"https://example.com/listing/{index}"}}
    if index % 10 == 1:
        job["unique_key"] = f"key-{prefix}-{index}"
    elif index % 10 == 2:
        job["delay"] = 3600
    return job


def _replacement(index: int) -> dict:
    return {"spider": "sleeper", "jobid": f"again-{index:07}", "priority": 5, "unique_key": f"key-file-{index}",
            "on_conflict": "replace", "args": {"url": f"https://example.com/listing/{index}?again"}}


def run(ctx: Context) -> dict:
    sizes = SIZES[ctx.profile.name]
    series = _command_and_copy(ctx, sizes["enqueue"])
    database.drop_benchmark_rows(ctx.database_url)
    series.update(_http(ctx, sizes))
    reference = series["COPY"]["jobs_per_s"]
    ratios = {f"{name} / COPY": ratio(series[name]["jobs_per_s"], reference)
              for name in (*TARGET_RATIOS, "UPDATE in place")}
    return {
        "parameters": {"sizes": sizes, "batch": BATCH, "replaced": sizes["enqueue"] // 10},
        "series": series,
        "ratios": ratios,
        "targets": [report.target("enqueue, jobs/s", series["enqueue"]["jobs_per_s"], ">=", TARGET_JOBS_PER_SECOND,
                                  "one client, a JSON Lines file, start-up included"),
                    *(report.target(f"{name} / COPY", ratios[f"{name} / COPY"], ">=", limit)
                      for name, limit in TARGET_RATIOS.items())],
        "notes": ["the node claims nothing: every job stays waiting and is counted after each way",
                  "COPY: the rows enqueue wrote, copied into the emptied spider_job from a file, same run",
                  "UPDATE in place: replace's ceiling, one bare UPDATE of the replaced rows (rolled back)"],
    }


def _command_and_copy(ctx: Context, lines: int) -> dict:
    """enqueue, replace and the COPY reference, each into the queue as the one before left it."""
    database.drop_benchmark_rows(ctx.database_url)
    jobs = ctx.workdir / "bulk.jsonl"
    _write_lines(jobs, (_job("file", index) for index in range(lines)))
    replacements = ctx.workdir / "replace.jsonl"
    _write_lines(replacements, (_replacement(index) for index in range(1, lines, 10)))
    series = {"enqueue": _timed(ctx, "file", lines, lambda: _enqueue(ctx, jobs))}
    written = ctx.workdir / "written.copy"
    with database.copying_connection(ctx.database_url) as connection, connection.cursor() as cursor, \
            open(written, "wb") as file:
        cursor.copy_expert(f"COPY (SELECT {WRITTEN_COLUMNS} FROM spider_job ORDER BY id) TO STDOUT", file)
    series["UPDATE in place"] = _update_in_place(ctx.database_url, lines // 10)  # on the rows replace finds
    series["replace"] = _timed(ctx, "file", lines // 10, lambda: _enqueue(ctx, replacements), REPLACED)
    database.drop_benchmark_rows(ctx.database_url)
    series["COPY"] = _timed(ctx, "file", lines, lambda: _copy_in(ctx.database_url, written))
    return series


def _http(ctx: Context, sizes: dict) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    series = {}
    config = {"poll_interval": "3600", "listen_notify": "off"}
    with LocalCluster(ctx.database_url, 1, directory=ctx.workdir / "bulk", config=config) as cluster:
        [node] = cluster.nodes
        node.get("listspiders.json", timeout=60, project="example")
        series["schedule.json"] = _timed(ctx, "one", sizes["schedule.json"],
                                         lambda: _post_one_by_one(node, sizes["schedule.json"]))
        bodies = _batch_bodies(sizes["schedule_batch.json"])  # made beforehand, as the files of enqueue and COPY
        series["schedule_batch.json"] = _timed(ctx, "batch", sizes["schedule_batch.json"],
                                               lambda: _post_batches(node.url, bodies))
    return series


def _write_lines(path: Path, jobs) -> None:
    with open(path, "w") as file:
        for job in jobs:
            file.write(json.dumps(job) + "\n")


def _enqueue(ctx: Context, path: Path) -> None:
    command = [str(Path(sys.executable).parent / "scrapyd-pgqueue"), "enqueue", "--project", "example", str(path)]
    env = {**os.environ, "SCRAPYD_DATABASE_URL": ctx.database_url}  # not on the command line (ps)
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)


def _copy_in(url: str, path: Path) -> None:
    with database.copying_connection(url) as connection, connection.cursor() as cursor, open(path, "rb") as file:
        cursor.copy_expert(f"COPY spider_job ({WRITTEN_COLUMNS}) FROM STDIN", file)


def _update_in_place(url: str, jobs: int) -> dict:
    connection = database.connect(url)
    try:
        with connection.cursor() as cursor:
            started = time.perf_counter()
            cursor.execute(UPDATE_IN_PLACE)
            seconds = time.perf_counter() - started
            updated = cursor.rowcount
        connection.rollback()
    finally:
        connection.close()
    database.vacuum(url)  # the rolled-back row versions gone: replace finds the table as enqueue left it
    if updated != jobs:
        raise RuntimeError(f"bulk: UPDATE in place: {updated} rows of {jobs}")
    return {"jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds}


def _post_one_by_one(node, total: int) -> None:
    for index in range(total):
        job = _job("one", index)
        options = {f"_{name}": str(job[name]) for name in ("unique_key", "delay") if name in job}
        answer = node.post("schedule.json", project="example", spider="sleeper", jobid=job["jobid"],
                           priority=str(job["priority"]), **job["args"], **options)
        if answer.get("status") != "ok":
            raise RuntimeError(f"bulk: schedule.json refused a job: {answer.get('message')}")


def _batch_bodies(total: int) -> list[bytes]:
    """The schedule_batch.json bodies of ``total`` jobs, BATCH a body."""
    batches = ([_job("batch", i) for i in range(start, min(start + BATCH, total))] for start in range(0, total, BATCH))
    return [json.dumps({"project": "example", "jobs": jobs}).encode() for jobs in batches]


def _post_batches(url: str, bodies: list[bytes]) -> None:
    for body in bodies:
        post_batch(url, body, 300, "bulk")


def _timed(ctx: Context, prefix: str, jobs: int, work, stored_query: str = STORED) -> dict:
    ctx.log(f"bulk: {jobs:,} jobs ({prefix})")
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        cursor.execute(stored_query, (f"{prefix}-%",))
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
    ], ratios="ratio", ratio_digits=2)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(7, 4))
    names = list(result["series"])
    axes.bar(names, [result["series"][name]["jobs_per_s"] for name in names])
    axes.axhline(TARGET_JOBS_PER_SECOND, color="grey", linestyle=":", label="target")
    axes.set_yscale("log")
    report.finish_axes(axes, title="Scheduling in bulk, one client, against COPY", ylabel="jobs per second (log)",
                       legend_size=None, grid=None)
    return [report.save_figure(plt, figure, directory / "bulk.png")]
