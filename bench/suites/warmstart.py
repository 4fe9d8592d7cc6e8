"""Warm starts: crawls forked from a warm process (``warm_start = on``) against Scrapyd's new Python per crawl.

One real Scrapyd node (``max_proc`` 8) per mode, one mode after the other on the bench's database, the same
baked-in example project; a warm-up crawl first (spawned cold on the warm node too, while its warm process imports
the project; the measures start once it is ready). Measured:

* start: a crawl alone, from the row's ``start_time`` (the claim) to the spider's own record of its creation
  (``runs.jsonl``, written in ``from_crawler``), p50 and p99;
* tiny crawls per second: ``BURST`` jobs of the ``quotes`` spider, each fetching one page from a loopback HTTP
  server, scheduled in one ``schedule_batch.json``, until the last one has ended;
* memory: 8 concurrent sleeping crawls, PSS (``/proc/<pid>/smaps_rollup``) per crawl; for the warm node also
  counting its warm process, shared by them; and the node's own RSS once started, before any crawl.
"""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.crawls import post_batch, spider_created
from bench.stats import percentile, ratio

SUMMARY = "crawl start, tiny crawls per second and memory per crawl: forked from a warm process against cold"
SERIES = ("cold", "warm")

MAX_PROC = 8
SIZES = {"quick": {"starts": 8, "burst": 24}, "full": {"starts": 40, "burst": 120}}
TARGETS = {"start p50, warm / cold": 1 / 6, "crawls per second, warm / cold": 4.0, "PSS per crawl, warm / cold": 0.5}
DEADLINE = 120.0
PAGE = b'<html><body><h1>Page 1</h1><div class="quote"><span class="text">Hi.</span><small class="author">A</small>' \
       b"</div></body></html>"


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    sizes = SIZES[ctx.profile.name]
    server = _page_server()
    series = {}
    try:
        for mode in SERIES:
            records = ctx.workdir / f"warmstart-{mode}-records"
            cluster = LocalCluster(
                ctx.database_url, 1, directory=ctx.workdir / f"warmstart-{mode}", name_prefix=mode,
                config={"max_proc": str(MAX_PROC), "warm_start": "on" if mode == "warm" else "off",
                        "poll_interval": "1", "finished_to_keep": "100000"},  # the burst counts its rows
                env={"EXAMPLE_RECORD_DIR": str(records)},
            )
            cluster.start()
            try:
                node = cluster.nodes[0]
                idle_rss = _rss(node.process.pid)
                _start_alone(ctx, node, records)  # warm-up: cold, while the warm node's warm process imports
                if mode == "warm":
                    _wait_until_ready(node)
                starts = [_start_alone(ctx, node, records) for _ in range(sizes["starts"])]
                ctx.log(f"warmstart: {mode}: {len(starts)} starts done")
                rate = _burst(ctx, node, f"http://127.0.0.1:{server.server_port}/", sizes["burst"])
                memory = _memory(ctx, node)
            finally:
                cluster.stop()
            series[mode] = {"start": _summarise(starts), "crawls_per_s": rate, "node_idle_rss": idle_rss, **memory}
    finally:
        server.shutdown()
    ratios = {
        "start p50, warm / cold": ratio(series["warm"]["start"]["p50_ms"], series["cold"]["start"]["p50_ms"]),
        "start p99, warm / cold": ratio(series["warm"]["start"]["p99_ms"], series["cold"]["start"]["p99_ms"]),
        "crawls per second, warm / cold": ratio(series["warm"]["crawls_per_s"], series["cold"]["crawls_per_s"]),
        "PSS per crawl, warm / cold": ratio(series["warm"]["pss_per_crawl"], series["cold"]["pss_per_crawl"]),
        "PSS per crawl with the warm process, warm / cold": ratio(
            series["warm"]["pss_per_crawl_with_parent"], series["cold"]["pss_per_crawl"]),
    }
    return {
        "parameters": {"max_proc": MAX_PROC, **sizes},
        "series": series,
        "ratios": ratios,
        "targets": [report.target(name, ratios[name], ">=" if limit > 1 else "<=", limit)
                    for name, limit in TARGETS.items()],
        "notes": ["one node per mode, cold first, then warm, on the same machine in the same run",
                  "start: claim (row start_time) -> spider created; the warm-up crawl is not counted"],
    }


def _wait_until_ready(node) -> None:
    deadline = time.monotonic() + DEADLINE
    while "of project example ready" not in node.logfile.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"warmstart: no warm process ready on {node.name}:\n{node.log_tail(10)}")
        time.sleep(0.05)


def _page_server() -> http.server.ThreadingHTTPServer:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _schedule(node, **params) -> str:
    job = f"warmstart-{uuid.uuid4().hex[:12]}"
    answer = node.post("schedule.json", project="example", jobid=job, **params)
    if answer.get("status") != "ok":
        raise RuntimeError(f"warmstart: schedule.json on {node.name}: {answer}")
    return job


def _start_alone(ctx: Context, node, records: Path) -> float:
    """Seconds from the claim to the spider's creation, of one crawl running alone (waited for to its end)."""
    job = _schedule(node, spider="sleeper")
    deadline = time.monotonic() + DEADLINE
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT start_time, status FROM spider_job WHERE job = %s", (job,))
            start_time, status = cursor.fetchone()
            created = spider_created(records, job)
            if status == "terminated" and created is not None:
                return created - start_time.timestamp()
            if time.monotonic() > deadline:
                raise RuntimeError(f"warmstart: job {job} did not end on {node.name}:\n{node.log_tail(10)}")
            time.sleep(0.02)


