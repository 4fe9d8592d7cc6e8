"""A pool of claimer processes (multiprocessing spawn) that start each timed run together.

The processes are spawned once and reused for every claim path and concurrency level: a spawned Python that
imports Scrapy, Scrapyd and SQLAlchemy costs about 0.8 s of CPU, and 64 of them per run would swamp 2 cores.
Each concurrency level ``n`` has its own barrier of ``n + 1`` parties (the first ``n`` workers and the
coordinator), so every claimer of a run builds its claimer and makes one warm-up claim, then all start at once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue
import time
from collections.abc import Iterable
from dataclasses import dataclass

from bench.claimers import ClaimRun, open_claimer

SPAWN_TIMEOUT = 600.0  # seconds for the whole pool to import and report ready
SETUP_TIMEOUT = 300.0  # seconds for every claimer of a run to connect and reach the start barrier


@dataclass(frozen=True)
class WorkerResult:
    """One worker's share of one run."""

    index: int
    claims: int
    empty: int  # claims that found no job: the backlog ran dry (the suite sizes it so this stays 0)
    errors: int
    first_error: str | None
    seconds: float  # from the start barrier to the end of its last claim


def serve(index: int, barriers: dict, commands, results) -> None:
    """A worker's main loop: one ``ClaimRun`` per command until told to stop (``None``)."""
    results.put(("ready", index))
    while (run := commands.get()) is not None:
        results.put(("result", _timed_run(index, run, barriers[run.level])))
    # Leave without the interpreter's teardown of Scrapy, Twisted and SQLAlchemy: across 64 workers it costs
    # seconds of CPU and measures nothing. The coordinator has every result before it says stop.
    os._exit(0)


def _timed_run(index: int, run: ClaimRun, barrier) -> WorkerResult:
    claimer, setup_error = None, None
    try:
        claimer = open_claimer(run, index)
        _claim_counting_errors(claimer)  # warm-up: connect, migrate, fill caches; not counted
    except Exception as e:  # noqa: BLE001 - reported with the result; the barrier must still be reached
        setup_error = f"setup: {e!r}"
    barrier.wait(SETUP_TIMEOUT)
    if setup_error is not None:
        return WorkerResult(index, 0, 0, 1, setup_error, 0.0)
    try:
        return _claim_until(index, claimer, run.seconds)
    finally:
        claimer.close()


def _claim_counting_errors(claimer) -> tuple[bool | None, str | None]:
    try:
        return claimer.claim(), None
    except Exception as e:  # noqa: BLE001 - e.g. sqlite "database is locked": counted, not fatal
        return None, repr(e)


def _claim_until(index: int, claimer, seconds: float) -> WorkerResult:
    claims = empty = errors = 0
    first_error = None
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        got, error = _claim_counting_errors(claimer)
        if error is not None:
            errors += 1
            first_error = first_error or error
        elif got:
            claims += 1
        else:
            empty += 1
    return WorkerResult(index, claims, empty, errors, first_error, time.perf_counter() - start)


class ClaimerPool:
    """``size`` spawned workers; ``run(run, level)`` makes the first ``level`` of them claim together."""

    def __init__(self, size: int, levels: Iterable[int]):
        context = multiprocessing.get_context("spawn")
        self.barriers = {level: context.Barrier(level + 1) for level in sorted(set(levels))}
        self.commands = [context.Queue() for _ in range(size)]
        self.results = context.Queue()
        self.processes = [
            context.Process(
                target=serve, args=(index, self.barriers, self.commands[index], self.results), daemon=True,
                name=f"bench-claimer-{index}",
            )
            for index in range(size)
        ]
        for process in self.processes:
            process.start()
        self._wait_ready(size)

    def _wait_ready(self, size: int) -> None:
        deadline = time.monotonic() + SPAWN_TIMEOUT
        ready = 0
        while ready < size:
            kind, _ = self.results.get(timeout=max(deadline - time.monotonic(), 0.1))
            ready += kind == "ready"

    def run(self, run: ClaimRun, level: int) -> list[WorkerResult]:
        for index in range(level):
            self.commands[index].put(dataclasses.replace(run, level=level))
        self.barriers[level].wait(SETUP_TIMEOUT)  # released when every claimer of this run is ready
        results = []
        while len(results) < level:
            try:
                kind, result = self.results.get(timeout=run.seconds + SETUP_TIMEOUT)
            except queue.Empty:
                raise RuntimeError(f"claimers of {run.kind} x{level} did not report within the timeout") from None
            if kind == "result":
                results.append(result)
        return results

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.terminate()  # our own child, by its handle
                process.join(5)
