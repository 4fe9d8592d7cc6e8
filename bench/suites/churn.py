"""Churn: what a long life of claims and finishes leaves in the table, and whether claims slow down.

A fresh table holds ``churn_backlog`` pending jobs (VACUUM ANALYZE'd); its sizes and claim latency are
measured. Then ``churn_processes`` spawned processes put ``churn_jobs`` jobs through the store the way a node
does: ``claim_next_jobs(projects, churn_batch)``, then for each claimed job ``finish_job(..., claimed=job)``
``prune_terminated(100)`` and ``QueueMaintenance.vacuum_when_due()`` at the default ``vacuum_interval`` (what
``PostgresJobStorage.add`` does after every crawl), and one INSERT ...
generate_series adds as many new pending jobs, so the backlog stays constant and every job is inserted,
updated twice and deleted, as in production. Autovacuum is left exactly as the server and the table's storage
parameters (migration 0003) have it, next to the nodes' own vacuums; the table's statistics (and how many vacuums
the nodes ran) are sampled while it runs. Afterwards sizes, dead
tuples and claim latency are measured as left, then again after a manual VACUUM, each compared with the fresh
table.
"""

from __future__ import annotations

import datetime
import multiprocessing
import time
import uuid
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.latency import measure_paths
from bench.stats import ratio

SUMMARY = "dead tuples, sizes and claim latency after many claims and finishes, against a fresh table"
SERIES = ("stages", "during_churn")

PROJECTS = ("churn0", "churn1", "churn2", "churn3", "churn4")
FINISHED_TO_KEEP = 100  # Scrapyd's default finished_to_keep, as PostgresJobStorage prunes to it
LATENCY_TARGET = 1.2  # claim p50 after churn / fresh (issue 10)
SIZE_TARGET = 3.0  # table + indexes after churn / fresh (issue 10)
SPAWN_TIMEOUT = 300.0  # seconds for the churn processes to start and connect
STAGES = ("fresh", "after_churn", "after_manual_vacuum")
CLAIM_PATHS = ("pgqueue_pop", "pgqueue_claim_next_jobs")
PERCENTILES = ("p50_ms", "p99_ms")
SHORT_PATHS = {"pgqueue_pop": "pop", "pgqueue_claim_next_jobs": "poller"}


class ChurnNode:
    """One node's life, sped up: claim, finish and prune as a node with PostgresJobStorage does."""

    def __init__(self, url: str, index: int):
        from scrapyd_pgqueue.config import settings
        from scrapyd_pgqueue.store import JobStore, QueueMaintenance

        self.store = JobStore.for_url(url)
        self.maintenance = QueueMaintenance(self.store.engine, settings({"database_url": url}).vacuum_interval)
        self.vacuums = 0
        self.node, self.worker = f"bench-churn-{index}", uuid.uuid4().hex
        self.prefix, self.next_number = f"churn-{index}-", 1
        self.prune_failures = 0
        self.failure_messages = set()

    def claim(self, limit: int) -> list:
        return self.store.claim_next_jobs(list(PROJECTS), limit, node=self.node, worker=self.worker).jobs

    def finish(self, job) -> None:
        now = datetime.datetime.now()
        self.store.finish_job(project=job.project, spider=job.message["name"], job=job.job, start_time=now,
                              end_time=now, exit_code=0, node=self.node, claimed=job, worker=self.worker)

    def prune(self) -> None:
        """``prune_terminated`` and the maintenance, as PostgresJobStorage.add calls them after every finish.

        Every node prunes after every finish, so prunes run concurrently over the same rows; before the store's
        prune skipped locked rows they deadlocked. A failure is counted and reported, and the churn goes on (the
        next prune deletes what this one did not), so the figures still cover every job.
        """
        from scrapyd_pgqueue.database.db import DatabaseError

        try:
            self.store.prune_terminated(FINISHED_TO_KEEP)
        except DatabaseError as e:
            self.prune_failures += 1
            self.failure_messages.add(str(e))
        self.vacuums += self.maintenance.vacuum_when_due()

    def replace(self, cursor, count: int) -> None:
        """As many new pending jobs as were claimed: the backlog stays constant."""
        database.insert_pending(cursor, count, PROJECTS, self.prefix, first=self.next_number)
        self.next_number += count


