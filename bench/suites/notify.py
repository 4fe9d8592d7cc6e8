"""NOTIFY at scale: scheduling throughput with 0, 100 and 1,000 idle listening sessions on the server.

Every transaction that sends a NOTIFY takes one server-wide lock at its commit (notifying transactions commit one
at a time) and signals every listening backend, which then reads the queue. The package notifies only while some
node wants work (``scrapyd_node.wants_work``: free slots and nothing found to claim), once per statement, with an
empty payload. This suite measures what that buys, on a Postgres of its own (``max_connections`` above the
listeners; the role and database ``scrapyd`` of ``bench.servers.Servers``, as the scale suite's):

- **listeners**: one process (multiprocessing spawn) opens ``count`` real connections straight to Postgres,
  LISTENs on each of the product's channels, and reads every notification they receive (one ``epoll`` loop, as
  idle nodes' listener threads would), counting them;
- **one real node** (``LocalCluster``, ``max_proc`` 1, NOTIFY on, default ``poll_interval``) takes ``schedule.json``
  from ``CLIENTS`` client threads for ``seconds`` (unique job ids, spider ``sleeper``): ok answers per second and
  each answer's time (the commit is inside it), then ``scrapyd-pgqueue enqueue`` (a real process) streams
  ``enqueue_jobs`` jobs in batches of ``ENQUEUE_BATCH`` (a transaction each);
- two modes: ``busy``, the node's one slot held by a long crawl (it says it wants no work: nothing notifies), and
  ``wanting``, the same plus one registered node row that wants work and never claims, so that every schedule and
  batch notifies, as every one did before the node said (the reference for what the bound avoids);
- **pickup** on an idle cluster (the node wants work): one job at a time, from the ``schedule.json`` answer to the
  crawl process's spawn (``spider_job.start_time``; the wakeup suite's measure, signed: negative when the spawn beat
  the answer), and from the request's sending (never negative), with 0 and the most listeners.

Ratios are taken within this run: each count of listeners against none, same mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench import report
from bench.context import Context
from bench.servers import Servers, connect
from bench.stats import percentile, ratio
from bench.suites import wakeup

SUMMARY = "schedule.json (8 clients) and scrapyd-pgqueue enqueue with 0, 100 and 1,000 listening sessions; pickup"
SERIES = ("busy", "wanting", "pickup")

LISTENER_COUNTS = {"quick": (0, 100), "full": (0, 100, 1000)}
SIZES = {"quick": {"seconds": 3.0, "enqueue_jobs": 2_000, "pickups": 3},
         "full": {"seconds": 15.0, "enqueue_jobs": 20_000, "pickups": 20}}
CLIENTS = 8
ENQUEUE_BATCH = 100  # jobs a statement: many transactions, each of which may notify
MAX_CONNECTIONS_SPARE = 100  # the node, the bench's own connections, the reserve
# The product's channels, each LISTENed on by every listening session as a node's listener does.
CHANNELS = ("scrapyd_pgqueue_jobs", "scrapyd_pgqueue_cancel", "scrapyd_pgqueue_projects", "scrapyd_pgqueue_periodic",
            "scrapyd_pgqueue_trees")
BLOCKER_SECONDS = 3600
THROUGHPUT_RATIO_TARGET = 0.8
PICKUP_P50_TARGET_MS = 50.0
WANTING_NODE = "INSERT INTO scrapyd_node (id, name, max_proc) VALUES ('bench-wanting', 'bench-wanting', 1)"
NO_WANTING_NODE = "DELETE FROM scrapyd_node WHERE id = 'bench-wanting'"
DROP_WAITING = "DELETE FROM spider_job WHERE status = 'pending'"
WANTS_WORK = "SELECT wants_work FROM scrapyd_node WHERE stopped_time IS NULL AND id <> 'bench-wanting'"


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    counts, sizes = LISTENER_COUNTS[ctx.profile.name], SIZES[ctx.profile.name]
    servers = Servers(max(counts) + MAX_CONNECTIONS_SPARE, 100, ctx.log)
    try:
        servers.start()
        local = dataclasses.replace(ctx, database_url=servers.direct_url)
        config = {"max_proc": "1", "listen_notify": "on"}
        with LocalCluster(servers.direct_url, 1, directory=ctx.workdir / "notify", config=config) as cluster:
            wakeup._wait_idle(local, cluster, listening=True)
            pickup = {count: _pickups(local, cluster, count, sizes["pickups"]) for count in (0, max(counts))}
            _hold_the_slot(local, cluster)
            with Listeners(servers.direct_url, 0, ctx.log) as none:  # warm-up, not kept: caches, first connections
                _measure(local, cluster, none, "busy", {**sizes, "seconds": 1.0, "enqueue_jobs": 500})
            series = {mode: {} for mode in ("busy", "wanting")}
            for count in counts:
                with Listeners(servers.direct_url, count, ctx.log) as listeners:
                    for mode in series:
                        series[mode][count] = _measure(local, cluster, listeners, mode, sizes)
    finally:
        servers.remove()
    series["pickup"] = pickup
    return _result(series, counts, sizes)


def _measure(ctx: Context, cluster, listeners: Listeners, mode: str, sizes: dict) -> dict:
    _sql(ctx.database_url, DROP_WAITING)
    _sql(ctx.database_url, WANTING_NODE if mode == "wanting" else NO_WANTING_NODE)
    heard = listeners.received()
    schedules = _schedule_from_clients(cluster.nodes[0], mode, sizes["seconds"])
    heard_schedules = listeners.received() - heard
    enqueue = _enqueue(ctx, mode, sizes["enqueue_jobs"])
    heard_enqueue = listeners.received() - heard - heard_schedules
    per_listener = max(listeners.count, 1)
    ctx.log(f"notify: {listeners.count} listeners, {mode}: {schedules['jobs_per_s']:.0f} schedules/s, "
            f"enqueue {enqueue['jobs_per_s']:.0f} jobs/s; notifications received {heard_schedules + heard_enqueue:,}")
    _sql(ctx.database_url, NO_WANTING_NODE)
    return {"schedule": {**schedules, "notifies_per_listener": heard_schedules / per_listener,
                         "notifications_received": heard_schedules},
            "enqueue": {**enqueue, "notifies_per_listener": heard_enqueue / per_listener,
                        "notifications_received": heard_enqueue}}


def _schedule_from_clients(node, mode: str, seconds: float) -> dict:
    """``CLIENTS`` threads POST schedule.json for ``seconds``: ok answers per second, each answer's time."""
    latencies: list[float] = []
    refused: list[str] = []
    run_id = uuid.uuid4().hex[:8]
    end = time.monotonic() + seconds

    def client(index: int) -> None:
        sent = 0
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = node.post("schedule.json", project=wakeup.PROJECT, spider=wakeup.SPIDER,
                               jobid=f"n-{mode}-{run_id}-{index}-{sent}", seconds="0")
            latencies.append(time.perf_counter() - started)
            if answer.get("status") != "ok":
                refused.append(str(answer.get("message")))
            sent += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if refused:
        raise RuntimeError(f"notify: schedule.json refused {len(refused)} jobs: {refused[:3]}")
    return {"jobs": len(latencies), "seconds": elapsed, "jobs_per_s": len(latencies) / elapsed,
            "answer_p50_ms": percentile(latencies, 0.5) * 1000, "answer_p99_ms": percentile(latencies, 0.99) * 1000}


