"""Frontier store: one crawl's frontier (``FrontierStore.step``, table ``crawl_request``) holding Q queued requests.

For each depth (1,000 queued: the reference; then Q) the table is emptied, a crawl with 8 workers made (spider_job
rows, status ``ongoing``, ``crawl`` set, through ``JobStore`` as a node makes them), and Q ready requests put in by
one INSERT ... SELECT generate_series: 20-byte sha256-prefix fingerprints, 304-byte request blobs, 100 download
slots round robin, priority 0; then VACUUM ANALYZE (again before each cell, so each starts from a settled table).

First the lease step taken apart: one worker sends the statements of ``step`` one by one, as ``step`` sends them,
each timed from the client. Then cells, each run by 1 and by 8 client threads (each a worker with a connection of
its own) for a fixed time, 3 times in the full run (the median rate is reported):

- ``lease``: a worker's step as a crawl runs it: the requests its last pages found (as many as it acknowledges, none
  a duplicate: the crawl's depth stays at Q), the acknowledgement of its previous lease, a lease of 16 at 8 per slot.
  At 1,000 queued a bare lease + acknowledge would empty the crawl within a second, hence the output in the step.
- ``lease_only`` (at Q only): ``step(done=previous lease, lease=16, per_slot=8)``, nothing stored.
- ``enqueue``: steps of 500 new requests, half of them duplicates of stored fingerprints (none leased).

Per cell: requests leased (or stored) per second of wall time, the step's client latency, and the server's CPU time
per step (the postmaster's process tree from /proc, background processes included; None when the server is not a
local process). Then the table's and each index's size at Q, fresh after the fill.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import random
import statistics
import threading
import time
from pathlib import Path

from bench import database, processes, report
from bench.context import Context
from bench.stats import ratio, summarise_ms
from bench.suites.frontierstore.table import STEP_STATEMENTS, format_table, plot

SUMMARY = "the crawl frontier at 1,000 and 1,000,000 queued requests: lease + acknowledge, enqueue with dedup, size"
SERIES = ("lease", "enqueue", "statements", "sizes")

DEPTHS = {"quick": (1_000, 50_000), "full": (1_000, 1_000_000)}
RUNS = {"quick": (1, 2.0), "full": (3, 5.0)}  # runs of each cell (the median rate is reported), seconds each
STATEMENT_STEPS = {"quick": 200, "full": 600}  # steps taken apart, statement by statement
CLIENTS = (1, 8)
LEASE, PER_SLOT = 16, 8  # a worker's CONCURRENT_REQUESTS, the crawl's CONCURRENT_REQUESTS_PER_DOMAIN
ENQUEUE_BATCH, DUPLICATE_SHARE = 500, 0.5
SLOTS = 100
REQUEST_BYTES = 304  # the fill's blob: 19 md5 digests
LEASE_TARGET = 0.8  # lease rate at Q over the rate at 1,000
PROJECT = "frontierstore"

# The fill: fingerprint i is sha256 of i's 8 big-endian bytes, cut to 20 (a sha1's length); the client makes the
# same to send duplicates. ORDER BY i: ids in fingerprint-number order, as a crawl stores them.
FILL_REQUESTS = """
    INSERT INTO crawl_request (crawl, fingerprint, priority, slot, request)
    SELECT %(crawl)s, substring(sha256(int8send(i)) FROM 1 FOR 20), 0,
           'host' || mod(i, %(slots)s) || '.example.com', decode(repeat(md5(CAST(i AS text)), 19), 'hex')
    FROM generate_series(1, %(count)s) AS i
    ORDER BY i
"""
TRUNCATE_JOBS = "TRUNCATE spider_job RESTART IDENTITY CASCADE"  # crawl_request goes with it (its foreign key)
SETTLE = "VACUUM ANALYZE crawl_request"
TABLE_SIZES = """
    SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid),
           coalesce(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0), pg_indexes_size(c.oid)
    FROM pg_class AS c WHERE c.relname = 'crawl_request'