def _burst(ctx: Context, node, url: str, count: int) -> float:
    """Crawls per second: ``count`` one-page crawls scheduled at once, until the last has ended."""
    prefix = f"burst-{uuid.uuid4().hex[:8]}"
    batch = {"project": "example", "jobs": [
        {"spider": "quotes", "jobid": f"{prefix}-{index:04}", "args": {"start_url": url}} for index in range(count)
    ]}
    started = time.monotonic()
    post_batch(node.url, batch, 60, "warmstart")
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FILTER (WHERE status = 'terminated'), count(*) FILTER "
                           "(WHERE outcome = 'finished') FROM spider_job WHERE job LIKE %s", (f"{prefix}-%",))
            ended, succeeded = cursor.fetchone()
            if ended == count:
                break
            if time.monotonic() - started > DEADLINE * 5:
                raise RuntimeError(f"warmstart: {ended}/{count} burst crawls ended:\n{node.log_tail(10)}")
            time.sleep(0.05)
    if succeeded != count:
        raise RuntimeError(f"warmstart: {count - succeeded} burst crawls did not finish:\n{node.log_tail(20)}")
    return count / (time.monotonic() - started)


def _memory(ctx: Context, node) -> dict:
    """PSS of MAX_PROC concurrent sleeping crawls (and of their warm process, if any), then cancel them."""
    jobs = [_schedule(node, spider="sleeper", seconds="60") for _ in range(MAX_PROC)]
    deadline = time.monotonic() + DEADLINE
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT pid FROM spider_job WHERE job = ANY(%s) AND pid IS NOT NULL", (jobs,))
            pids = [pid for (pid,) in cursor.fetchall()]
            if len(pids) == MAX_PROC and all(_sleeping(node, job) for job in jobs):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"warmstart: {len(pids)}/{MAX_PROC} sleeping crawls:\n{node.log_tail(10)}")
            time.sleep(0.1)
    crawls = sum(_pss(pid) for pid in pids)
    parents = {_parent(pid) for pid in pids} - {node.process.pid}
    shared = sum(_pss(pid) for pid in parents)
    for job in jobs:
        node.post("cancel.json", project="example", job=job)
    return {"pss_per_crawl": crawls / MAX_PROC, "pss_per_crawl_with_parent": (crawls + shared) / MAX_PROC,
            "warm_process_pss": shared}


def _sleeping(node, job: str) -> bool:
    log = node.directory / "logs" / "example" / "sleeper" / f"{job}.log"
    return log.exists() and "Sleeping in the callback" in log.read_text()


def _pss(pid: int, field: str = "Pss") -> int:
    """Bytes of proportional set size (or another field of smaps_rollup)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"warmstart: no {field} for pid {pid}")


def _rss(pid: int) -> int:
    return _pss(pid, "Rss")


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _summarise(seconds: list[float]) -> dict:
    milliseconds = [value * 1000 for value in seconds]
    return {"samples": len(milliseconds), "p50_ms": percentile(milliseconds, 0.5),
            "p99_ms": percentile(milliseconds, 0.99), "values_ms": milliseconds}


def format_table(result: dict) -> str:
    rows = [[mode, report.number(data["start"]["p50_ms"], 0), report.number(data["start"]["p99_ms"], 0),
             report.number(data["crawls_per_s"], 2), report.megabytes(data["pss_per_crawl"]),
             report.megabytes(data["pss_per_crawl_with_parent"]), report.megabytes(data["node_idle_rss"])]
            for mode, data in result["series"].items()]
    lines = [
        report.heading("Warm starts"),
        f"one node, max_proc {result['parameters']['max_proc']}; start = claim -> spider created",
        report.format_rows(["mode", "start p50 ms", "start p99 ms", "crawls/s", "PSS/crawl",
                            "PSS/crawl + warm process", "node idle RSS"], rows),
        "",
        report.format_ratios(result),
        "",
    ]
    return report.table_text(result, lines)


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, (starts, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, data in result["series"].items():
        values = sorted(data["start"]["values_ms"])
        starts.step(values, [(rank + 1) / len(values) for rank in range(len(values))], where="post", label=mode)
    starts.set_xscale("log")
    starts.set_xlabel("claim -> spider created (ms)")
    starts.set_ylabel("fraction of crawls")
    starts.legend()
    starts.grid(True, alpha=0.3)
    modes = list(result["series"])
    bars.bar([f"{mode}\ncrawls/s" for mode in modes], [result["series"][m]["crawls_per_s"] for m in modes])
    twin = bars.twinx()
    twin.bar([f"{mode}\nMB/crawl" for mode in modes],
             [result["series"][m]["pss_per_crawl_with_parent"] / 1_048_576 for m in modes], color="tab:orange")
    bars.set_ylabel("tiny crawls per second")
    twin.set_ylabel("PSS per crawl (MB), warm process included")
    figure.suptitle("Warm starts: forked crawls against a new Python per crawl")
    return [report.save_figure(plt, figure, directory / "warmstart.png")]
