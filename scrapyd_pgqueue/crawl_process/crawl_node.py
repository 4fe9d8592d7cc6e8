"""The crawl's side of its node's endpoint (``node/crawl_api.py``): what ``scrapyd_pgqueue.crawl`` sends, and how.

A crawl holds no database URL. Its node gives it the endpoint's address and a token of the crawl's own job in its
launch (``launch.py``, never the environment: its children would show it); the node also checks that the caller is
the crawl's own process. Each schedule is one ``POST /schedule`` over the node's Unix socket, answered in Scrapyd's
JSON form.
Only the standard library, imported at the first schedule: no SQLAlchemy, no driver, no reactor.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from typing import Any

# The crawl's job id, as the node's launcher gives it.
JOB_VARIABLE = "SCRAPY_JOB"
# The crawl's project, as Scrapyd names it (a warm process imports the project it names, ``warm_process.py``).
PROJECT_VARIABLE = "SCRAPY_PROJECT"
# The egg version the crawl runs, when its job was pinned to one (Scrapyd sets it): children run the same.
VERSION_VARIABLE = "SCRAPYD_EGG_VERSION"
# The endpoint's protocol, written here once: the node's half (``node/crawl_api.py``) imports it. The address is
# "unix:<path>" or "tcp:<host>:<port>"; the request is a POST to SCHEDULE_PATH with the token as a bearer token and
# {JOBS: [job, ...]}; the answer {JOBS: [{JOB: id, EXISTING: bool}, ...]}, or INDEX: the job refused.
UNIX, TCP = "unix", "tcp"
SCHEDULE_PATH = "/schedule"
# A frontier worker's step (``scrapyd_pgqueue.frontier``): {NEW: [{FINGERPRINT, PRIORITY, SLOT, REQUEST}, ...],
# DONE: [id, ...], FAILED: [[id, error], ...], LEASE: n, PER_SLOT: the crawl's cap per download slot, DELAY: seconds
# between two leases of a download slot (0: none)}, bytes as base64; the answer {STORED, DUPLICATES, LEASED: [{ID, REQUEST}, ...], OPEN: whether the crawl still has work}.
FRONTIER_PATH = "/frontier"
FRONTIER_SCHEDULER = "scrapyd_pgqueue.frontier.Scheduler"  # the SCHEDULER setting of a crawl's workers
NEW, DONE, FAILED, LEASE, PER_SLOT, DELAY = "new", "done", "failed", "lease", "per_slot", "delay"
FINGERPRINT, PRIORITY, SLOT, REQUEST, ID = "fingerprint", "priority", "slot", "request", "id"
STORED, DUPLICATES, LEASED, OPEN = "stored", "duplicates", "leased", "open"
BEARER = "Bearer"
JOBS, JOB, EXISTING, INDEX = "jobs", "job", "existing", "index"
# Seconds a request waits for its node; the node bounds its database work by its database_timeout.
NODE_TIMEOUT = 300.0


class NotInACrawlError(RuntimeError):
    """The parent job or the node is unknown, or the node knows no such crawl: not a crawl started by a node of the
    cluster (or one that has ended)."""


class NodeUnavailableError(RuntimeError):
    """The node or its database did not answer: nothing was stored, the same jobs may be sent again."""


@dataclasses.dataclass(frozen=True)
class Enqueued:
    """Where a scheduled job went: its job id, and whether the tree had its key already (no new job)."""

    job: str
    existing: bool


class Scheduler:
    """One crawl's way into the queue: its parent, and its node's address and token."""

    def __init__(self, address: str, token: str, parent: str):
        self.address, self.token, self.parent = address, token, parent
        self.version = os.environ.get(VERSION_VARIABLE) or None

    def schedule(self, follow_ups: list) -> list[str]:
        jobs = []
        for index, follow_up in enumerate(follow_ups):
            try:
                jobs.append(self.job(follow_up))
            except ValueError as e:
                raise ValueError(f"follow-up {index}: {e}" if len(follow_ups) > 1 else str(e)) from None
        try:
            return [job.job for job in self.enqueue(jobs)]
        except _RefusedAt as e:
            raise ValueError(f"follow-up {e.index}: {e}" if len(jobs) > 1 else str(e)) from None

    def job(self, follow_up) -> dict[str, Any]:
        """The job object the node checks by schedule_batch.json's rules; ValueError for what is plainly wrong."""
        if not isinstance(follow_up.spider, str) or not follow_up.spider:
            raise ValueError(f"the spider must be a non-empty string, not {follow_up.spider!r}")
        return self._job_object(follow_up)

    def enqueue(self, jobs: list[dict[str, Any]]) -> list[Enqueued]:
        """Store jobs through the node, all or none: where each went. ValueError when the node refuses them,
        ``NodeUnavailableError`` when it or its database did not answer."""
        if not jobs:
            return []
        status, answer = _ask_node(self.address, self.token, {JOBS: jobs})
        message = str(answer.get("message", answer))
        if status == 200 and answer.get("status") == "error":  # a body over the node's max_request_bytes
            raise ValueError(message)
        if status == 200:
            return [Enqueued(job[JOB], bool(job[EXISTING])) for job in answer[JOBS]]
        if status == 401:
            raise NotInACrawlError(f"cannot schedule follow-up jobs: the node refused: {message}")
        if status in (400, 403, 404):
            raise _RefusedAt(message, answer[INDEX]) if answer.get(INDEX) is not None else ValueError(message)
        raise NodeUnavailableError(f"the node did not store the jobs ({status}): {message}")

    def enqueue_each(self, jobs: list[dict[str, Any]]) -> tuple[list, Exception | None]:
        """Store jobs in their order, in one request unless the node refuses some: then in halves, down to each
        refused job alone, so that a refused job loses only itself. Each job's outcome (``Enqueued``, the ValueError
        that refused it, or None: not stored because the node or its database was away), and that error."""
        outcomes: list = [None] * len(jobs)
        spans = [(0, len(jobs))]  # still to store, in order
        while spans:
            start, end = spans.pop(0)
            try:
                outcomes[start:end] = self.enqueue(jobs[start:end])
            except ValueError as e:
                if end - start == 1:
                    outcomes[start] = ValueError(str(e))
                else:
                    middle = (start + end) // 2
                    spans[:0] = [(start, middle), (middle, end)]
            except NodeUnavailableError as e:
                return outcomes, e
        return outcomes, None

    def _job_object(self, follow_up) -> dict[str, Any]:
        job: dict[str, Any] = {
            "spider": follow_up.spider,
            "priority": follow_up.priority,
            "args": dict(follow_up.args or {}),
            "settings": dict(follow_up.settings or {}),
            "parent": self.parent,
        }
        version = follow_up.version or self.version
        optional = {
            # A job id named here, so that the log line of a refused follow-up names it.
            "version": version, "jobid": follow_up.jobid or uuid.uuid1().hex, "run_at": follow_up.run_at,
            "delay": follow_up.delay,
            "retries": follow_up.retries, "retry_delay": follow_up.retry_delay,
            "on_conflict": follow_up.on_conflict, "max_runtime": follow_up.max_runtime,
            "stall_timeout": follow_up.stall_timeout,
            "tags": list(follow_up.tags) if isinstance(follow_up.tags, (list, tuple)) else follow_up.tags,
        }
        job.update((name, value) for name, value in optional.items() if value is not None)
        if follow_up.unique_key is not None:
            job["unique_key"] = follow_up.unique_key
            job["unique_scope"] = follow_up.unique_scope
        return job