"""
BACKEND_PID = "SELECT pg_backend_pid()"


def run(ctx: Context) -> dict:
    runs, seconds = RUNS.get(ctx.profile.name, RUNS["full"])
    depths = DEPTHS.get(ctx.profile.name, DEPTHS["full"])
    lease, enqueue, statements, sizes = [], [], [], {}
    for depth in depths:
        ctx.log(f"frontierstore: filling a crawl with {depth:,} queued requests")
        crawl, workers = _fresh_crawl(ctx.database_url, depth)
        if depth == depths[-1]:
            sizes = _sizes(ctx.database_url, depth)
        ctx.log(f"frontierstore: {depth:,} queued, the step's statements one by one")
        steps = STATEMENT_STEPS.get(ctx.profile.name, STATEMENT_STEPS["full"])
        statements.append({"queued": depth, **_statement_times(ctx.database_url, crawl, workers[0], steps)})
        cells = [("lease", functools.partial(_lease_loop, "lease"), lease),
                 *([("lease_only", functools.partial(_lease_loop, "lease_only"), lease)] if depth == depths[-1] else []),
                 ("enqueue", _enqueue_loop, enqueue)]
        for mode, loop, points in cells:
            for clients in CLIENTS:
                ctx.log(f"frontierstore: {mode}, {clients} clients, {depth:,} queued, {runs} x {seconds:g} s")
                points.append({"queued": depth, "mode": mode, "clients": clients, **_measure(
                    ctx.database_url, crawl, workers[:clients], depth, loop, runs, seconds)})
    ratios = _ratios(lease, enqueue, statements, depths)
    return {
        "parameters": {"depths": list(depths), "runs": runs, "run_seconds": seconds, "clients": list(CLIENTS),
                       "lease": LEASE, "per_slot": PER_SLOT, "enqueue_batch": ENQUEUE_BATCH,
                       "duplicate_share": DUPLICATE_SHARE, "slots": SLOTS, "request_bytes": REQUEST_BYTES,
                       "statement_steps": steps},
        "series": {"lease": {"points": lease}, "enqueue": {"points": enqueue},
                   "statements": {"points": statements}, "sizes": sizes},
        "ratios": ratios,
        "targets": _targets(ratios, depths),
        "notes": _notes(lease, enqueue, statements, sizes, depths),
    }


# --- the crawl -------------------------------------------------------------------------------------------------


def _fresh_crawl(url: str, depth: int) -> tuple[int, list[int]]:
    """An empty queue, then a crawl of max(CLIENTS) running workers holding ``depth`` ready requests."""
    from scrapyd_pgqueue.store import JobStore

    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(TRUNCATE_JOBS)
    store = JobStore.for_url(url)
    for number in range(max(CLIENTS)):
        store.enqueue(PROJECT, {"name": "spider", "_job": f"worker-{number}"})
    claimed = store.claim_next_jobs([PROJECT], max(CLIENTS), node="bench-frontier", worker="bench-frontier").jobs
    workers = sorted(job.id for job in claimed)
    assert len(workers) == max(CLIENTS), f"claimed {len(workers)} workers of {max(CLIENTS)}"
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("UPDATE spider_job SET crawl = %(crawl)s WHERE id = ANY(%(ids)s)",
                       {"crawl": workers[0], "ids": workers})
        cursor.execute(FILL_REQUESTS, {"crawl": workers[0], "slots": SLOTS, "count": depth})
        cursor.execute(SETTLE)
    return workers[0], workers


def stored_fingerprint(number: int) -> bytes:
    """The fingerprint FILL_REQUESTS gave request ``number``."""
    return hashlib.sha256(number.to_bytes(8, "big", signed=True)).digest()[:20]


def _new_requests(count: int, stored: int = 0, duplicates: int = 0) -> list:
    """``count`` requests: ``duplicates`` of them with fingerprints among the ``stored`` ones, the rest fresh."""
    from scrapyd_pgqueue.store.frontier import NewRequest

    fingerprints = [stored_fingerprint(random.randint(1, stored)) for _ in range(duplicates)]
    fingerprints += [os.urandom(20) for _ in range(count - duplicates)]
    blob = os.urandom(REQUEST_BYTES)  # one blob for the batch: its size is what the server sees
    return [NewRequest(fingerprint, 0, f"host{random.randrange(SLOTS)}.example.com", blob)
            for fingerprint in fingerprints]


# --- the loops: one per client thread, until the deadline ------------------------------------------------------


def _lease_loop(mode: str, store, crawl: int, worker: int, deadline: float, depth: int) -> tuple[list, int]:
    """A worker's steps; its last lease acknowledged after the deadline (untimed). Returns (durations, leased)."""
    durations, leased, held = [], 0, []
    while time.perf_counter() < deadline:
        new = _new_requests(len(held)) if mode == "lease" else []
        started = time.perf_counter()
        step = store.step(crawl, worker, new=new, done=held, lease=LEASE, per_slot=PER_SLOT)
        durations.append(time.perf_counter() - started)
        held = [request.id for request in step.leased]
        leased += len(held)
    store.step(crawl, worker, new=_new_requests(len(held)) if mode == "lease" else [], done=held)
    return durations, leased