def churn_worker(url, jobs, batch, index, start_barrier, progress, prune_failures, failure_messages) -> None:
    """Put ``jobs`` jobs through one ChurnNode; report progress as it goes and prune failures at the end."""
    node = ChurnNode(url, index)
    start_barrier.wait(SPAWN_TIMEOUT)  # the rate is timed from here: start-up is not churn
    done = 0
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        while done < jobs:
            claimed = node.claim(min(batch, jobs - done))
            if not claimed:
                time.sleep(0.01)  # every pending job is held by the other processes for a moment
                continue
            for job in claimed:
                node.finish(job)
                node.prune()
            node.replace(cursor, len(claimed))
            done += len(claimed)
            with progress.get_lock():
                progress.value += len(claimed)
    with prune_failures.get_lock():
        prune_failures.value += node.prune_failures
    for message in node.failure_messages:  # a few distinct messages: they cannot fill the pipe
        failure_messages.put(message)


def run(ctx: Context) -> dict:
    profile, url = ctx.profile, ctx.database_url
    ctx.log(f"churn: filling {profile.churn_backlog:,} pending jobs")
    database.fill_spider_job(url, profile.churn_backlog, PROJECTS, prefix="fresh-")
    stages = {"fresh": _measure_stage(url, profile.latency_samples)}
    ctx.log(f"churn: {profile.churn_jobs:,} claims + finishes in {profile.churn_processes} processes")
    churn = _churn(ctx)
    # Backends report their statistics when they exit, and the server needs a moment to take them in.
    time.sleep(1.0)
    stages["after_churn"] = _measure_stage(url, profile.latency_samples)
    ctx.log("churn: manual VACUUM")
    database.vacuum(url)
    stages["after_manual_vacuum"] = _measure_stage(url, profile.latency_samples)
    ratios = _ratios(stages)
    storage = _storage_parameters(url)
    return {
        "parameters": {
            "jobs": profile.churn_jobs,
            "processes": profile.churn_processes,
            "claim_batch": profile.churn_batch,
            "backlog": profile.churn_backlog,
            "finished_to_keep": FINISHED_TO_KEEP,
            "latency_samples": profile.latency_samples,
            "storage_parameters": storage,
        },
        "series": {
            "stages": stages,
            "during_churn": {"seconds": churn["seconds"], "jobs_per_second": churn["jobs_per_second"],
                             "prune_failures": churn["prune_failures"], "vacuum_interval": churn["vacuum_interval"],
                             "prune_failure_messages": churn["prune_failure_messages"], "samples": churn["samples"]},
        },
        "ratios": ratios,
        "targets": _targets(ratios),
        "notes": _notes(stages, churn, storage),
    }


