"""Idle nodes' sessions, simulated: ``count`` real connections straight to Postgres, opened and read by one process.

Two designs:

- ``slots`` (the product now, ``scrapyd_pgqueue.store.listen_slots``): the first sessions take a free listen slot with
  the product's ``TAKE_LISTEN_SLOT`` and LISTEN on every channel, at most ``holders`` of them (``listen_slots - 1``:
  the real node, or the wanting node's stand-in, holds one more); every other session stays connected without
  LISTEN and runs ``TAKE_LISTEN_SLOT`` every ``retry`` seconds (a node that wants work and holds no slot tries once
  per ``poll_interval``), its first try at connection, the next ones spread evenly over the period. A try that wins a slot (one fell free)
  makes its session a holder, as it would a node: counted, since the suite keeps every slot held;
- ``listen`` (the design before, the reference): every session LISTENs on every channel.

``stand_in``: one more session first, the node that wants work in the ``wanting`` mode (a registered row that never
claims; its listener would hold a slot and LISTEN): it takes its slot (``slots``) and LISTENs. Every session reads
what it receives (one ``epoll`` loop, as idle nodes' listener threads would); the counts are shared with the bench.
"""

from __future__ import annotations

import heapq
import multiprocessing
import time
from dataclasses import dataclass

# The product's channels, each LISTENed on by a listening session as a node's listener does.
CHANNELS = ("scrapyd_pgqueue_jobs", "scrapyd_pgqueue_cancel", "scrapyd_pgqueue_projects", "scrapyd_pgqueue_periodic",
            "scrapyd_pgqueue_trees")
# The shared counters, an index each.
COUNTERS = ("heard_by_holders", "heard_by_pollers", "heard_by_stand_in", "holders", "pollers", "tries", "try_ns",
            "won_by_pollers", "stand_in_slot")
HEARD_BY = {"holder": "heard_by_holders", "poller": "heard_by_pollers", "stand_in": "heard_by_stand_in"}
CONNECT_DEADLINE = 300.0


@dataclass(frozen=True)
class Plan:
    count: int  # idle nodes' sessions
    design: str  # "slots" or "listen"
    slots: int  # listen_slots
    holders: int  # at most this many of the sessions take a slot (slots design)
    retry: float  # seconds between two tries of a session without a slot
    stand_in: bool = False

    def label(self) -> str:
        return f"{self.count:,} {'(listen slots)' if self.design == 'slots' else '(every session listens)'}"


class Sessions:
    """The sessions of ``plan`` (started and ended by ``with``); ``counts()``: the shared counters now."""

    def __init__(self, url: str, plan: Plan, log):
        self.url, self.plan, self.log = url, plan, log
        context = multiprocessing.get_context("spawn")
        self.counters = context.Array("q", len(COUNTERS))
        self.ready, self.stopping = context.Event(), context.Event()
        self.process = context.Process(target=_serve, args=(url, plan, self.counters, self.ready, self.stopping),
                                       daemon=True)
        self.active = plan.count > 0 or plan.stand_in

    def __enter__(self) -> Sessions:
        if self.active:
            started = time.monotonic()
            self.process.start()
            if not self.ready.wait(CONNECT_DEADLINE):
                raise RuntimeError(f"notify: {self.plan.label()} sessions not connected within {CONNECT_DEADLINE:g} s")
            counts = self.counts()
            what = (f"{counts['holders']} hold a slot and listen, {counts['pollers']} try for one"
                    if self.plan.design == "slots" else f"{counts['holders']} listen")
            self.log(f"notify: {self.plan.label()} sessions{' and the stand-in' if self.plan.stand_in else ''} "
                     f"in {time.monotonic() - started:.1f} s: {what}")
        return self

    def __exit__(self, *exc) -> None:
        if self.active:
            self.stopping.set()
            self.process.join(60)

    def counts(self) -> dict[str, int]:
        with self.counters.get_lock():
            return dict(zip(COUNTERS, self.counters[:], strict=True))

    def listening(self) -> int:
        """Sessions that LISTEN now (the stand-in apart)."""
        return self.plan.count if self.plan.design == "listen" else self.counts()["holders"]


def _serve(url: str, plan: Plan, counters, ready, stopping) -> None:
    """The sessions' process: connect, take slots and LISTEN, then read and try until told to stop."""
    import selectors

    import psycopg2

    from scrapyd_pgqueue.store.listen_slots import LISTEN_SLOT_LOCKS, TAKE_LISTEN_SLOT

    take = TAKE_LISTEN_SLOT.driver_text
    parameters = {"slots": plan.slots, "locks": LISTEN_SLOT_LOCKS}

    def add(name: str, value: int = 1) -> None:
        with counters.get_lock():
            counters[COUNTERS.index(name)] += value

    def connect(name: str):
        connection = psycopg2.connect(url, application_name=name)
        connection.autocommit = True
        return connection

    def take_slot(connection) -> int | None:
        with connection.cursor() as cursor:
            cursor.execute(take, parameters)
            row = cursor.fetchone()
        return None if row is None else row[0]

    def listen(connection) -> None:
        with connection.cursor() as cursor:
            cursor.execute("; ".join(f"LISTEN {channel}" for channel in CHANNELS))

    selector = selectors.DefaultSelector()  # epoll: a thousand descriptors
    roles: dict[object, str] = {}  # connection -> "holder", "poller", "stand_in"
    if plan.stand_in:
        stand_in = connect("bench-wanting-node")
        if plan.design == "slots":
            slot = take_slot(stand_in)
            add("stand_in_slot", -1 if slot is None else slot + 1)  # 0: none tried; -1: none free
        listen(stand_in)
        roles[stand_in] = "stand_in"
    pollers: list[tuple[float, int, object]] = []
    for index in range(plan.count):
        connection = connect("bench-idle-node")
        role = "holder"
        if plan.design == "slots":  # every session tries at once, as a node that starts wanting work does (and
            # so its backend's first statement, which fills its caches, falls before the measures)
            role = "poller" if take_slot(connection) is None else "holder"
            if role == "holder" and counters[COUNTERS.index("holders")] >= plan.holders:
                add("won_by_pollers")  # a slot beyond the holders was free: taken, as a node would
        if role == "holder":
            listen(connection)
            add("holders")
        else:
            pollers.append((0.0, index, connection))
        roles[connection] = role
    for connection in roles:
        selector.register(connection, selectors.EVENT_READ)
    start = time.monotonic()
    pollers = [(start + position * plan.retry / len(pollers), index, connection)
               for position, (_, index, connection) in enumerate(pollers)]
    heapq.heapify(pollers)
    add("pollers", len(pollers))
    ready.set()
    while not stopping.is_set():
        wait = 0.5 if not pollers else min(0.5, max(0.0, pollers[0][0] - time.monotonic()))
        for key, _ in selector.select(wait):
            connection = key.fileobj
            connection.poll()
            if connection.notifies:
                add(HEARD_BY[roles[connection]], len(connection.notifies))
                connection.notifies.clear()
        now = time.monotonic()
        while pollers and pollers[0][0] <= now:
            due, index, connection = heapq.heappop(pollers)
            began = time.perf_counter_ns()
            slot = take_slot(connection)
            add("try_ns", time.perf_counter_ns() - began)
            add("tries")
            if slot is None:
                heapq.heappush(pollers, (due + plan.retry, index, connection))
                continue
            add("won_by_pollers")  # a slot fell free: this session holds it and LISTENs, as a node would
            add("pollers", -1)
            add("holders")
            roles[connection] = "holder"
            listen(connection)
    for connection in roles:
        connection.close()
