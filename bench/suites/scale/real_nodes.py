"""Series poll_only and listeners_direct: real Scrapyd nodes behind PgBouncer, idle, then running jobs."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import json
import math
import random
import re
import threading
import time
import uuid
from pathlib import Path

from bench.context import Context
from bench.processes import cpu_cores, cpu_seconds
from bench.servers import Servers, connect, connect_bouncer
from bench.stats import summarise
from bench.suites.scale.figures import _last_line
from bench.suites.scale.sampling import Sampler, _backends, _bouncer_totals, _bouncer_window, _transactions
from bench.suites.scale.settings import (
    CONNECTION_ERRORS,
    FINISHED_TO_KEEP,
    HEARTBEAT_INTERVAL,
    JOB_SECONDS,
    LEASE_SECONDS,
    MAX_PROC,
    OTHER_PROBLEMS,
    POLL_ONLY_LINE,
    PROJECT,
    RANDOM_SEED,
    REAL_MAX_CLIENT_CONN,
    SPIDER,
    STATS_QUIET_SECONDS,
    Sizes,
)


def _real_mode(ctx: Context, sizes: Sizes, name: str, direct: bool, poll_interval: float,
               max_connections: int) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    servers = Servers(max_connections, REAL_MAX_CLIENT_CONN, ctx.log)
    sampler = cluster = None
    result = {"mode": name, "nodes": sizes.real_nodes, "listen_url": direct, "poll_interval": poll_interval,
              "max_connections": max_connections}
    try:
        servers.start()
        result["pgbouncer_open_files"] = servers.fd_limit
        sampler = Sampler(servers)
        sampler.start()
        config = {
            "max_proc": str(MAX_PROC),
            "poll_interval": f"{poll_interval:g}",
            "heartbeat_interval": f"{HEARTBEAT_INTERVAL:g}",
            "lease_seconds": f"{LEASE_SECONDS:g}",
            "finished_to_keep": str(FINISHED_TO_KEEP),
        }
        if direct:
            config["listen_url"] = servers.direct_url
        record_dir = ctx.workdir / f"scale-{name}-runs"
        cluster = LocalCluster(servers.url, sizes.real_nodes, directory=ctx.workdir / f"scale-{name}",
                               config=config, env={"EXAMPLE_RECORD_DIR": str(record_dir)})
        ctx.log(f"scale: {name}: starting {sizes.real_nodes} nodes (PgBouncer {servers.url.split('@')[-1]}, "
                f"Postgres max_connections {max_connections}, poll_interval {poll_interval:g}"
                f"{', listen_url direct' if direct else ', poll-only'})")
        result["start"] = _start_nodes(ctx, cluster, sizes.start_timeout)
        all_ready = time.monotonic()
        ctx.log(f"scale: {name}: {len(cluster.nodes)} nodes up in {result['start']['seconds']:.1f} s "
                f"(retried: {result['start']['retried']}); listspiders.json on each")
        result["warmup_seconds"] = _warm_up(cluster, sizes.warmup_threads)
        result["settle"] = _settle(ctx, cluster, servers, direct)
        # Every node healthy for a lease (it then recovers others' leases every heartbeat), and the warm-up's
        # counts reported (STATS_QUIET_SECONDS).
        ready_at = time.monotonic() + STATS_QUIET_SECONDS
        if sizes.wait_for_lease:
            ready_at = max(ready_at, all_ready + LEASE_SECONDS + HEARTBEAT_INTERVAL)
        time.sleep(max(0.0, ready_at - time.monotonic()))
        ctx.log(f"scale: {name}: idle for {sizes.idle_seconds:g} s")
        result["idle"] = _measure_idle(servers, sampler, cluster, sizes.idle_seconds)
        ctx.log(f"scale: {name}: idle {result['idle']['transactions_per_second']:.0f} transactions/s, peak "
                f"{result['idle']['backends_peak']} backends; {sizes.jobs} jobs")
        result["jobs"] = _run_jobs(ctx, cluster, servers, sampler, sizes, name, record_dir)
        jobs = result["jobs"]
        ctx.log(f"scale: {name}: {jobs['exactly_once']}/{jobs['count']} jobs ran once; schedule.json p50 "
                f"{jobs['schedule_ms']['p50']:.0f} ms; response->spawn p50 {jobs['to_spawn_ms']['p50']:.0f} ms")
    finally:
        if sampler is not None:
            sampler.stop()
        if cluster is not None:
            ctx.log(f"scale: {name}: stopping the nodes")
            cluster.stop()
        servers.remove()
    if cluster is not None:
        result["errors"] = _scan_logs(cluster)
        result["poll_only_lines"] = result["errors"].pop("poll_only_lines")
    result["sampler_failures"] = sampler.failures if sampler is not None else None
    return result


def _start_nodes(ctx: Context, cluster, timeout: float) -> dict:
    """Start every node at once and wait for each; a node that fails is retried once on another port."""
    from scrapyd_pgqueue.local.devdb import free_port

    started = time.monotonic()
    deadline = started + timeout
    for node in cluster.nodes:
        node.start()
    retried, failures = [], []
    for node in cluster.nodes:
        try:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        except RuntimeError as e:
            reason = _last_line(str(e))
            ctx.log(f"scale: node {node.name} did not start ({reason}); retrying once on another port")
            retried.append({"node": node.name, "reason": reason})
            node.stop()
            node.port = free_port()
            node.url = f"http://127.0.0.1:{node.port}/"
            node.start()
            try:
                node.wait_ready(max(30.0, deadline - time.monotonic()))
            except RuntimeError as again:
                failures.append({"node": node.name, "reason": _last_line(str(again))})
    if failures:
        raise RuntimeError(f"scale: nodes did not start: {failures}")
    return {"seconds": time.monotonic() - started, "retried": len(retried), "retries": retried}


def _warm_up(cluster, threads: int) -> float:
    """One listspiders.json per node: Scrapyd runs `scrapy list` once per node and caches it."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for answer in pool.map(lambda node: node.get("listspiders.json", timeout=300, project=PROJECT),
                               cluster.nodes):
            if SPIDER not in answer.get("spiders", ()):
                raise RuntimeError(f"scale: spider {SPIDER} not in project {PROJECT}: {answer}")
    return time.monotonic() - started


