"""Scale: 100 real Scrapyd nodes behind PgBouncer, then 10 to 1,000 simulated nodes, on a Postgres of its own.

The suite runs its own servers (not the bench's database): for each part a private ``LocalPostgres`` with a small
``max_connections``, a role and a database ``scrapyd`` for the nodes (not a superuser, so Postgres's reserved
slots apply to them as in production), and ``LocalPgBouncer`` (transaction pooling, ``default_pool_size`` 20) in
front of it. Everything is removed at the end, whatever happens.

1. **Real nodes, poll-only** (series ``poll_only``): ``REAL_NODES`` real ``scrapyd`` processes (``LocalCluster``),
   ``database_url`` = PgBouncer, no ``listen_url``: each node finds that LISTEN does not work through a
   transaction pooler and runs poll-only. Postgres has ``max_connections = 50``. Nodes: ``max_proc 2``,
   ``poll_interval 1``, ``heartbeat_interval 5``, ``lease_seconds 30``, ``finished_to_keep`` 1000 (so that the
   rows of every job of the run are still there to read), the rest at their defaults.
2. **Real nodes, listeners direct** (series ``listeners_direct``): the same, with ``listen_url`` = Postgres itself,
   whose ``max_connections`` is raised to 150 (100 listeners + PgBouncer's 20 + reserve), and Scrapyd's default
   ``poll_interval`` 5 s: with NOTIFY waking the nodes, polling is only the floor (as the README advises).

   For each: all nodes started at once (start-up time: first start to last ``daemonstatus.json`` answer; a node
   that fails to start is retried once on another port, and counted), one ``listspiders.json`` per node (Scrapyd
   runs ``scrapy list`` once per node and caches it; a few at a time, see WARMUP_THREADS), then until every node
   said it runs poll-only (1) or every listener is connected (2). Idle for ``idle_seconds``: the cluster's
   transactions from ``pg_stat_database`` (``xact_commit + xact_rollback`` of database ``scrapyd``; every
   autocommit statement is one transaction; a backend reports its counts at most once a second, so the window is
   long), and, sampled every 0.5 s, the server's backends of that database (``pg_stat_activity``), PgBouncer's
   clients and server connections (``SHOW POOLS``) and, every few seconds, PgBouncer's clients per node
   (``SHOW CLIENTS`` by application_name): the budget. Then ``jobs`` jobs (``sleeper``, ``seconds=0.2``, unique
   job ids) are POSTed to ``schedule.json`` of random nodes by a pool of threads, each request timed, with at
   most ``in_flight`` jobs scheduled and not yet terminated (see ``Sizes.in_flight``: 200 crawls at once would not
   fit in this machine's memory next to 100 nodes). Then it waits until every job is terminated in
   ``spider_job`` and reads: each job's row (``start_time`` = the launcher's spawn time, naive local time, the
   same clock as the bench) and the crawls' ``runs.jsonl`` (``EXAMPLE_RECORD_DIR``: one line per crawl, written
   when the spider object exists, after ~0.4 s of Scrapy start-up). Latencies are from the ``schedule.json``
   response: to the spawn (row) and to the spider (runs.jsonl), signed. Jobs run exactly once: each of the
   jobs has exactly one line in runs.jsonl. Connection errors: lines of every node's log (and of the crawls'
   logs) matching CONNECTION_ERRORS.
3. **Simulated nodes** (series ``simulated``): lightweight nodes that send a node's real statements through the
   package's store (no SQL of their own), through PgBouncer, to a Postgres with ``max_connections = 50``. Each
   simulated node has its own engine (``scrapyd_pgqueue.database.db.get_engine``, pool of 2, no overflow, its two
   connections opened at start as a busy node's pool ends up) on a URL of its own (``?application_name=sim-<n>``,
   so PgBouncer sees one client per connection, named), and does what ``PostgresLauncher`` and
   ``PostgresPoller`` do: ``register_node``; every ``heartbeat_interval`` (5 s) the node's tick, ``node_tick``
   (heartbeat, and once healthy for ``lease_seconds`` lease recovery, hand-back of forgotten claims, cancel
   requests, egg catalogue, next periodic due time: one statement, as ``LeaseKeeper``); every ``poll_interval`` (1 s), when
   it has a free slot of its 2, ``claim_next_jobs(["example"], free, node=..., worker=...)``; for each claimed
   job ``mark_started``, a hold of HOLD_SECONDS (the "crawl"), then ``finish_job(..., claimed=..., worker=...)``
   and ``prune_terminated(100)`` (``PostgresJobStorage.add``), and a claim at once for the freed slot (as the
   poller's ``next()``); after its first claim a node says once that it wants no work (``set_wants_work``: a
   poll-only node hears no NOTIFY; ``python -m bench.scale_simulated --listen-slots 8`` gives each node a session
   straight to Postgres that takes a listen slot while it wants work, ``slots.py``). Nodes run in
   ``sim_processes`` processes (multiprocessing spawn: the bench process imports no reactor), each with a timer
   thread and a pool of ``sim_threads`` threads. The count steps up (10, 100, 300, 1,000; quick: 10, 50) while
   a feeder thread of the bench enqueues a steady trickle of jobs
   (``JobStore.enqueue`` through PgBouncer), and each step is measured over ``sim_window_seconds`` after
   ``sim_settle_seconds``: server transactions/s, client operations/s (the store calls of the simulated nodes and
   the feeder) and their ratio, backends (peak), PgBouncer's clients and waiting clients, claim latency (measured
   around ``claim_next_jobs`` in the simulated node's thread: pool checkout, PgBouncer, Postgres, and the
   simulator's own GIL and CPU), heartbeat latency, timer lateness of the claim ticks, errors
   (``scrapyd_pgqueue.database.db.DatabaseError``, and anything else separately), and the CPU used by the simulator,
   Postgres, PgBouncer and the whole machine (``/proc``): on 2 cores, the simulator competes with Postgres.
"""

