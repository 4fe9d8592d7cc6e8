"""Series simulated, a simulation process (spawned): simulated nodes sending a node's store calls, timed."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import heapq
import itertools
import math
import os
import random
import threading
import time
import traceback
import uuid

from bench.suites.scale.settings import PROJECT, SLOW_MS
from bench.suites.scale.slots import SlotReader, SlotSession


def simulate(index: int, url: str, parameters: dict, commands, results) -> None:
    """A simulation process's body (spawned): simulated nodes added on command, statistics per window."""
    simulation = None
    try:
        simulation = Simulation(url, parameters)
        results.put(("ready", index, None))
        while True:
            command, payload = commands.get()
            if command == "add":
                results.put(("added", index, simulation.add(payload)))
            elif command == "start":
                # What happened since the last window (adding nodes: connects, registrations) is kept, not lost.
                between = simulation.stats.take(len(simulation.nodes), parameters["poll_interval"],
                                                parameters["heartbeat_interval"])
                simulation.stats.reset()
                results.put(("started", index, {key: between[key] for key in ("errors", "error_samples", "slow")}))
            elif command == "end":
                results.put(("stats", index, simulation.stats.take(
                    len(simulation.nodes), parameters["poll_interval"], parameters["heartbeat_interval"])))
            elif command == "stop":
                break
    except BaseException:  # noqa: BLE001 - reported to the bench, which raises it
        results.put(("error", index, traceback.format_exc()))
    finally:
        if simulation is not None:
            simulation.stop()
        # No interpreter teardown of hundreds of engines and threads; the queue's feeder thread is flushed first.
        results.close()
        results.join_thread()
        os._exit(0)


