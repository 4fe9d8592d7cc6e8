"""The feeder: ``schedule.json`` at a steady rate to random nodes in rotation, and the cancels it planned.

Calls go out at fixed instants (t0 + i / rate) from a pool of threads, so one slow answer does not hold the next
calls back and hide them (coordinated omission): every call is timed from its own send.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import http.client
import random
import threading
import time
import urllib.error

PROJECT, SPIDER = "example", "sleeper"
# Shares of the jobs by kind (the rest are plain short crawls). Delayed ones wait DELAY seconds (a few seconds
# ahead, as in the issue); "cancel_pending" ones are cancelled while they wait, so they must never run; unique ones
# share a few keys and wait a little, so that some find a waiting job with their key (answer "existing").
MIX = (("cancel_pending", 0.08), ("delayed", 0.15), ("unique", 0.10), ("cancel_running", 0.08))
DELAY = (2.0, 8.0)
UNIQUE_KEYS = 6
PLAIN_SECONDS = (0.2, 1.5)  # the sleeper's sleep: short crawls
CANCEL_RUNNING_SECONDS = 5.0  # long enough to be running when its cancel comes
CANCEL_AFTER = (0.1, 2.5)  # from the schedule's answer; early ones reach a crawl still starting (issue 47's (2))
THREADS = 16


class Feeder:
    def __init__(self, nodes, rate: float, seed: int, log):
        self.nodes = {node.name: node for node in nodes}
        self.rate, self.log = rate, log
        self.random = random.Random(seed)
        self.up = set(self.nodes)
        self.in_flight = dict.fromkeys(self.nodes, 0)
        self.lock = threading.Condition()
        self.calls: list[dict] = []  # every schedule.json and cancel.json, timed
        self.jobs: dict[str, dict] = {}  # job id -> its plan and what the node answered
        self.cancels: list[tuple[float, str]] = []  # heap of (when, job)
        self.pool = concurrent.futures.ThreadPoolExecutor(THREADS, thread_name_prefix="soak-feeder")

    # --- the rotation, for the chaos --------------------------------------------------------------------------

    def take_out(self, name: str) -> None:
        with self.lock:
            self.up.discard(name)

    def put_back(self, name: str) -> None:
        with self.lock:
            self.up.add(name)

    def wait_idle(self, name: str, timeout: float) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.in_flight[name] == 0, timeout)

    # --- the feed ---------------------------------------------------------------------------------------------

    def feed(self, seconds: float) -> None:
        """Schedule for ``seconds``, then wait for the planned cancels and every call's answer."""
        started = time.monotonic()
        futures, schedules, index = [], [], 0
        while True:
            due = started + index / self.rate
            if due >= started + seconds:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            self._cancels_due(futures, time.monotonic())
            schedules.append(self.pool.submit(self._schedule, index))
            index += 1
        # The last cancels at their times; a schedule still answering may yet plan one.
        while True:
            self._cancels_due(futures, time.monotonic())
            with self.lock:
                waiting = bool(self.cancels)
            if not waiting and all(future.done() for future in schedules):
                break
            time.sleep(0.05)
        for future in schedules + futures:
            future.result()
        self.pool.shutdown()

    def _cancels_due(self, futures: list, until: float) -> None:
        with self.lock:
            due = []
            while self.cancels and self.cancels[0][0] <= until:
                due.append(heapq.heappop(self.cancels)[1])
        futures.extend(self.pool.submit(self._cancel, job) for job in due)

    def _plan(self, index: int) -> dict:
        pick, kind = self.random.random(), "plain"
        for name, share in MIX:
            if pick < share:
                kind = name
                break
            pick -= share
        job = {"job": f"soak-{index:05}", "kind": kind, "params": {}}
        params = job["params"]
        params["seconds"] = f"{self.random.uniform(*PLAIN_SECONDS):.2f}"
        if kind in ("cancel_pending", "delayed", "unique"):
            params["_run_at"] = f"{time.time() + self.random.uniform(*DELAY):.3f}"
        if kind == "unique":
            params["_unique_key"] = f"key-{self.random.randrange(UNIQUE_KEYS)}"
        if kind == "cancel_running":
            params["seconds"] = f"{CANCEL_RUNNING_SECONDS:g}"
        if kind in ("cancel_pending", "cancel_running"):
            job["cancel_after"] = self.random.uniform(*CANCEL_AFTER)
        return job

    def _schedule(self, index: int) -> None:
        with self.lock:
            job = self._plan(index)  # under the lock: one random stream, the same plan for the same seed
            self.jobs[job["job"]] = job
        call = self._call("schedule.json", spider=SPIDER, jobid=job["job"], **job["params"])
        job["answer"] = call.get("answer")
        job["accepted"] = call["ok"]
        if call["ok"] and "cancel_after" in job:
            with self.lock:
                heapq.heappush(self.cancels, (time.monotonic() + job["cancel_after"], job["job"]))

    def _cancel(self, job: str) -> None:
        call = self._call("cancel.json", job=job)
        self.jobs[job]["cancel"] = {"ok": call["ok"], "prevstate": (call.get("answer") or {}).get("prevstate"),
                                    "at": call["sent"]}

    def _call(self, endpoint: str, **params) -> dict:
        with self.lock:
            name = self.random.choice(sorted(self.up)) if self.up else self.random.choice(sorted(self.nodes))
            self.in_flight[name] += 1
        node = self.nodes[name]
        call = {"endpoint": endpoint, "node": name, "job": params.get("jobid") or params.get("job"),
                "sent": time.time()}
        started = time.perf_counter()
        try:
            answer = node.post(endpoint, timeout=60, project=PROJECT, **params)
            call["ok"] = answer.get("status") == "ok"
            call["answer"] = answer
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            call["ok"] = False
            call["error"] = f"{type(e).__name__}: {e}"
        finally:
            call["seconds"] = time.perf_counter() - started
            with self.lock:
                self.in_flight[name] -= 1
                self.calls.append(call)
                self.lock.notify_all()
        if not call["ok"]:
            self.log(f"soak: {endpoint} on {name} failed: {call.get('error') or call.get('answer')}")
        return call