def _enqueue_loop(store, crawl: int, worker: int, deadline: float, depth: int) -> tuple[list, int]:
    """Batches of new requests, half duplicates of the fill's. Returns (durations, requests stored)."""
    durations, stored = [], 0
    duplicates = int(ENQUEUE_BATCH * DUPLICATE_SHARE)
    while time.perf_counter() < deadline:
        batch = _new_requests(ENQUEUE_BATCH, stored=depth, duplicates=duplicates)
        started = time.perf_counter()
        step = store.step(crawl, worker, new=batch)
        durations.append(time.perf_counter() - started)
        stored += step.stored
    return durations, stored


def _cell(url: str, crawl: int, workers: list[int], seconds: float, depth: int, loop) -> dict:
    """``loop`` in one thread per worker for ``seconds``, each thread over an engine (a connection) of its own."""
    from scrapyd_pgqueue.database import db
    from scrapyd_pgqueue.store.frontier import FrontierStore

    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(SETTLE)
    stores = [FrontierStore.for_engine(db.get_engine(url, pool_size=1, migrate_schema=False,
                                                     purpose=f"frontierstore-{n}")) for n in range(len(workers))]
    results, errors = [None] * len(workers), []
    start = threading.Barrier(len(workers) + 1)

    def client(n: int) -> None:
        try:
            start.wait()
            results[n] = loop(stores[n], crawl, workers[n], time.perf_counter() + seconds, depth)
        except Exception as error:  # noqa: BLE001 - raised again in the measuring thread
            errors.append(error)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(len(workers))]
    for thread in threads:
        thread.start()
    server = _server_process(url)
    cpu_before = _server_cpu(server)
    started = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu_used = None if server is None else _server_cpu(server) - cpu_before
    if errors:
        raise errors[0]
    requests = sum(result[1] for result in results)
    return {"durations": [duration for result in results for duration in result[0]], "requests": requests,
            "per_second": requests / elapsed, "server_cpu_seconds": cpu_used}


def _measure(url: str, crawl: int, workers: list[int], depth: int, loop, runs: int, seconds: float) -> dict:
    """``runs`` runs of a cell: the median rate (a shared machine's load moves one run), latencies pooled."""
    measured = [_cell(url, crawl, workers, seconds, depth, loop) for _ in range(runs)]
    durations = [duration for run in measured for duration in run["durations"]]
    cpu = [run["server_cpu_seconds"] for run in measured]
    return {"runs": [run["per_second"] for run in measured], "steps": len(durations),
            "requests": sum(run["requests"] for run in measured),
            "per_second": statistics.median(run["per_second"] for run in measured),
            "latency": summarise_ms(durations),
            "server_cpu_ms_per_step": None if None in cpu else 1000 * sum(cpu) / max(len(durations), 1)}


# --- the step taken apart --------------------------------------------------------------------------------------