def _enqueue(ctx: Context, mode: str, jobs: int) -> dict:
    """``scrapyd-pgqueue enqueue`` of a JSON Lines file, ``ENQUEUE_BATCH`` jobs a transaction, start-up included."""
    path = ctx.workdir / f"notify-{mode}.jsonl"
    run_id = uuid.uuid4().hex[:8]
    path.write_text("".join(f'{{"spider": "sleeper", "jobid": "e-{run_id}-{i}"}}\n' for i in range(jobs)))
    command = [str(Path(sys.executable).parent / "scrapyd-pgqueue"), "enqueue", "--project", wakeup.PROJECT,
               "--batch-size", str(ENQUEUE_BATCH), str(path)]
    env = {**os.environ, "SCRAPYD_DATABASE_URL": ctx.database_url}  # not on the command line (ps)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    elapsed = time.perf_counter() - started
    batches = -(-jobs // ENQUEUE_BATCH)
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed, "batch_ms": elapsed / batches * 1000}


def _pickups(ctx: Context, cluster, count: int, jobs: int) -> dict:
    """The wakeup suite's measure on the idle node, with ``count`` listening sessions on the server."""
    with Listeners(ctx.database_url, count, ctx.log):
        _wait_wanting(ctx, True)
        pauses = random.Random(count)
        samples = [wakeup._one_job(ctx, cluster, f"pickup{count}", index, pauses, 1.0) for index in range(jobs)]
    latencies = [sample["latency_ms"] for sample in samples]
    from_request = [sample["from_request_ms"] for sample in samples]
    ctx.log(f"notify: pickup with {count} listeners: p50 {percentile(latencies, 0.5):.1f} ms")
    return {"samples": len(latencies), "p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies), "from_request_p50_ms": percentile(from_request, 0.5),
            "from_request_p99_ms": percentile(from_request, 0.99)}


