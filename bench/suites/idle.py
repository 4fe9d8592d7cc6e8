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

import contextlib
import math
import multiprocessing
import queue as queue_module
import random
import threading
import time
import traceback
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.stats import ratio

SUMMARY = "statements per second sent by idle nodes: this project's poller against Scrapyd's, nodes x projects"
SERIES = ("pgqueue", "stock")

POLLERS = {"pgqueue": "scrapyd_pgqueue.PostgresPoller", "stock": "scrapyd.poller.QueuePoller"}
SPIDERQUEUE = "scrapyd_pgqueue.PostgresSpiderQueue"
MAX_PROC = 4  # slots per simulated node (scrapyd.cfg's max_proc)
DEFAULT_POLL_INTERVAL = 5.0  # Scrapyd's default: what the per-second figures are given at
# Off for the measure: with it on, each pgqueue node holds one LISTEN connection that sends nothing while idle, but
# the backend of that connection reports its LISTEN transaction up to 10 s late (an idle backend reports its
# statistics on a timer), into the window, which would spoil the exact transaction count.
LISTEN_NOTIFY = "off"
RANDOM_SEED = 7


class Sizes:
    def __init__(self, nodes, projects, interval, warmup_ticks, window_ticks, max_window_seconds):
        self.nodes = nodes  # K
        self.projects = projects  # P
        self.interval = interval  # seconds between ticks of one node in the simulation
        self.warmup_ticks = warmup_ticks  # ticks per node before the window
        self.window_ticks = window_ticks  # at least this many ticks per node (and interval x this many seconds)
        self.max_window_seconds = max_window_seconds


SIZES = {
    "quick": Sizes(nodes=(1, 5), projects=(1, 20), interval=0.25, warmup_ticks=1, window_ticks=4,
                   max_window_seconds=20.0),
    "full": Sizes(nodes=(1, 10, 50), projects=(1, 20, 200), interval=1.0, warmup_ticks=2, window_ticks=8,
                  max_window_seconds=90.0),
}
CHILD_TIMEOUT = 1800.0  # seconds for the whole grid in the child


def run(ctx: Context) -> dict:
    sizes = SIZES[ctx.profile.name]
    with database.admin_connection(ctx.database_url) as connection, connection.cursor() as cursor:
        cursor.execute(database.TRUNCATE_SPIDER_JOB)  # idle: nothing pending, nothing running
    statements_source, created_extension = _enable_pg_stat_statements(ctx.database_url)
    # The bench process's own pooled connections (schema migration, ...) may hold unreported statistics, which an
    # idle backend reports on a 10 s timer, into a window: closed, they report now.
    from scrapyd_pgqueue.store import db

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


def simulate(url: str, sizes: Sizes, cells, with_statements: bool, workdir: str, messages) -> None:
    """The child's body: every (cell, poller) measured in turn under one reactor run; results sent to ``messages``."""
    from twisted.internet import defer, reactor

    simulation = Simulation(url, sizes, with_statements, Path(workdir), lambda text: messages.put(("log", text)))

    @defer.inlineCallbacks
    def main():
        try:
            yield simulation.quiesce()
            results = []
            for nodes, projects in cells:
                for kind in SERIES:
                    result = yield simulation.measure(kind, nodes, projects)
                    results.append(result)
                    messages.put(("log", _describe(result)))
            messages.put(("result", results))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            messages.put(("error", traceback.format_exc()))
        finally:
            simulation.close()
            reactor.stop()

    reactor.callWhenRunning(main)
    reactor.run(installSignalHandlers=False)


def defer_inline(function):
    """``twisted.internet.defer.inlineCallbacks``, imported when called (no Twisted import in the bench process)."""

    def wrapper(*args, **kwargs):
        from twisted.internet import defer

        return defer.inlineCallbacks(function)(*args, **kwargs)

    return wrapper