class Stats:
    """What the simulated nodes of one process did since the last reset (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.since = time.monotonic()
            self.operations = collections.Counter()
            self.claim_ms, self.heartbeat_ms, self.tick_late_ms = [], [], []
            self.claims_with_jobs = self.jobs_claimed = self.jobs_finished = 0
            self.heard = 0  # notifications read by listen slot holders (series with listen slots)
            self.errors = collections.Counter()
            self.error_samples = []
            self.slow = collections.Counter()

    def error(self, kind: str, error: BaseException) -> None:
        with self.lock:
            self.errors[type(error).__name__] += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{kind}: {type(error).__name__}: {error}"[:300])

    def take(self, nodes: int, poll_interval: float, heartbeat_interval: float) -> dict:
        with self.lock:
            seconds = time.monotonic() - self.since
            return {
                "nodes": nodes, "seconds": seconds, "due_ticks": nodes * seconds / poll_interval,
                "due_beats": nodes * seconds / heartbeat_interval,
                "operations": dict(self.operations), "claim_ms": list(self.claim_ms),
                "heartbeat_ms": list(self.heartbeat_ms), "tick_late_ms": list(self.tick_late_ms),
                "claims_with_jobs": self.claims_with_jobs, "jobs_claimed": self.jobs_claimed,
                "jobs_finished": self.jobs_finished, "heard": self.heard, "errors": dict(self.errors),
                "slow": dict(self.slow),
                "error_samples": list(self.error_samples),
            }


class Timer:
    """A heap of due calls, run on a thread pool: ``call(due)`` at monotonic time ``due``."""

    def __init__(self, threads: int, stats: Stats):
        self.heap: list = []
        self.condition = threading.Condition()
        self.sequence = itertools.count()
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sim")
        self.stats = stats
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="sim-timer", daemon=True)
        self.thread.start()

    def at(self, due: float, call) -> None:
        with self.condition:
            heapq.heappush(self.heap, (due, next(self.sequence), call))
            self.condition.notify()

    def soon(self, call) -> None:
        self.at(time.monotonic(), call)

    def run(self) -> None:
        while True:
            with self.condition:
                while not self.stopping:
                    now = time.monotonic()
                    if self.heap and self.heap[0][0] <= now:
                        break
                    self.condition.wait(self.heap[0][0] - now if self.heap else None)
                if self.stopping:
                    return
                due, _, call = heapq.heappop(self.heap)
            self.pool.submit(self._call, call, due)

    def _call(self, call, due: float) -> None:
        try:
            call(due)
        except Exception as e:  # noqa: BLE001 - a bug of the simulation must show, not stop its node
            self.stats.error("simulation", e)

    def stop(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify()
        self.pool.shutdown(wait=False, cancel_futures=True)


class Simulation:
    def __init__(self, url: str, parameters: dict):
        self.url = url
        self.parameters = parameters
        self.stats = Stats()
        self.timer = Timer(parameters["threads"], self.stats)
        self.nodes: list[SimNode] = []
        self.random = random.Random()
        self.reader = SlotReader(self.stats) if parameters.get("listen_slots") else None

    def add(self, numbers: list[int]) -> int:
        for number in numbers:
            node = SimNode(number, self)
            self.nodes.append(node)
            node.start(self.random)
        return len(numbers)

    def stop(self) -> None:
        self.timer.stop()
        if self.reader is not None:
            self.reader.stop()
        for node in self.nodes:
            node.stopping = True
            with contextlib.suppress(Exception):
                node.engine.dispose()
            if node.session is not None:
                node.session.close()


class SimNode:
    """One simulated Scrapyd node: its own engine and worker id, the launcher's and the poller's statements."""

    def __init__(self, number: int, simulation: Simulation):
        from scrapyd_pgqueue.database import db
        from scrapyd_pgqueue.store import JobStore

        parameters = simulation.parameters
        self.simulation, self.timer, self.stats = simulation, simulation.timer, simulation.stats
        self.name = f"sim-{number}"
        self.worker = uuid.uuid4().hex
        self.engine = db.get_engine(f"{simulation.url}?application_name={self.name}",
                                    pool_size=parameters["pool_size"], migrate_schema=False,
                                    application_name=db.application_name(self.name))
        self.store = JobStore(self.engine)
        self.poll_interval = parameters["poll_interval"]
        self.heartbeat_interval = parameters["heartbeat_interval"]
        self.lease_seconds = parameters["lease_seconds"]
        self.max_attempts = parameters["max_attempts"]
        self.max_proc = parameters["max_proc"]
        self.hold_seconds = parameters["hold_seconds"]
        self.finished_to_keep = parameters["finished_to_keep"]
        self.lock = threading.Lock()
        self.running: dict[int, tuple] = {}  # job row id -> (claim, start time)
        self.claiming = False
        self.claim_again = False
        self.healthy_since = None
        self.stopping = False
        self.wants_work = None  # as last said (scrapyd_node.wants_work); None: unsaid
        # listen_url: a session straight to Postgres that takes a listen slot while the node wants work
        self.session = None
        if parameters.get("listen_slots"):
            self.session = SlotSession(self, parameters["direct_url"], parameters["listen_slots"],
                                       parameters["slot_retry"], simulation.reader)
        # A busy node's pool ends up holding all its connections (claims, heartbeats, web requests and finishes
        # overlap now and then, and nothing closes an idle pooled connection): open them all now.
        connections = []
        try:
            for _ in range(parameters["pool_size"]):
                connections.append(self.engine.connect())
        except Exception as e:  # noqa: BLE001 - counted; the pool opens what it needs later
            self.stats.error("connect", e)
        finally:
            for connection in connections:
                connection.close()
        if self._timed("register_node", self.store.register_node, worker=self.worker, name=self.name, url=None,
                       max_proc=self.max_proc, ok=True) is not None:
            self.healthy_since = time.monotonic()

    def start(self, chooser: random.Random) -> None:
        now = time.monotonic()
        self.timer.at(now + chooser.uniform(0, self.poll_interval), self.tick)
        self.timer.at(now + chooser.uniform(0, self.heartbeat_interval), self.beat)

    @staticmethod
    def _next(due: float, interval: float) -> float:
        """The next time on this action's grid after now: intervals missed while late are skipped, as Twisted's
        LoopingCall does (and the lease thread, which waits for what is left of its interval)."""
        late = time.monotonic() - due
        return due + interval * (max(0, math.floor(late / interval)) + 1)

    def _timed(self, kind: str, call, *args, ok=None, **kwargs):
        """``call(...)``, counted and timed; an exception is counted by type and gives None (or ``ok`` is
        returned on success instead of the call's result, for calls that return None)."""
        started = time.perf_counter()
        try:
            result = call(*args, **kwargs)
            return result if ok is None else ok
        except Exception as e:  # noqa: BLE001 - DatabaseError and anything else, counted by type
            self.stats.error(kind, e)
            return None
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            with self.stats.lock:
                self.stats.operations[kind] += 1
                if kind == "claim_next_jobs":
                    self.stats.claim_ms.append(elapsed)
                elif kind == "heartbeat":
                    self.stats.heartbeat_ms.append(elapsed)
                if elapsed >= SLOW_MS:
                    self.stats.slow[kind] += 1

    # LeaseKeeper: the node's tick every heartbeat_interval (bounded by it), recovery once healthy for a lease.
    def beat(self, due: float) -> None:
        from scrapyd_pgqueue.database import db

        if self.stopping:
            return
        self.timer.at(self._next(due, self.heartbeat_interval), self.beat)
        healthy = self.healthy_since is not None
        with self.lock:
            known = list(self.running)
        with db.deadline(self.heartbeat_interval):
            tick = self._timed(
                "heartbeat", self.store.node_tick, worker=self.worker, lease_seconds=self.lease_seconds,
                max_attempts=self.max_attempts, known_ids=known, release=healthy,
                recover=healthy and time.monotonic() - self.healthy_since >= self.lease_seconds,
                claimed_before=datetime.datetime.now() - datetime.timedelta(seconds=60),
                prompt_seconds=2 * self.heartbeat_interval,
            )
            if tick is None:
                self.healthy_since = None
                return
            if not tick.registered:
                self._timed("register_node", self.store.register_node, worker=self.worker, name=self.name,
                            url=None, max_proc=self.max_proc)
            if self.healthy_since is None:
                self.healthy_since = time.monotonic()

    # The poller's TimerService: a tick every poll_interval, fixed rate.
    def tick(self, due: float) -> None:
        if self.stopping:
            return
        self.timer.at(self._next(due, self.poll_interval), self.tick)
        with self.stats.lock:
            self.stats.tick_late_ms.append((time.monotonic() - due) * 1000)
        self.poll()

    def poll(self) -> None:
        """PostgresPoller.poll: one claim for the free slots; a poll during a claim runs one more after it."""
        with self.lock:
            free = self.max_proc - len(self.running)
            if free <= 0:
                return
            if self.claiming:
                self.claim_again = True
                return
            self.claiming = True
        result = None
        try:
            result = self._timed("claim_next_jobs", self.store.claim_next_jobs, [PROJECT], free, node=self.name,
                                 worker=self.worker)
            claimed = result.jobs if result else []
            now = datetime.datetime.now()
            with self.lock:
                for claim in claimed:
                    self.running[claim.id] = (claim, now)
            if claimed:
                with self.stats.lock:
                    self.stats.claims_with_jobs += 1
                    self.stats.jobs_claimed += len(claimed)
            for claim in claimed:
                self._timed("mark_started", self.store.mark_started, claim, worker=self.worker, pid=os.getpid(),
                            start_time=now)
                self.timer.at(time.monotonic() + self.hold_seconds, lambda due, claim=claim: self.finish(claim))
        finally:
            with self.lock:
                self.claiming = False
                again, self.claim_again = self.claim_again, False
        if again:
            self.timer.soon(lambda due: self.poll())
        elif result is not None:
            self.say_whether_wanting()

    def say_whether_wanting(self) -> None:
        """PostgresPoller.say_whether_wanting: a node wants work while it has a free slot and hears NOTIFY (poll-only
        nodes never: they say so once, at their first claim); its listener holds a listen slot only meanwhile; a
        node that starts wanting claims once more after saying so."""
        with self.lock:
            wants = self.session is not None and self.max_proc - len(self.running) > 0
        if self.session is not None:
            self.session.want(wants)
        if wants == self.wants_work:
            return
        self.wants_work = wants
        if self._timed("set_wants_work", self.store.set_wants_work, self.worker, wants, ok=True) is None:
            self.wants_work = None  # said again after the next claim
        elif wants:
            self.timer.soon(lambda due: self.poll())

    # PostgresJobStorage.add, then the slot asks for its next job at once (the poller's next()).
    def finish(self, claim) -> None:
        with self.lock:
            _, started = self.running[claim.id]
        self._timed("finish_job", self.store.finish_job, project=claim.project, spider=claim.message.get("name"),
                    job=claim.job, start_time=started, end_time=datetime.datetime.now(), outcome="finished",
                    exit_code=0, pid=os.getpid(), node=self.name, claimed=claim, worker=self.worker)
        self._timed("prune_terminated", self.store.prune_terminated, self.finished_to_keep)
        with self.lock:
            del self.running[claim.id]
        with self.stats.lock:
            self.stats.jobs_finished += 1
        if not self.stopping:
            self.poll()