def _settle(ctx: Context, cluster, servers: Servers, direct: bool, timeout: float = 120.0) -> dict:
    """Until every node runs poll-only (said in its log) or every listener is connected (pg_stat_activity)."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if direct:
            with contextlib.closing(connect(servers.admin_url)) as connection, connection.cursor() as cursor, \
                    contextlib.closing(connect_bouncer(servers)) as bouncer, bouncer.cursor() as bouncer_cursor:
                done = _backends(cursor, bouncer_cursor)["listeners"]
        else:
            done = sum(_count_lines(node.logfile, POLL_ONLY_LINE) for node in cluster.nodes)
        if done >= len(cluster.nodes):
            return {"seconds": time.monotonic() - started, "ready": done}
        if time.monotonic() > deadline:
            what = "listeners connected" if direct else "nodes said they run poll-only"
            ctx.log(f"scale: only {done} of {len(cluster.nodes)} {what} after {timeout:g} s; measuring anyway")
            return {"seconds": time.monotonic() - started, "ready": done}
        time.sleep(0.5)


def _count_lines(path: Path, needle: str) -> int:
    try:
        return sum(1 for line in path.read_text(errors="replace").splitlines() if needle in line)
    except OSError:
        return 0


def _cpu_groups_real(servers: Servers, cluster) -> dict[str, list[int]]:
    return {
        "nodes": [node.process.pid for node in cluster.nodes if node.process is not None],
        "postgres": [servers.postmaster_pid()],
        "pgbouncer": [servers.bouncer_pid()],
    }


def _measure_idle(servers: Servers, sampler: Sampler, cluster, seconds: float) -> dict:
    groups = _cpu_groups_real(servers, cluster)
    first_bouncer = _bouncer_totals(servers)
    first_transactions, first_cpu, start = _transactions(servers), cpu_seconds(groups), time.monotonic()
    time.sleep(seconds)
    last_transactions, last_cpu, end = _transactions(servers), cpu_seconds(groups), time.monotonic()
    last_bouncer = _bouncer_totals(servers)
    window = end - start
    transactions = last_transactions - first_transactions - 1  # the first reading's own transaction
    return {
        "pgbouncer": _bouncer_window(first_bouncer, last_bouncer, transactions, window),
        "window_seconds": window,
        "transactions": transactions,
        "transactions_per_second": transactions / window,
        "transactions_per_second_per_node": transactions / window / len(cluster.nodes),
        "cpu_cores": cpu_cores(first_cpu, last_cpu, window),
        **sampler.summary(start, end),
    }


def _run_jobs(ctx: Context, cluster, servers: Servers, sampler: Sampler, sizes: Sizes, name: str,
              record_dir: Path) -> dict:
    chooser = random.Random(RANDOM_SEED)
    jobs = [f"scale-{name}-{index:04d}-{uuid.uuid4().hex[:6]}" for index in range(sizes.jobs)]
    targets = {job: chooser.choice(cluster.nodes) for job in jobs}
    requests: dict[str, dict] = {}
    slots = threading.BoundedSemaphore(sizes.in_flight)
    released: set[str] = set()
    lock = threading.Lock()
    stopping = threading.Event()

    def release(job):
        with lock:
            if job in released:
                return
            released.add(job)
        slots.release()

    def schedule(job):
        node = targets[job]
        sent = time.perf_counter()
        try:
            answer = node.post("schedule.json", timeout=120, project=PROJECT, spider=SPIDER, jobid=job,
                               seconds=JOB_SECONDS)
            error = None if answer.get("status") == "ok" else str(answer)[:300]
        except Exception as e:  # noqa: BLE001 - counted: a refused or failed request is a result
            error = f"{type(e).__name__}: {e}"[:300]
        requests[job] = {"node": node.name, "ms": (time.perf_counter() - sent) * 1000, "error": error,
                         "responded": time.time(), "responded_local": datetime.datetime.now()}
        if error is not None:
            release(job)

    def watch():  # frees a slot for every job terminated in spider_job
        with contextlib.closing(connect(servers.direct_url)) as connection, connection.cursor() as cursor:
            while not stopping.is_set():
                cursor.execute("SELECT job FROM spider_job WHERE status = 'terminated' AND job = ANY(%s)", (jobs,))
                for (job,) in cursor.fetchall():
                    release(job)
                stopping.wait(0.2)

    groups = _cpu_groups_real(servers, cluster)
    first_bouncer = _bouncer_totals(servers)
    first_transactions, first_cpu, start = _transactions(servers), cpu_seconds(groups), time.monotonic()
    watcher = threading.Thread(target=watch, name="scale-watch", daemon=True)
    watcher.start()
    deadline = start + sizes.jobs_timeout
    try:
        with concurrent.futures.ThreadPoolExecutor(sizes.schedule_threads) as pool:
            for job in jobs:
                if not slots.acquire(timeout=max(1.0, deadline - time.monotonic())):
                    ctx.log(f"scale: {name}: in-flight jobs did not terminate within {sizes.jobs_timeout:g} s; "
                            "the rest are not scheduled")
                    for left in jobs[jobs.index(job):]:
                        requests[left] = {"node": targets[left].name, "ms": math.nan, "responded": math.nan,
                                          "responded_local": None, "error": "not scheduled: deadline passed"}
                    break
                pool.submit(schedule, job)
        scheduled = time.monotonic()
        while len(released) < len(jobs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        stopping.set()
        watcher.join(5)
    end = time.monotonic()
    last_transactions, last_cpu = _transactions(servers), cpu_seconds(groups)
    last_bouncer = _bouncer_totals(servers)
    rows = _job_rows(servers, jobs)
    runs = _read_runs(record_dir)
    return _job_figures(jobs, requests, rows, runs, sampler.summary(start, end), {
        "seconds": end - start,
        "scheduling_seconds": scheduled - start,
        "transactions_per_second": (last_transactions - first_transactions - 1) / (end - start),
        "pgbouncer": _bouncer_window(first_bouncer, last_bouncer, last_transactions - first_transactions - 1,
                                     end - start),
        "cpu_cores": cpu_cores(first_cpu, last_cpu, end - start),
        "in_flight_cap": sizes.in_flight,
        "threads": sizes.schedule_threads,
        "unterminated_at_deadline": len(jobs) - len(released),
    })


def _job_rows(servers: Servers, jobs: list[str]) -> dict[str, dict]:
    with contextlib.closing(connect(servers.direct_url)) as connection, connection.cursor() as cursor:
        cursor.execute("""
            SELECT job, status, outcome, node, attempts, start_time, end_time FROM spider_job WHERE job = ANY(%s)
        """, (jobs,))
        names = [column.name for column in cursor.description]
        rows = collections.defaultdict(list)
        for values in cursor.fetchall():
            row = dict(zip(names, values))
            rows[row["job"]].append(row)
    return rows


def _read_runs(record_dir: Path) -> list[dict]:
    path = record_dir / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _job_figures(jobs, requests, rows, runs, peaks, extra) -> dict:
    wanted = set(jobs)
    ran = collections.Counter(run["job"] for run in runs if run.get("job") in wanted)
    started = {}
    for run in runs:
        if run.get("job") in wanted:
            started.setdefault(run["job"], run["started"])
    ok = [job for job in jobs if requests.get(job, {}).get("error") is None and job in requests]
    to_spawn, to_spider = [], []
    for job in ok:
        job_rows = rows.get(job, [])
        if len(job_rows) == 1 and job_rows[0]["start_time"] is not None:
            to_spawn.append((job_rows[0]["start_time"] - requests[job]["responded_local"]).total_seconds() * 1000)
        if job in started:
            to_spider.append((started[job] - requests[job]["responded"]) * 1000)
    outcomes = collections.Counter(str(row["outcome"]) for job in jobs for row in rows.get(job, []))
    errors = [requests[job]["error"] for job in jobs if requests.get(job, {}).get("error")]
    return {
        "count": len(jobs),
        "schedule_errors": len(errors),
        "schedule_error_samples": errors[:5],
        "exactly_once": sum(1 for job in jobs if ran[job] == 1),
        "not_exactly_once": sum(1 for job in jobs if ran[job] != 1),
        "never_ran": sum(1 for job in jobs if ran[job] == 0),
        "ran_more_than_once": sum(1 for job in jobs if ran[job] > 1),
        "terminated": sum(1 for job in jobs if any(row["status"] == "terminated" for row in rows.get(job, []))),
        "rows_per_job_max": max((len(rows.get(job, [])) for job in jobs), default=0),
        "claimed_more_than_once": sum(1 for job in jobs for row in rows.get(job, []) if row["attempts"] > 1),
        "outcomes": dict(outcomes),
        "ran_on_scheduling_node": sum(1 for job in ok if rows.get(job) and rows[job][0]["node"] == requests[job]["node"]),
        "schedule_ms": summarise([requests[job]["ms"] for job in ok]),
        "to_spawn_ms": summarise(to_spawn),
        "to_spider_ms": summarise(to_spider),
        "to_spawn_ms_values": sorted(to_spawn),
        "to_spider_ms_values": sorted(to_spider),
        **peaks,
        **extra,
    }


def _scan_logs(cluster) -> dict:
    """Connection errors (CONNECTION_ERRORS) and other problem lines in every node's log and its crawls' logs."""
    patterns = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in CONNECTION_ERRORS.items()}
    other = re.compile(OTHER_PROBLEMS)
    counts = collections.Counter()
    samples: list[str] = []
    other_count, other_samples = 0, []
    nodes_with_errors = set()
    poll_only = lines_matched = 0
    for node in cluster.nodes:
        files = [node.logfile, *sorted((node.directory / "logs").rglob("*.log"))]
        for path in files:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                if POLL_ONLY_LINE in line:
                    poll_only += 1
                    continue
                matched = [name for name, pattern in patterns.items() if pattern.search(line)]
                if matched:
                    lines_matched += 1
                    counts.update(matched)
                    nodes_with_errors.add(node.name)
                    if len(samples) < 8:
                        samples.append(f"{node.name}/{path.name}: {line.strip()[:300]}")
                elif other.search(line):
                    other_count += 1
                    if len(other_samples) < 8:
                        other_samples.append(f"{node.name}/{path.name}: {line.strip()[:300]}")
    return {
        "connection_errors": lines_matched,  # lines: a line matching two patterns counts once
        "by_pattern": dict(counts),
        "nodes_with_errors": len(nodes_with_errors),
        "samples": samples,
        "other_problem_lines": other_count,
        "other_samples": other_samples,
        "poll_only_lines": poll_only,
    }