def _storage_parameters(url: str) -> dict:
    """spider_job's reloptions (migration 0003) and the server's autovacuum cadence, which bound the churn's sizes."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass(%s)", ("spider_job",))
        options = dict(option.split("=", 1) for option in cursor.fetchone()[0])
        cursor.execute("SELECT current_setting('autovacuum_naptime')")
        naptime = cursor.fetchone()[0]
    return {"reloptions": options, "autovacuum_naptime": naptime}


def _measure_stage(url: str, samples: int) -> dict:
    # Statistics first: the latency samples themselves add a few hundred claims and inserts.
    return {"table": database.table_stats(url), "claim_latency": measure_paths(url, PROJECTS, samples)}


def _churn(ctx: Context) -> dict:
    profile = ctx.profile
    context = multiprocessing.get_context("spawn")
    progress, prune_failures = context.Value("q", 0), context.Value("q", 0)
    failure_messages = context.SimpleQueue()
    start_barrier = context.Barrier(profile.churn_processes + 1)
    shares = _shares(profile.churn_jobs, profile.churn_processes)
    processes = [
        context.Process(target=churn_worker, name=f"bench-churn-{index}",
                        args=(ctx.database_url, share, profile.churn_batch, index, start_barrier, progress,
                              prune_failures, failure_messages))
        for index, share in enumerate(shares)
    ]
    for process in processes:
        process.start()
    start_barrier.wait(SPAWN_TIMEOUT)
    start = time.monotonic()
    samples = _sample_while_running(ctx, processes, progress, start)
    seconds = time.monotonic() - start
    failed = [process.name for process in processes if process.exitcode != 0]
    if failed:
        raise RuntimeError(f"churn processes failed: {failed}")
    messages = set()
    while not failure_messages.empty():
        messages.add(failure_messages.get())
    from scrapyd_pgqueue.config import settings

    return {"seconds": seconds, "jobs_per_second": progress.value / seconds, "samples": samples,
            "vacuum_interval": settings({"database_url": ctx.database_url}).vacuum_interval,
            "prune_failures": prune_failures.value, "prune_failure_messages": sorted(messages)}


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def _sample_while_running(ctx: Context, processes, progress, start: float) -> list[dict]:
    """Table statistics every ``churn_sample_seconds`` until every churn process has exited."""
    samples = [{"seconds": 0.0, "jobs": 0, **_sample_fields(database.table_stats(ctx.database_url))}]
    last_logged = 0
    while any(process.is_alive() for process in processes):
        for process in processes:
            process.join(ctx.profile.churn_sample_seconds / len(processes))
        stats = database.table_stats(ctx.database_url)
        samples.append({"seconds": time.monotonic() - start, "jobs": progress.value, **_sample_fields(stats)})
        tenth = progress.value * 10 // max(ctx.profile.churn_jobs, 1)
        if tenth > last_logged:
            last_logged = tenth
            ctx.log(f"churn: {progress.value:,} jobs, {stats['n_dead_tup']:,} dead tuples, "
                    f"{report.megabytes(stats['total_bytes'])}, autovacuums {stats['autovacuum_count']}")
    return samples


def _sample_fields(stats: dict) -> dict:
    keys = ("rows", "n_live_tup", "n_dead_tup", "autovacuum_count", "heap_bytes", "indexes_bytes", "total_bytes")
    return {key: stats[key] for key in keys}


def _ratios(stages: dict) -> dict:
    fresh = stages["fresh"]["claim_latency"]
    latency = {
        _ratio_name(path, percentile, stage): ratio(stages[stage]["claim_latency"][path][percentile],
                                                     fresh[path][percentile])
        for stage in STAGES[1:]
        for path in CLAIM_PATHS
        for percentile in PERCENTILES
    }
    sizes = {
        f"{size} {stage} / fresh": ratio(stages[stage]["table"][size], stages["fresh"]["table"][size])
        for stage in STAGES[1:]
        for size in ("total_bytes", "indexes_bytes")
    }
    return {**latency, **sizes}


def _ratio_name(path: str, percentile: str, stage: str) -> str:
    return f"{path} {percentile} {stage} / fresh"


def _targets(ratios: dict) -> list[dict]:
    note = "autovacuum and the nodes' maintenance as configured, no manual VACUUM"
    latency = [
        report.target(f"claim p50 {path}, after churn / fresh", ratios[_ratio_name(path, "p50_ms", "after_churn")],
                      "<=", LATENCY_TARGET, note)
        for path in CLAIM_PATHS
    ]
    size = report.target("table + indexes, after churn / fresh", ratios["total_bytes after_churn / fresh"], "<=",
                         SIZE_TARGET, note)
    return [*latency, size]


def _notes(stages: dict, churn: dict, storage: dict) -> list[str]:
    after = stages["after_churn"]["table"]
    options = ", ".join(f"{name}={value}" for name, value in sorted(storage["reloptions"].items())) or "none"
    notes = [f"churn ran at {churn['jobs_per_second']:,.0f} jobs/s for {churn['seconds']:,.0f} s",
             f"spider_job storage parameters: {options}; server autovacuum_naptime {storage['autovacuum_naptime']}"]
    if churn["prune_failures"]:
        notes.append(f"prune_terminated failed {churn['prune_failures']:,} times, counted and skipped: "
                     + "; ".join(churn["prune_failure_messages"]))
    runs = after["autovacuum_count"] - stages["fresh"]["table"]["autovacuum_count"]
    peak = max((sample["n_dead_tup"] for sample in churn["samples"]), default=0)
    notes.append(
        f"autovacuum ran {runs} time(s) on spider_job during the churn; dead tuples peaked at {peak:,} "
        f"(sampled every few seconds) against {after['rows']:,} rows; {after['n_dead_tup']:,} dead at the end"
    )
    node_vacuums = after["vacuum_count"] - stages["fresh"]["table"]["vacuum_count"]
    notes.append(f"the churning nodes vacuumed spider_job {node_vacuums} time(s) (QueueMaintenance, vacuum_interval "
                 f"{churn['vacuum_interval']:g} s)")
    if runs + node_vacuums > 0:
        # Space is reused only once a vacuum has run: the sizes follow the jobs churned between two passes.
        notes.append(f"{churn['samples'][-1]['jobs'] / (runs + node_vacuums):,.0f} jobs per vacuum on average")
    return notes


# --- output ----------------------------------------------------------------------------------------------------


def format_table(result: dict) -> str:
    stages = result["series"]["stages"]
    fresh = stages["fresh"]
    rows = []
    for stage in STAGES:
        table, latency = stages[stage]["table"], stages[stage]["claim_latency"]
        by_status = table["rows_by_status"]
        rows.append([
            stage,
            "/".join(report.number(by_status.get(status, 0)) for status in ("pending", "ongoing", "terminated")),
            report.number(table["n_dead_tup"]),
            report.megabytes(table["heap_bytes"]),
            report.megabytes(table["indexes_bytes"]),
            report.megabytes(table["total_bytes"]),
            report.number(table["autovacuum_count"]),
            *(report.number(latency[path][percentile], 3) for path in CLAIM_PATHS for percentile in PERCENTILES),
        ])
    latency_headers = [f"{SHORT_PATHS[path]} {percentile[:3]} ms"
                       for path in CLAIM_PATHS for percentile in PERCENTILES]
    index_rows = [[name, *(report.megabytes(stages[stage]["table"]["index_bytes"].get(name)) for stage in STAGES)]
                  for name in fresh["table"]["index_bytes"]]
    parameters = result["parameters"]
    lines = [
        report.heading("Churn"),
        f"{parameters['jobs']:,} claims + finishes + prune_terminated({parameters['finished_to_keep']}) in "
        f"{parameters['processes']} processes (claim batch {parameters['claim_batch']}), "
        f"{parameters['backlog']:,} pending kept (ongoing rows: the latency samples' claims, never finished); "
        "dead tuples and sizes of spider_job from pg_stat_user_tables",
        report.format_rows(["stage", "rows pend/ong/term", "dead tup", "heap", "indexes", "total", "autovac",
                            *latency_headers], rows),
        "",
        report.format_rows(["index", *STAGES], index_rows),
        "",
    ]
    return report.table_text(result, lines, ratios="ratio (claim latency, sizes)")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    samples = result["series"]["during_churn"]["samples"]
    jobs = [sample["jobs"] for sample in samples]
    figure, (tuples, sizes) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    tuples.plot(jobs, [sample["n_dead_tup"] for sample in samples], label="dead tuples")
    tuples.plot(jobs, [sample["rows"] for sample in samples], label="rows (pending + ongoing + terminated)")
    report.finish_axes(tuples, title="spider_job during churn (autovacuum as configured)", ylabel="tuples")
    for key, label in (("heap_bytes", "heap"), ("indexes_bytes", "indexes"), ("total_bytes", "total")):
        sizes.plot(jobs, [sample[key] / 1_048_576 for sample in samples], label=label)
    report.finish_axes(sizes, xlabel="jobs claimed and finished", ylabel="MB")
    paths = [report.save_figure(plt, figure, directory / "churn_table.png")]

    stages = result["series"]["stages"]
    figure, axes = plt.subplots(figsize=(8, 5))
    labels = [f"{SHORT_PATHS[path]} {percentile[:3]}" for path in CLAIM_PATHS for percentile in PERCENTILES]
    width = 0.8 / len(STAGES)
    for offset, stage in enumerate(STAGES):
        values = [stages[stage]["claim_latency"][path][percentile]
                  for path in CLAIM_PATHS for percentile in PERCENTILES]
        axes.bar([i + offset * width for i in range(len(values))], values, width, label=stage)
    axes.set_xticks([i + width for i in range(len(labels))], labels, fontsize=8)
    report.finish_axes(axes, title="Claim latency: fresh table, after churn, after manual VACUUM",
                       ylabel="claim latency (ms)", grid_axis="y")
    paths.append(report.save_figure(plt, figure, directory / "churn_latency.png"))
    return paths
