"""Idle load: the statements K idle nodes with P projects send to Postgres, this project's poller against Scrapyd's.

Each simulated node is a real poller object: ``scrapyd_pgqueue.PostgresPoller`` ("pgqueue") or Scrapyd's own
``scrapyd.poller.QueuePoller`` ("stock") over the same shared queue (``spiderqueue =
scrapyd_pgqueue.PostgresSpiderQueue``), built from ``scrapyd.config.Config(values={})`` whose ``[settings]`` section
holds P baked-in projects, so that ``get_spider_queues`` yields P queues. Every node asks for its ``max_proc``
slots by calling ``poller.next()`` ``max_proc`` times, as Scrapyd's launcher does, and its ``poll()`` runs on a
``LoopingCall`` of its own every ``interval`` seconds (shorter than Scrapyd's default 5 s to shorten the run; the
phases are spread at random over one interval), as Scrapyd's ``TimerService`` does. ``listen_notify`` is off (see
``LISTEN_NOTIFY``): with it on, each pgqueue node also holds one LISTEN connection, which sends nothing while idle.
The queue is empty throughout.

All K pollers run under one Twisted reactor in one spawned child process (the bench process must not install a
reactor: it cannot be restarted, and later suites would inherit it). The stock poller's ``count()`` is synchronous:
it blocks the reactor for every project of every node, so with many nodes and projects one round of ticks takes
longer than the interval; figures are therefore given per tick (per node), which does not depend on how fast the
simulator goes, and converted to statements per second at Scrapyd's default 5 s interval.

Counted over a fixed window after a warm-up, in the child:
- client-side, exactly: every statement the package's engine sends (its ``statement_listeners``; one
  per ``count()``, one per claim). Each runs in autocommit, with the package's ``SET LOCAL statement_timeout ...;``
  prefix in the same query string: one round trip and one (implicit) transaction on the server, no BEGIN and no
  COMMIT. Nothing else is sent: a pooled connection is checked out without a round trip (the package looks at
  its socket for readability; there is no ping);
- server-side: transactions of the bench database (``pg_stat_database`` ``xact_commit + xact_rollback`` deltas).
  A backend reports its counts at most once a second, but always when it exits: at both ends of the window the
  ticks stop, claims in flight end and the pool is closed, so both readings are exact. And, when the server
  preloads ``pg_stat_statements``, every statement it received (the two ``SET LOCAL`` of the prefix count as
  statements there: three per query string).
"""

from __future__ import annotations

import multiprocessing
import queue as queue_module
import time

from bench import database, report
from bench.context import Context
from bench.suites.idle.figures import _growth_name, _notes, _ratios
from bench.suites.idle.plots import plot
from bench.suites.idle.settings import (
    CHILD_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    LISTEN_NOTIFY,
    MAX_PROC,
    POLLERS,
    SERIES,
    SIZES,
    SPIDERQUEUE,
    Sizes,
)
from bench.suites.idle.simulation import simulate
from bench.suites.idle.table import format_table

SUMMARY = "statements per second sent by idle nodes: this project's poller against Scrapyd's, nodes x projects"

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]


def run(ctx: Context) -> dict:
    sizes = SIZES[ctx.profile.name]
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        cursor.execute(database.TRUNCATE_SPIDER_JOB)  # idle: nothing pending, nothing running
    statements_source, created_extension = _enable_pg_stat_statements(ctx.database_url)
    # The bench process's own pooled connections (schema migration, ...) may hold unreported statistics, which an
    # idle backend reports on a 10 s timer, into a window: closed, they report now.
    from scrapyd_pgqueue.database import db

    db.get_engine(ctx.database_url).dispose()
    cells = [(nodes, projects) for nodes in sizes.nodes for projects in sizes.projects]
    try:
        measurements = _run_child(ctx, sizes, cells, statements_source is not None)
    finally:
        if created_extension:
            with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
                cursor.execute("DROP EXTENSION IF EXISTS pg_stat_statements")
    series = {kind: {"points": [m for m in measurements if m["poller"] == kind]} for kind in SERIES}
    ratios = _ratios(series, sizes)
    largest_k = max(sizes.nodes)
    return {
        "parameters": {
            "nodes": list(sizes.nodes),
            "projects": list(sizes.projects),
            "max_proc": MAX_PROC,
            "simulated_poll_interval": sizes.interval,
            "reported_at_poll_interval": DEFAULT_POLL_INTERVAL,
            "warmup_ticks": sizes.warmup_ticks,
            "window_ticks": sizes.window_ticks,
            "listen_notify": LISTEN_NOTIFY,
            "pollers": POLLERS,
            "spiderqueue": SPIDERQUEUE,
            "counted": {
                "client_statements": "SQLAlchemy before_cursor_execute on the package's engine (exact)",
                "server_transactions": "pg_stat_database xact_commit + xact_rollback deltas (pool closed at both ends)",
                "server_statements": statements_source or "not available (pg_stat_statements not preloaded)",
            },
        },
        "series": series,
        "ratios": ratios,
        "targets": [
            report.target(f"pgqueue statements/s P={max(sizes.projects)} / P={min(sizes.projects)}, K={largest_k}",
                          ratios[_growth_name("pgqueue", largest_k, sizes)], "<=", 1.1,
                          "client-side statements per tick: independent of projects"),
        ],
        "notes": _notes(series, sizes, statements_source),
    }


# --- pg_stat_statements ----------------------------------------------------------------------------------------


def _enable_pg_stat_statements(url: str) -> tuple[str | None, bool]:
    """``("pg_stat_statements", created)`` when the server preloads it (the extension is created if need be)."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('shared_preload_libraries')")
        if "pg_stat_statements" not in cursor.fetchone()[0]:
            return None, False
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')")
        if cursor.fetchone()[0]:
            return "pg_stat_statements", False
        try:
            cursor.execute("CREATE EXTENSION pg_stat_statements")
        except Exception:  # noqa: BLE001 - no right to create it: fall back to the other counts
            return None, False
        return "pg_stat_statements", True


# --- the child process: K pollers under one reactor --------------------------------------------------------------


def _run_child(ctx: Context, sizes: Sizes, cells, with_statements: bool) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    workdir = ctx.workdir / "idle"
    child = context.Process(target=simulate, name="bench-idle",
                            args=(ctx.database_url, sizes, cells, with_statements, str(workdir), messages))
    child.start()
    deadline = time.monotonic() + CHILD_TIMEOUT
    try:
        while True:
            try:
                kind, payload = messages.get(timeout=1.0)
            except queue_module.Empty:
                if not child.is_alive():
                    raise RuntimeError(f"idle: the simulation process died (exit code {child.exitcode})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"idle: the simulation did not end within {CHILD_TIMEOUT:g} s") from None
                continue
            if kind == "log":
                ctx.log(f"idle: {payload}")
            elif kind == "error":
                raise RuntimeError(f"idle: the simulation failed:\n{payload}")
            else:
                return payload
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