def _hold_the_slot(ctx: Context, cluster) -> None:
    """Start a crawl that outlasts the run on the node's one slot: it then says it wants no work."""
    answer = cluster.nodes[0].post("schedule.json", project=wakeup.PROJECT, spider=wakeup.SPIDER,
                                   jobid="notify-blocker", seconds=str(BLOCKER_SECONDS))
    if answer.get("status") != "ok":
        raise RuntimeError(f"notify: the blocking crawl was refused: {answer}")
    _wait_wanting(ctx, False)


def _wait_wanting(ctx: Context, wants: bool, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _sql(ctx.database_url, WANTS_WORK) != [(wants,)]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"notify: the node did not say wants_work = {wants} within {timeout:g} s")
        time.sleep(0.1)


def _sql(url: str, statement: str) -> list | None:
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchall() if cursor.description else None


class Listeners:
    """``count`` idle sessions LISTENing on the product's channels, read by one process (started and ended by
    ``with``); ``received()``: the notifications they read so far."""

    def __init__(self, url: str, count: int, log):
        self.url, self.count, self.log = url, count, log
        context = multiprocessing.get_context("spawn")
        self.heard = context.Value("q", 0)
        self.ready, self.stopping = context.Event(), context.Event()
        self.process = context.Process(target=_listen, args=(url, count, self.heard, self.ready, self.stopping),
                                       daemon=True)

    def __enter__(self) -> Listeners:
        if self.count:
            started = time.monotonic()
            self.process.start()
            if not self.ready.wait(300):
                raise RuntimeError(f"notify: {self.count} listening sessions not connected within 300 s")
            self.log(f"notify: {self.count} listening sessions in {time.monotonic() - started:.1f} s")
        return self

    def __exit__(self, *exc) -> None:
        if self.count:
            self.stopping.set()
            self.process.join(60)

    def received(self) -> int:
        return self.heard.value


def _listen(url: str, count: int, heard, ready, stopping) -> None:
    """The listening process: open, LISTEN, then read what arrives until told to stop."""
    import selectors

    import psycopg2

    selector = selectors.DefaultSelector()  # epoll: a thousand descriptors
    connections = []
    for _ in range(count):
        connection = psycopg2.connect(url, application_name="bench-listener")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute("; ".join(f"LISTEN {channel}" for channel in CHANNELS))
        selector.register(connection, selectors.EVENT_READ)
        connections.append(connection)
    ready.set()
    while not stopping.is_set():
        for key, _ in selector.select(0.5):
            connection = key.fileobj
            connection.poll()
            if connection.notifies:
                with heard.get_lock():
                    heard.value += len(connection.notifies)
                connection.notifies.clear()
    for connection in connections:
        connection.close()