class Counter:
    """What this process's engine sends, by kind; called from the reactor thread and the thread pool.

    Statements (the engine's ``statement_listeners``: one per count(), one per claim, each one autocommit transaction on the
    server) and connections opened (``connect_listeners``: each costs the server one transaction). A checkout sends nothing
    (the package checks the pooled connection's socket for readability, no round trip), so there is no ping to
    count.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.by_kind: dict[str, int] = {}

    def add(self, kind: str) -> None:
        with self.lock:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def statement(self, statement: str) -> None:
        lowered = statement.lower()
        self.add("count" if "count(*)" in lowered else "claim" if "update spider_job" in lowered else "other")

    def connected(self, connection) -> None:
        self.add("connect")

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.by_kind)


STATEMENT_KINDS = ("count", "claim", "other")  # what counts as a statement the pollers send
# Each snapshot reads the server's counters on a new connection, closed at once, so that it reports at exit. In a
# window: the first snapshot's connection start and its reads (one transaction per counter read; the last
# snapshot's own connection start is not reported yet when it reads, as measured); for pg_stat_statements, the
# first snapshot's reads.
def _own_transactions(with_statements: bool) -> int:
    return 1 + _own_statements(with_statements)


def _own_statements(with_statements: bool) -> int:
    return 2 if with_statements else 1


class Node:
    """One simulated Scrapyd node: a poller, its free slots, and its tick on a LoopingCall."""

    def __init__(self, poller, interval: float):
        from twisted.internet import task

        self.poller = poller
        self.ticks = 0
        self.slots = [poller.next() for _ in range(MAX_PROC)]  # as the launcher does, one per process slot
        self.loop = task.LoopingCall(self.tick)
        self.interval = interval
        self.starting = None
        self.error = None

    def tick(self):
        self.ticks += 1
        return self.poller.poll()

    def start(self, phase: float) -> None:
        """Tick every interval from ``phase`` seconds on (the nodes' phases are spread, not aligned)."""
        from twisted.internet import reactor

        self.starting = reactor.callLater(phase, self._start)

    def _start(self) -> None:
        self.starting = None
        self.loop.start(self.interval, now=True).addErrback(self.failed)

    def failed(self, failure):
        self.error = failure  # a poll that raised stops the loop, as Scrapyd's TimerService stops

    def pause(self) -> None:
        if self.starting is not None and self.starting.active():
            self.starting.cancel()
        self.starting = None
        if self.loop.running:
            self.loop.stop()

    def listening(self) -> bool:
        """PostgresPoller's listener connected (its connection start and LISTEN fall before the window)."""
        if not hasattr(self.poller, "listener") or LISTEN_NOTIFY != "on":
            return True
        return self.poller.listener is not None and self.poller.listener.connected.is_set()

    def busy(self) -> bool:
        """A claim of PostgresPoller still running in the thread pool."""
        return bool(getattr(self.poller, "claiming", False))

    def stop(self) -> None:
        self.pause()
        if hasattr(self.poller, "stop"):
            self.poller.stop()  # PostgresPoller: stop its listener thread


class Simulation:
    def __init__(self, url: str, sizes: Sizes, with_statements: bool, workdir: Path, log):
        from scrapyd_pgqueue.store import db

        self.url, self.sizes, self.with_statements, self.log = url, sizes, with_statements, log
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.engine = db.get_engine(url)  # the engine every queue and poller of this process uses
        self.counter = Counter()
        self.engine.statement_listeners.append(self.counter.statement)
        self.engine.connect_listeners.append(self.counter.connected)
        self.random = random.Random(RANDOM_SEED)

    def close(self):
        self.engine.dispose()

    def config(self, kind: str, index: int, projects: int):
        from scrapyd.config import Config

        config = Config(values={})  # reads no file; options in [scrapyd] so [settings] holds only projects
        options = {
            "database_url": self.url.replace("%", "%%"),  # ConfigParser interpolation
            "node_name": f"idle-{kind}-{index}",
            "spiderqueue": SPIDERQUEUE,
            "poller": POLLERS[kind],
            "eggs_dir": str(self.workdir / "eggs"),  # Scrapyd's FilesystemEggStorage: none deployed
            "dbs_dir": str(self.workdir / "dbs"),
            "max_proc": str(MAX_PROC),
            "poll_interval": str(self.sizes.interval),
            "listen_notify": LISTEN_NOTIFY,
        }
        for key, value in options.items():
            config.cp.set("scrapyd", key, value)
        config.cp.add_section("settings")
        for number in range(projects):
            config.cp.set("settings", f"project{number}", "example.settings")
        return config

    def build(self, kind: str, index: int, projects: int):
        from scrapy.utils.misc import load_object

        poller = load_object(POLLERS[kind])(self.config(kind, index, projects))
        if len(poller.queues) != projects:
            raise RuntimeError(f"{kind} poller has {len(poller.queues)} queues, expected {projects}")
        return poller

    def server_counts(self) -> dict:
        """The bench database's counters, read on a connection of its own that is closed at once (see OWN_*)."""
        counts = {}
        with contextlib.closing(database.connect(self.url, autocommit=True)) as connection, \
                connection.cursor() as cursor:
            if self.with_statements:
                cursor.execute("""
                    SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
                    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                """)
                counts["statements"] = cursor.fetchone()[0]
            cursor.execute("""
                SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()
            """)
            counts["transactions"] = cursor.fetchone()[0]
        return counts

    @defer_inline
    def quiesce(self, period: float = 0.5, timeout: float = 5.0):
        """Wait (at most ``timeout``) until the server counts no transactions but our own reads for ``period``.

        What ran just before (the last suite's nodes exiting, a TRUNCATE, autovacuum) must not land in a window.
        """
        from twisted.internet import reactor, task

        deadline = time.monotonic() + timeout
        last = self.server_counts()["transactions"]
        while time.monotonic() < deadline:
            yield task.deferLater(reactor, period, lambda: None)
            now = self.server_counts()["transactions"]
            quiet = now - last <= _own_transactions(self.with_statements) + 1
            last = now
            if quiet:
                return

    @defer_inline
    def freeze(self, nodes):
        """Stop ticking, let claims in flight end and close the pool, so the server has counted everything so far.

        A backend reports its statistics at most once a second and holds them up to 10 s when idle, but always at
        exit: with the pool closed, a snapshot of pg_stat_database is exact. Ticks resume (new connections) after.
        """
        from twisted.internet import reactor, task

        for node in nodes:
            node.pause()
        deadline = time.monotonic() + 10.0
        while any(node.busy() for node in nodes) and time.monotonic() < deadline:
            yield task.deferLater(reactor, 0.02, lambda: None)
        self.engine.dispose()
        yield task.deferLater(reactor, 0.2, lambda: None)  # the backends exit and report
        return {"time": time.monotonic(), "ticks": sum(node.ticks for node in nodes),
                "client": self.counter.snapshot(), "server": self.server_counts()}

    def resume(self, nodes) -> None:
        for node in nodes:  # phases spread over one interval, as nodes started at different times
            node.start(self.random.uniform(0, self.sizes.interval))

    @defer_inline
    def measure(self, kind: str, nodes_count: int, projects: int):
        sizes = self.sizes
        built = time.monotonic()
        nodes = [Node(self.build(kind, index, projects), sizes.interval) for index in range(nodes_count)]
        build_seconds = time.monotonic() - built
        self.resume(nodes)
        # Warm-up: PostgresPoller.next() asks for a claim per slot at once, the listeners connect.
        yield self.wait_ticks(nodes, sizes.warmup_ticks, sizes.interval * sizes.warmup_ticks, None)
        yield self.wait_listening(nodes)
        first = yield self.freeze(nodes)
        self.resume(nodes)
        started = time.monotonic()
        yield self.wait_ticks(nodes, sizes.window_ticks, sizes.interval * sizes.window_ticks,
                              started + sizes.max_window_seconds)
        ticking_seconds = time.monotonic() - started
        last = yield self.freeze(nodes)
        for node in nodes:
            node.stop()
        errors = [repr(node.error) for node in nodes if node.error is not None]
        return _result(kind, nodes_count, projects, sizes, first, last, ticking_seconds, build_seconds, errors)

    @defer_inline
    def wait_listening(self, nodes, timeout: float = 60.0):
        from twisted.internet import reactor, task

        deadline = time.monotonic() + timeout
        while not all(node.listening() for node in nodes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"idle: listeners not connected after {timeout:g} s")
            yield task.deferLater(reactor, 0.05, lambda: None)

    @defer_inline
    def wait_ticks(self, nodes, ticks_per_node: int, seconds: float, deadline):
        """Until ``seconds`` have passed and the nodes ticked ``ticks_per_node`` times each on average."""
        from twisted.internet import reactor, task

        started = time.monotonic()
        since = sum(node.ticks for node in nodes)
        while True:
            yield task.deferLater(reactor, min(self.sizes.interval / 4, 0.1), lambda: None)
            ticks = sum(node.ticks for node in nodes) - since
            now = time.monotonic()
            if now - started >= seconds and ticks >= ticks_per_node * len(nodes):
                return
            if deadline is not None and now >= deadline:
                return


def _result(kind, nodes, projects, sizes, first, last, seconds, build_seconds, errors) -> dict:
    ticks = last["ticks"] - first["ticks"]
    client = {key: last["client"].get(key, 0) - first["client"].get(key, 0)
              for key in set(first["client"]) | set(last["client"])}
    statements = sum(client.get(key, 0) for key in STATEMENT_KINDS)
    connects = client.get("connect", 0)
    server = {key: last["server"][key] - first["server"][key] for key in last["server"]}
    server["transactions"] -= _own_transactions("statements" in server)
    if "statements" in server:
        server["statements"] -= _own_statements(True)
    # Connections opened in the window are the simulation's (the pool is closed at each boundary): not a node's.
    transactions = server["transactions"] - connects
    server_statements = server.get("statements")

    def per_tick(value):
        return value / ticks if ticks and value is not None else None

    def at_default(value):
        return None if value is None else value * nodes / DEFAULT_POLL_INTERVAL

    expected_ticks = nodes * seconds / sizes.interval
    return {
        "poller": kind,
        "nodes": nodes,
        "projects": projects,
        "window_seconds": seconds,
        "ticks": ticks,
        "ticks_on_time": ticks / expected_ticks if expected_ticks else math.nan,
        "client": client,
        "client_statements": statements,
        "server": server,
        # Transactions the client side accounts for: one per statement (each count() and claim is one autocommit
        # transaction); what the server counted beyond is someone else's (autovacuum, ...).
        "transactions_unexplained": transactions - statements,
        "statements_per_tick": per_tick(statements),  # per node
        "transactions_per_tick": per_tick(transactions),
        "server_statements_per_tick": per_tick(server_statements),
        # All K nodes together at Scrapyd's default 5 s interval.
        "statements_per_second_at_default": at_default(per_tick(statements)),
        "transactions_per_second_at_default": at_default(per_tick(transactions)),
        "server_statements_per_second_at_default": at_default(per_tick(server_statements)),
        # What the simulation achieved at its own interval (lower than K x per tick / interval when it fell behind).
        "statements_per_second_simulated": statements / seconds if seconds else math.nan,
        "build_seconds": build_seconds,
        "errors": errors,
    }


def _describe(result: dict) -> str:
    return (f"{result['poller']:7} K={result['nodes']:<3} P={result['projects']:<3}: "
            f"{result['statements_per_tick']:.2f} statements/tick/node, "
            f"{result['transactions_per_tick']:.2f} transactions/tick/node "
            f"({result['transactions_unexplained']:+d} unexplained), "
            f"{result['statements_per_second_at_default']:.1f}/s at 5 s "
            f"({result['ticks']} ticks in {result['window_seconds']:.1f} s, {result['ticks_on_time']:.0%} on time)")


# --- figures -----------------------------------------------------------------------------------------------------


def _point(series: dict, kind: str, nodes: int, projects: int) -> dict | None:
    for point in series[kind]["points"]:
        if point["nodes"] == nodes and point["projects"] == projects:
            return point
    return None


def _growth_name(kind: str, nodes: int, sizes: Sizes) -> str:
    return f"{kind} K={nodes}: statements/s P={max(sizes.projects)} / P={min(sizes.projects)}"


def _ratios(series: dict, sizes: Sizes) -> dict:
    low, high = min(sizes.projects), max(sizes.projects)
    ratios = {}
    for kind in SERIES:
        for nodes in sizes.nodes:
            ratios[_growth_name(kind, nodes, sizes)] = ratio(
                _point(series, kind, nodes, high)["statements_per_tick"],
                _point(series, kind, nodes, low)["statements_per_tick"])
    for kind in SERIES:
        nodes = max(sizes.nodes)
        ratios[f"{kind} K={nodes}: server transactions/s P={high} / P={low}"] = ratio(
            _point(series, kind, nodes, high)["transactions_per_tick"],
            _point(series, kind, nodes, low)["transactions_per_tick"])
    for nodes in sizes.nodes:
        for projects in sizes.projects:
            ratios[f"stock / pgqueue statements/s, K={nodes} P={projects}"] = ratio(
                _point(series, "stock", nodes, projects)["statements_per_tick"],
                _point(series, "pgqueue", nodes, projects)["statements_per_tick"])
    return ratios


def _notes(series: dict, sizes: Sizes, statements_source: str | None) -> list[str]:
    notes = [
        "Scrapyd's QueuePoller calls count() for every project on every tick, on every node: its "
        "idle load grows with nodes x projects; PostgresPoller sends one claim per tick whatever the projects",
        f"simulated at a {sizes.interval:g} s interval; per-second figures are per tick x K / "
        f"{DEFAULT_POLL_INTERVAL:g} s (Scrapyd's default interval), per tick figures are per node",
        f"listen_notify {LISTEN_NOTIFY} for the measure: with it on (as nodes run), each pgqueue node adds one LISTEN "
        "connection, which sends LISTEN once at connect and nothing while idle; with it on, the server would count "
        "that LISTEN transaction late, inside the window",
        "stmt = client-side count (SQLAlchemy before_cursor_execute on the package's engine): the SQL the pollers "
        "send, one count() or one claim each, each in autocommit with the package's SET LOCAL timeouts in the same "
        "query string (one round trip, one transaction). Nothing else goes to the server: no BEGIN/COMMIT, and no "
        "ping (a pooled connection is checked by looking at its socket, scrapyd_pgqueue.store.db)",
        "xact = pg_stat_database xact_commit + xact_rollback deltas of the bench database, exact: ticking stops and "
        "the pool is closed at both ends of the window, so every backend has reported; the bench's own reads and "
        "the connections the simulation opens are subtracted. 'xact unexplained' = xact - stmt: what the "
        "client side does not account for (autovacuum, ...)",
    ]
    if statements_source is None:
        notes.append("pg_stat_statements is not in shared_preload_libraries of this server: no server-side "
                     "statement count; each count() or claim is one query string on the wire (the SET LOCAL prefix and the "
                     "statement), one autocommit transaction")
    else:
        notes.append("server stmt = pg_stat_statements calls in the bench database (each query string counts "
                     "three: the two SET LOCAL of the prefix and the statement), the bench's own reads subtracted")
    behind = [p for kind in SERIES for p in series[kind]["points"] if p["ticks_on_time"] < 0.9]
    if behind:
        worst = min(behind, key=lambda p: p["ticks_on_time"])
        notes.append(
            f"the simulation fell behind its interval in {len(behind)} cell(s) (worst: {worst['poller']} K="
            f"{worst['nodes']} P={worst['projects']}, {worst['ticks_on_time']:.0%} of ticks on time): the stock "
            "poller's synchronous count() blocks the reactor; per-tick figures are unaffected")
    errors = [p for kind in SERIES for p in series[kind]["points"] if p["errors"]]
    for point in errors:
        notes.append(f"{point['poller']} K={point['nodes']} P={point['projects']}: poll loops stopped: "
                     f"{point['errors'][:2]}")
    return notes


# --- output ----------------------------------------------------------------------------------------------------


def format_table(result: dict) -> str:
    parameters, series = result["parameters"], result["series"]
    with_statements = any(point["server_statements_per_tick"] is not None
                          for kind in SERIES for point in series[kind]["points"])
    rows = []
    for nodes in parameters["nodes"]:
        for projects in parameters["projects"]:
            for kind in SERIES:
                point = _point(series, kind, nodes, projects)
                row = [f"K={nodes} P={projects}", kind,
                       report.number(point["statements_per_tick"], 2),
                       report.number(point["transactions_per_tick"], 2),
                       report.number(point["statements_per_second_at_default"], 1),
                       report.number(point["transactions_per_second_at_default"], 1)]
                if with_statements:
                    row.append(report.number(point["server_statements_per_second_at_default"], 1))
                row += [report.number(point["statements_per_second_simulated"], 0),
                        f"{point['ticks']:,} / {point['window_seconds']:.1f} s ({point['ticks_on_time']:.0%})",
                        f"{point['transactions_unexplained']:+d}"]
                rows.append(row)
    headers = ["nodes x projects", "poller", "stmt/tick", "xact/tick", "stmt/s @5s", "xact/s @5s"]
    if with_statements:
        headers.append("server stmt/s @5s")
    headers += [f"stmt/s @{parameters['simulated_poll_interval']:g}s sim", "ticks / window (on time)",
                "xact unexplained"]
    lines = [
        report.heading("Idle load"),
        f"K simulated idle nodes with P projects, empty queue: real poller objects ({parameters['max_proc']} free "
        f"slots each, listen_notify {parameters['listen_notify']}) ticking every "
        f"{parameters['simulated_poll_interval']:g} s "
        f"in one process. stmt = statements the pollers send (client-side, SQLAlchemy); xact = transactions the server "
        f"counted (pg_stat_database). Per tick = per node; @5s = all K nodes at Scrapyd's default "
        f"{parameters['reported_at_poll_interval']:g} s interval; sim = achieved by the simulation",
        report.format_rows(headers, rows),
        "",
    ]
    return report.table_text(result, lines, ratios="ratio (statements per tick)")


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    parameters, series = result["parameters"], result["series"]
    figure, axes = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = {"pgqueue": dict(linestyle="-", marker="o", markersize=10, markerfacecolor="none"),
              "stock": dict(linestyle="--", marker="s", markersize=5)}
    for kind in SERIES:
        for number, projects in enumerate(parameters["projects"]):
            points = [_point(series, kind, nodes, projects) for nodes in parameters["nodes"]]
            axes.plot(parameters["nodes"], [p["statements_per_second_at_default"] for p in points],
                      color=colours[number % len(colours)], label=f"{kind} (PostgresPoller)" if kind == "pgqueue"
                      else f"{kind} (QueuePoller)", **styles[kind])
            axes.lines[-1].set_label(f"{axes.lines[-1].get_label()}, P={projects}")
    report.log_axes(axes, parameters["nodes"], [str(nodes) for nodes in parameters["nodes"]])
    interval = parameters["reported_at_poll_interval"]
    report.finish_axes(axes, title="Idle load on Postgres (client-side statements; pgqueue lines coincide for every P)",
                       xlabel="idle nodes (K)", ylabel=f"statements/s, all nodes, at poll_interval {interval:g} s",
                       grid="both")
    return [report.save_figure(plt, figure, directory / "idle_statements.png")]