from __future__ import annotations

import traceback
from dataclasses import asdict

from bench import report
from bench.context import Context
from bench.servers import PGBOUNCER_POOL
from bench.suites.scale.figures import _get, _notes, _ratios
from bench.suites.scale.plots import plot
from bench.suites.scale.real_nodes import _real_mode
from bench.suites.scale.settings import (
    HEARTBEAT_INTERVAL,
    HOLD_SECONDS,
    JOB_SECONDS,
    LEASE_SECONDS,
    MAX_PROC,
    MODES,
    POOL_SIZE,
    PROJECT,
    SIM_MAX_CONNECTIONS,
    SIM_POLL_INTERVAL,
    SIZES,
    SPIDER,
)
from bench.suites.scale.simulated_nodes import _simulate
from bench.suites.scale.table import format_table

SUMMARY = ("100 real Scrapyd nodes behind PgBouncer (poll-only, then listeners direct) and 10 to 1,000 simulated "
           "nodes: server connections and transactions, schedule.json and claim latency")
SERIES = ("poll_only", "listeners_direct", "simulated")

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]


def run(ctx: Context) -> dict:
    sizes = SIZES[ctx.profile.name]
    series = {}
    # Each part on its own: one that fails is recorded (its traceback in "failed") and the others still run.
    for name, (direct, poll_interval, max_connections) in MODES.items():
        try:
            series[name] = _real_mode(ctx, sizes, name, direct, poll_interval, max_connections)
        except Exception:  # noqa: BLE001 - recorded and shown; the servers and nodes were removed
            ctx.log(f"scale: {name} failed:\n{traceback.format_exc()}")
            series[name] = {"mode": name, "nodes": sizes.real_nodes, "failed": traceback.format_exc()[-4000:]}
    try:
        series["simulated"] = _simulate(ctx, sizes)
    except Exception:  # noqa: BLE001 - as above
        ctx.log(f"scale: simulated failed:\n{traceback.format_exc()}")
        series["simulated"] = {"points": [], "failed": traceback.format_exc()[-4000:]}
    targets = [
        report.target(f"connection errors in node logs, {name}", _get(series[name], "errors", "connection_errors"),
                      "<=", 0, f"{series[name]['nodes']} real nodes") for name in MODES
    ] + [
        report.target(f"jobs not run exactly once, {name}", _get(series[name], "jobs", "not_exactly_once"), "<=", 0,
                      f"of {_get(series[name], 'jobs', 'count')}") for name in MODES
    ] + [
        report.target(f"simulated node errors, {point['nodes']:,} nodes", point["errors"] + point["errors_adding"],
                      "<=", 0, "in the window + while adding the step's nodes")
        for point in series["simulated"]["points"]
    ]
    return {
        "parameters": {
            "sizes": asdict(sizes),
            "max_proc": MAX_PROC,
            "heartbeat_interval": HEARTBEAT_INTERVAL,
            "lease_seconds": LEASE_SECONDS,
            "database_pool_size": POOL_SIZE,
            "pgbouncer_pool_size": PGBOUNCER_POOL,
            "modes": {name: {"listen_url": direct, "poll_interval": poll, "max_connections": maximum}
                      for name, (direct, poll, maximum) in MODES.items()},
            "sim_poll_interval": SIM_POLL_INTERVAL,
            "sim_max_connections": SIM_MAX_CONNECTIONS,
            "sim_hold_seconds": HOLD_SECONDS,
            "job": {"project": PROJECT, "spider": SPIDER, "seconds": JOB_SECONDS},
        },
        "series": series,
        "ratios": _ratios(series),
        "targets": targets,
        "notes": _notes(series, sizes),
    }