def _statement_times(url: str, crawl: int, worker: int, steps: int) -> dict:
    """The lease cell's step (one worker) sent statement by statement as step() sends them, in one transaction
    each, every statement timed from the client. CRAWL_OPEN is left out: a step that leased does not send it."""
    from scrapyd_pgqueue.database import db
    from scrapyd_pgqueue.store import frontier

    engine = db.get_engine(url, pool_size=1, migrate_schema=False, purpose="frontierstore-0")
    store = frontier.FrontierStore.for_engine(engine)
    held = [request.id for request in store.step(crawl, worker, lease=LEASE, per_slot=PER_SLOT).leased]
    times = {name: [] for name in STEP_STATEMENTS}
    lease = {"limit": LEASE, "per_slot": PER_SLOT, "delay": 0.0, "scan": frontier.LEASE_SCAN}
    for _ in range(steps):
        scope, new = {"crawl": crawl, "worker": worker}, _new_requests(len(held))
        marks = [time.perf_counter()]  # after each of STEP_STATEMENTS
        with db.operation(engine), db.transaction(engine) as connection:
            connection.execute(frontier.STORE_REQUESTS, {**scope, **_columns(new)})
            marks.append(time.perf_counter())
            connection.execute(frontier.FINISH_REQUESTS, {**scope, "ids": held})
            marks.append(time.perf_counter())
            connection.execute(frontier.LOCK_CRAWL_LEASES, scope)
            marks.append(time.perf_counter())
            held = [row.id for row in connection.execute(frontier.LEASE_REQUESTS, {**scope, **lease}).fetchall()]
            marks.append(time.perf_counter())
        marks.append(time.perf_counter())
        for name, before, after in zip(STEP_STATEMENTS, marks, marks[1:]):
            times[name].append(after - before)
    store.step(crawl, worker, new=_new_requests(len(held)), done=held)
    return {name: summarise_ms(values) for name, values in times.items()}


def _columns(new: list) -> dict:
    return {"fingerprints": [r.fingerprint for r in new], "priorities": [r.priority for r in new],
            "slots": [r.slot for r in new], "requests": [r.request for r in new]}



# --- the server's CPU ------------------------------------------------------------------------------------------