def _result(series: dict, counts: tuple[int, ...], sizes: dict) -> dict:
    most = max(counts)
    ratios = {}
    for mode in ("busy", "wanting"):
        for way in ("schedule", "enqueue"):
            for count in counts[1:]:
                ratios[f"{mode}, {way}: {count} listeners / none, jobs/s"] = ratio(
                    series[mode][count][way]["jobs_per_s"], series[mode][0][way]["jobs_per_s"])
    pickup = series["pickup"]
    return {
        "parameters": {"listener_counts": list(counts), "clients": CLIENTS, "enqueue_batch": ENQUEUE_BATCH,
                       "channels": list(CHANNELS), "max_proc": 1, **sizes},
        "series": series,
        "ratios": ratios,
        "targets": [
            report.target(f"busy: schedule.json with {most} listeners / none", ratios[
                f"busy, schedule: {most} listeners / none, jobs/s"], ">=", THROUGHPUT_RATIO_TARGET,
                "the node full: it wants no work, nothing notifies"),
            report.target(f"pickup p50 (ms), idle node, {most} listeners", pickup[most]["p50_ms"], "<=",
                          PICKUP_P50_TARGET_MS, "schedule.json answer -> spawnProcess"),
        ],
        "notes": [
            "wanting: one registered node that wants work and never claims, so every schedule and every batch "
            "notifies (as each did before nodes said whether they want work): the cost the bound avoids",
            "notifies per listener: notifications the listening sessions read / their number = notifying "
            "transactions that reached them",
        ],
    }


def format_table(result: dict) -> str:
    rows = []
    for mode in ("busy", "wanting"):
        for count, data in result["series"][mode].items():
            for way in ("schedule", "enqueue"):
                figures = data[way]
                latency = (f"{figures['answer_p50_ms']:.1f} / {figures['answer_p99_ms']:.1f}" if way == "schedule"
                           else f"{figures['batch_ms']:.1f} a batch")
                rows.append([mode, report.number(int(count)), way, report.number(figures["jobs"]),
                             report.number(figures["jobs_per_s"]), latency,
                             report.number(figures["notifies_per_listener"], 1)])
    pickups = [[report.number(int(count)), report.number(data["samples"]), report.number(data["p50_ms"], 1),
                report.number(data["p99_ms"], 1), report.number(data["max_ms"], 1),
                report.number(data["from_request_p50_ms"], 1), report.number(data["from_request_p99_ms"], 1)]
               for count, data in result["series"]["pickup"].items()]
    return report.table_text(result, [
        report.heading("NOTIFY with idle listening sessions"),
        report.format_rows(["mode", "listeners", "way in", "jobs", "jobs/s", "answer p50 / p99 ms",
                            "notifies per listener"], rows),
        "",
        report.format_rows(["listeners", "pickups", "p50 ms", "p99 ms", "max ms", "from request p50 ms",
                            "from request p99 ms"], pickups),
        "",
    ], ratios="ratio")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    figure, axes = plt.subplots(figsize=(7, 4))
    for mode, marker in (("busy", "o"), ("wanting", "s")):
        data = result["series"][mode]
        counts = sorted(data, key=int)
        axes.plot([max(int(count), 1) for count in counts], [data[count]["schedule"]["jobs_per_s"] for count in counts],
                  marker=marker, label=f"schedule.json, {mode}")
    axes.set_xscale("log")
    report.finish_axes(axes, title="schedule.json from 8 clients against listening sessions",
                       xlabel="listening sessions (0 drawn at 1)", ylabel="jobs per second")
    return [report.save_figure(plt, figure, directory / "notify.png")]