class _RefusedAt(ValueError):
    """The node refused the job at ``index`` of a request by its own checks."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def _ask_node(address: str, token: str, body: dict, path: str = SCHEDULE_PATH) -> tuple[int, dict]:
    """POST ``body`` to the node's ``path``: its status and JSON answer. NodeUnavailableError when it cannot be
    reached or answers no JSON."""
    import http.client
    import json
    import socket

    kind, _, where = address.partition(":")
    if kind == UNIX:
        connection = http.client.HTTPConnection("localhost", timeout=NODE_TIMEOUT)
        connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.sock.settimeout(NODE_TIMEOUT)
    else:
        host, _, port = where.rpartition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=NODE_TIMEOUT)
    try:
        if kind == UNIX:
            connection.sock.connect(where)
        connection.request("POST", path, json.dumps(body).encode(), {
            "Content-Type": "application/json", "Authorization": f"{BEARER} {token}",
        })
        response = connection.getresponse()
        data = response.read()
    except OSError as e:
        raise NodeUnavailableError(f"could not reach the node: {e}") from None
    finally:
        connection.close()
    try:
        return response.status, json.loads(data)
    except ValueError:
        raise NodeUnavailableError(f"the node answered {response.status} without JSON") from None


_schedulers: dict[str, Scheduler] = {}
_lock = threading.Lock()
_node: tuple[str | None, str | None] = (None, None)  # the endpoint's address and this crawl's token


def set_node(address: str | None, token: str | None) -> None:
    """This crawl's way to its node, from its launch (``launch.enter``)."""
    global _node
    _node = (address, token)


def frontier_step(body: dict) -> dict:
    """One frontier step of this crawl (``FRONTIER_PATH``): the node's answer. NotInACrawlError when this is not a
    crawl of a node; NodeUnavailableError when the node or its database did not answer (nothing was done)."""
    address, token = _node
    if not (address and token):
        raise NotInACrawlError("the frontier scheduler needs a crawl started by a node of the cluster")
    status, answer = _ask_node(address, token, body, FRONTIER_PATH)
    if status == 503:
        raise NodeUnavailableError(answer.get("message", "the node's database did not answer"))
    if status != 200:
        raise NotInACrawlError(f"the node refused the frontier step ({status}): {answer.get('message')}")
    return answer


def scheduler(parent: str | None) -> Scheduler:
    """The crawl's scheduler: its node decides the project (the crawl's own, as its tree is)."""
    parent = parent or os.environ.get(JOB_VARIABLE)
    address, token = _node
    missing = [what for what, value in (("parent job (SCRAPY_JOB)", parent), ("node's address", address),
                                        ("crawl token", token)) if not value]
    if missing:
        raise NotInACrawlError(
            f"cannot schedule follow-up jobs: no {', '.join(missing)}; run the crawl through a node of the cluster"
        )
    with _lock:
        if parent not in _schedulers:
            _schedulers[parent] = Scheduler(address, token, parent)
        return _schedulers[parent]
