"""Crawl start: from the crawl process's spawn to its spider's creation, eggs from Postgres against eggs from files.

Two clusters of ``NODES`` real Scrapyd nodes run side by side on the bench's database, differing only in their
egg storage: ``postgres`` (``scrapyd_pgqueue.PostgresEggStorage``: the node keeps the job's egg as a file and hands
the crawl its path, so the crawl opens no connection) and ``files`` (Scrapyd's ``FilesystemEggStorage``, the egg
deployed to every node). The same egg, the example project, runs on both, under a project name of each cluster's
own (both share the bench's queue: a name only one cluster knows keeps each job on its cluster). Jobs
(``sleeper``, 0 s) go one at a time, alternating between the two clusters so that the machine's drift hits both
alike.

Measured per job: the row's ``start_time`` (the launcher's ``datetime.now()`` just before ``spawnProcess``) to the
spider's own record of its creation (``runs.jsonl`` ``started``, written in ``from_crawler``): Python's and
Scrapy's start-up, the egg's activation, and with Scrapyd's runner the egg storage's ``get`` (the part this
compares). Same host clock for both.
"""

from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.crawls import spider_created
from bench.stats import percentile, ratio

SUMMARY = "spawn to spider created, PostgresEggStorage (egg cached by the node) against Scrapyd's file eggs"
SERIES = ("postgres", "files")

NODES = 3
SPIDER = "sleeper"
PROJECTS = {"postgres": "egg_postgres", "files": "egg_files"}
EGGSTORAGE = {"postgres": "scrapyd_pgqueue.PostgresEggStorage", "files": "scrapyd.eggstorage.FilesystemEggStorage"}
JOBS = {"quick": 4, "full": 30}  # per storage
TARGET_RATIO = 1.10  # postgres / files, p50
DEADLINE = 60.0
START_TIME = "SELECT start_time FROM spider_job WHERE job = %s AND pid IS NOT NULL"


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT, LocalCluster

    egg = _build_egg(EXAMPLE_PROJECT, ctx.workdir / "crawlstart-egg")
    records = ctx.workdir / "crawlstart-records"
    clusters = {}
    try:
        for name, storage in EGGSTORAGE.items():
            cluster = LocalCluster(
                ctx.database_url, NODES, directory=ctx.workdir / f"crawlstart-{name}", name_prefix=name,
                config={"eggstorage": storage, "max_proc": "1"}, env={"EXAMPLE_RECORD_DIR": str(records)},
            )
            clusters[name] = cluster
            cluster.start()
            # Files: a copy on each node; Postgres: deployed once, through the first node.
            for node in cluster.nodes if name == "files" else cluster.nodes[:1]:
                answer = node.post("addversion.json", project=PROJECTS[name], version="1", egg=egg.read_bytes())
                if answer.get("status") != "ok":
                    raise RuntimeError(f"crawlstart: addversion on {node.name}: {answer}")
            for node in cluster.nodes:
                _wait_for_project(node, PROJECTS[name])
        ctx.log(f"crawlstart: 2 x {NODES} nodes up; {JOBS[ctx.profile.name]} jobs per egg storage")
        samples = {name: [] for name in EGGSTORAGE}
        for index in range(JOBS[ctx.profile.name]):
            for name, cluster in clusters.items():
                samples[name].append(_one_job(ctx, cluster.nodes[index % NODES], PROJECTS[name], records))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    series = {name: _summarise(values) for name, values in samples.items()}
    ratios = {"postgres / files p50": ratio(series["postgres"]["p50_ms"], series["files"]["p50_ms"]),
              "postgres / files mean": ratio(series["postgres"]["mean_ms"], series["files"]["mean_ms"])}
    return {
        "parameters": {"nodes_per_storage": NODES, "jobs_per_storage": JOBS[ctx.profile.name], "spider": SPIDER},
        "series": series,
        "ratios": ratios,
        "targets": [report.target("crawl start p50, postgres / files", ratios["postgres / files p50"], "<=",
                                  TARGET_RATIO, "spawn -> spider created")],
        "notes": ["jobs alternate between the two clusters, one at a time; each crawl runs alone"],
    }


def _build_egg(project_dir: Path, output: Path) -> Path:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_egg", project_dir / "build_egg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_egg(output)


def _wait_for_project(node, project: str) -> None:
    """Until the node knows the project (a deploy through another node reaches it by NOTIFY) and has listed it."""
    deadline = time.monotonic() + DEADLINE
    while project not in node.get("listprojects.json")["projects"]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"crawlstart: {node.name} never learnt project {project}")
        time.sleep(0.1)
    node.get("listspiders.json", timeout=60, project=project)


def _one_job(ctx: Context, node, project: str, records: Path) -> float:
    job = f"crawlstart-{uuid.uuid4().hex[:12]}"
    answer = node.post("schedule.json", project=project, spider=SPIDER, jobid=job)
    if answer.get("status") != "ok":
        raise RuntimeError(f"crawlstart: schedule.json on {node.name}: {answer}")
    deadline = time.monotonic() + DEADLINE
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute(START_TIME, (job,))
            row = cursor.fetchone()
            created = spider_created(records, job)
            if row is not None and created is not None:
                return created - row[0].timestamp()
            if time.monotonic() > deadline:
                raise RuntimeError(f"crawlstart: job {job} did not start on {node.name}:\n{node.log_tail(10)}")
            time.sleep(0.02)


def _summarise(seconds: list[float]) -> dict:
    milliseconds = [value * 1000 for value in seconds]
    return {"samples": len(milliseconds), "p50_ms": percentile(milliseconds, 0.5),
            "p90_ms": percentile(milliseconds, 0.9), "mean_ms": statistics.fmean(milliseconds),
            "min_ms": min(milliseconds), "max_ms": max(milliseconds), "values_ms": milliseconds}


def format_table(result: dict) -> str:
    rows = [[name, report.number(data["samples"]), report.number(data["p50_ms"], 0), report.number(data["p90_ms"], 0),
             report.number(data["mean_ms"], 0), report.number(data["min_ms"], 0), report.number(data["max_ms"], 0)]
            for name, data in result["series"].items()]
    lines = [
        report.heading("Crawl start"),
        f"{result['parameters']['nodes_per_storage']} real nodes per egg storage; spawn -> spider created, in ms",
        report.format_rows(["egg storage", "jobs", "p50 ms", "p90 ms", "mean ms", "min ms", "max ms"], rows),
        "",
    ]
    return report.table_text(result, lines, ratios="ratio")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, data in result["series"].items():
        values = sorted(data["values_ms"])
        axes.step(values, [(rank + 1) / len(values) for rank in range(len(values))], where="post", label=name)
    report.finish_axes(axes, title="Crawl start: eggs from Postgres (cached by the node) vs from files",
                       xlabel="crawl process spawned -> spider created (ms)", ylabel="fraction of crawls",
                       legend_size=None)
    return [report.save_figure(plt, figure, directory / "crawlstart.png")]
