"""The child process: K simulated nodes under one Twisted reactor, measured cell by cell."""

from __future__ import annotations

import contextlib
import math
import random
import time
import traceback
from pathlib import Path

from bench import database
from bench.suites.idle.nodes import Counter, Node
from bench.suites.idle.settings import (
    DEFAULT_POLL_INTERVAL,
    LISTEN_NOTIFY,
    MAX_PROC,
    POLLERS,
    RANDOM_SEED,
    SERIES,
    SPIDERQUEUE,
    Sizes,
)


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


STATEMENT_KINDS = ("count", "claim", "other")  # what counts as a statement the pollers send
# Each snapshot reads the server's counters on a new connection, closed at once, so that it reports at exit. In a
# window: the first snapshot's connection start and its reads (one transaction per counter read; the last
# snapshot's own connection start is not reported yet when it reads, as measured); for pg_stat_statements, the
# first snapshot's reads.
def _own_transactions(with_statements: bool) -> int:
    return 1 + _own_statements(with_statements)


def _own_statements(with_statements: bool) -> int:
    return 2 if with_statements else 1


class Simulation:
    def __init__(self, url: str, sizes: Sizes, with_statements: bool, workdir: Path, log):
        from scrapyd_pgqueue.database import db

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
