"""A simulated node (a real poller ticking on a LoopingCall) and the Counter of what the pollers' engine sends."""

from __future__ import annotations

import threading

from bench.suites.idle.settings import LISTEN_NOTIFY, MAX_PROC


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