def _server_process(url: str) -> int | None:
    """The postmaster's pid when the server is a process of this machine (a backend's parent), else None (a
    container's pids are another namespace's)."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(BACKEND_PID)
        (backend,) = cursor.fetchone()
        postmaster = _parent_if_postgres(backend)
    return postmaster if postmaster is not None and _parent_if_postgres(postmaster) is not None else None


def _parent_if_postgres(pid: int) -> int | None:
    """The parent of process ``pid`` when ``pid`` runs postgres, else None."""
    try:
        stat, name = Path(f"/proc/{pid}/stat").read_text(), Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1]) if name == "postgres" else None


def _server_cpu(postmaster: int | None) -> float:
    return 0.0 if postmaster is None else processes.cpu_seconds({"server": [postmaster]})["server"]


def _sizes(url: str, depth: int) -> dict:
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(TABLE_SIZES)
        total, heap, toast, indexes = cursor.fetchone()
        cursor.execute(database.INDEX_SIZES, {"table": "crawl_request"})
        index_bytes = dict(cursor.fetchall())
    return {"queued": depth, "total_bytes": total, "heap_bytes": heap, "toast_bytes": toast,
            "indexes_bytes": indexes, "index_bytes": index_bytes, "bytes_per_request": total / depth}


# --- ratios, targets, notes ------------------------------------------------------------------------------------


def _point(points: list[dict], queued: int, clients: int, mode: str) -> dict:
    return next(p for p in points if (p["queued"], p["clients"], p["mode"]) == (queued, clients, mode))


def _cpu(point: dict) -> float:
    return math.nan if point["server_cpu_ms_per_step"] is None else point["server_cpu_ms_per_step"]


def _ratios(lease: list[dict], enqueue: list[dict], statements: list[dict], depths) -> dict:
    low, high = depths[0], depths[-1]
    ratios = {}
    for clients in CLIENTS:
        at_low, at_high = _point(lease, low, clients, "lease"), _point(lease, high, clients, "lease")
        ratios[f"lease rate, {high} / {low} queued, {clients} workers"] = ratio(
            at_high["per_second"], at_low["per_second"])
        ratios[f"lease step server CPU, {high} / {low} queued, {clients} workers"] = ratio(
            _cpu(at_high), _cpu(at_low))
        ratios[f"lease only / lease, rate at {high}, {clients} workers"] = ratio(
            _point(lease, high, clients, "lease_only")["per_second"], at_high["per_second"])
        enqueues = (_point(enqueue, depth, clients, "enqueue")["per_second"] for depth in (high, low))
        ratios[f"enqueue rate, {high} / {low} queued, {clients} clients"] = ratio(*enqueues)
    for name in STEP_STATEMENTS:
        ratios[f"{name} statement p50, {high} / {low} queued"] = ratio(
            statements[-1][name]["p50_ms"], statements[0][name]["p50_ms"])
    return ratios


def _targets(ratios: dict, depths) -> list[dict]:
    low, high = depths[0], depths[-1]
    note = "" if high >= 1_000_000 else f"quick mode: measured to {high:,} only"
    return [report.target(f"frontier lease rate, {high:,} / {low:,} queued, {clients} workers",
                          ratios.get(f"lease rate, {high} / {low} queued, {clients} workers"), ">=", LEASE_TARGET,
                          note) for clients in CLIENTS]


# A crawl on paper: its size, its pace, its workers, the links a page offers (most of them duplicates).
PAPER_PAGES, PAPER_PAGES_PER_SECOND, PAPER_WORKERS, PAPER_LINKS_PER_PAGE = 10_000_000, 200, 100, 50


def _notes(lease: list[dict], enqueue: list[dict], statements: list[dict], sizes: dict, depths) -> list[str]:
    high = depths[-1]
    step, batch = _point(lease, high, 1, "lease"), _point(enqueue, high, 1, "enqueue")
    measured = step["server_cpu_ms_per_step"] is not None
    # Without the server's own CPU, the client's mean step time bounds it from above (a round trip included).
    step_ms = step["server_cpu_ms_per_step"] if measured else step["latency"]["mean_ms"]
    batch_ms = batch["server_cpu_ms_per_step"] if measured else batch["latency"]["mean_ms"]
    source = "server CPU per step (/proc)" if measured else "client time per step (an upper bound)"
    steps_low, steps_high = PAPER_PAGES_PER_SECOND / LEASE, PAPER_PAGES_PER_SECOND / 1
    offered = PAPER_PAGES_PER_SECOND * PAPER_LINKS_PER_PAGE
    enqueue_cores = offered / ENQUEUE_BATCH * batch_ms / 1000
    disk = PAPER_PAGES * sizes["bytes_per_request"]
    # A crawl's leases take turns (its advisory lock, from the lease statement to the commit): a ceiling per crawl.
    locked_ms = statements[-1]["lease"]["p50_ms"] + statements[-1]["commit"]["p50_ms"]
    return [
        f"a crawl's leases take turns: its lock is held for the lease and the commit, p50 {locked_ms:.2f} ms at "
        f"{high:,} queued (client time): at most {1000 / locked_ms:,.0f} lease steps/s per crawl",
        f"paper estimate, an extrapolation from one crawl at {high:,} queued on this machine, not a measurement: "
        f"{PAPER_WORKERS} workers x CONCURRENT_REQUESTS {LEASE}, {PAPER_PAGES_PER_SECOND} pages/s cluster-wide, "
        f"{PAPER_PAGES:,} pages ({PAPER_PAGES / PAPER_PAGES_PER_SECOND / 3600:.1f} h)",
        f"  {source}: lease step {step_ms:.3f} ms, enqueue step of {ENQUEUE_BATCH} {batch_ms:.3f} ms",
        f"  steps/s = pages/s / requests acknowledged per step: {steps_low:g} (16 a step) to {steps_high:g} "
        f"(1 a step): {steps_low * step_ms / 1000:.3f} to {steps_high * step_ms / 1000:.3f} cores, the crawl's lock "
        f"busy {steps_low * locked_ms / 1000:.0%} to {steps_high * locked_ms / 1000:.0%} of the time",
        f"  links: {PAPER_LINKS_PER_PAGE} a page = {offered:,} requests/s offered, {enqueue_cores:.3f} cores at the "
        f"enqueue's cost per offered request (measured with half duplicates)",
        f"  disk: {sizes['bytes_per_request']:.0f} bytes a queued request x {PAPER_PAGES:,} = "
        f"{disk / 1e9:.1f} GB at most (a done request's blob goes; its row and dedup entry stay)",
    ]


__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]
