"""What a crawl may ask, it asks its node: the node's endpoint for ``scrapyd_pgqueue.crawl``.

A crawl holds no database URL. To schedule the children of its tree it POSTs them to the node that runs it, on a
Unix socket in a directory of the node's own under its working directory, with a token of its own job:
``secrets.token_urlsafe(32)``, given to the crawl in its launch (never its environment), known to the node for as
long as the crawl runs and forgotten when its process ends. Crawls may run under other users than the node's, so
any local process may connect; a request is taken only with a running crawl's token from that crawl's own process
(the socket's peer, ``SO_PEERCRED``): a token read from another process is worth nothing. The node decides the scope: the project is always the token's, and each
job's ``parent`` is the crawl's own job or a job of the crawl's tree; anything else is refused. Each job passes
``schedule_batch.json``'s checks (``job_requests.job_from_json``, the node's ``default_retries``) and the batch is
stored all or none by the store's ``enqueue_many`` (its tree cap ``tree_max_jobs``), off the reactor.

``POST /schedule`` with ``Authorization: Bearer <token>`` and ``{"jobs": [job, ...]}`` answers, in Scrapyd's JSON
form, 200 ``{"jobs": [{"job": id, "existing": bool}, ...]}``; 400 a refused batch (``index``: the job refused by
its own checks); 401 a token no running crawl of this node holds, or sent by another process than its crawl's; 403 a parent outside the crawl's tree; 503 the
database did not answer in ``database_timeout``.

``POST /frontier`` is a frontier worker's step (``scrapyd_pgqueue.frontier``, ``store/frontier.py``): its new
requests, the requests it has done or failed, and how many it can take. The crawl is always the token's job's (the
job's own when it is no worker of another): a worker cannot name another crawl, and an id of another crawl's request
matches nothing. 400 a malformed step, 401 as above, 409 a job that is no longer running.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
import socket
import struct
from dataclasses import dataclass, field

from twisted.internet import reactor
from twisted.logger import Logger
from twisted.web import resource, server

from scrapyd_pgqueue.crawl_process.crawl_node import (
    BEARER,
    DELAY,
    DONE,
    DUPLICATES,
    EXISTING,
    FAILED,
    FINGERPRINT,
    FRONTIER_PATH,
    ID,
    INDEX,
    JOB,
    JOBS,
    LEASE,
    LEASED,
    NEW,
    OPEN,
    PER_SLOT,
    PRIORITY,
    REQUEST,
    SCHEDULE_PATH,
    SLOT,
    STORED,
    TCP,
    UNIX,
)
from scrapyd_pgqueue.node import copy_writer
from scrapyd_pgqueue.web import offload
from scrapyd_pgqueue.web.request_gate import Credentials
from scrapyd_pgqueue.web.request_limits import bounded_request_class

log = Logger()

SOCKET_DIRECTORY = "crawl-api"  # under the node's working directory
MAX_SOCKET_PATH = 107  # sun_path's 108 bytes, with its NUL
API_THREADS = 2  # crawl requests waiting for the database at once; beside the web threads, not in them


@dataclass
class CrawlScope:
    """What one crawl's token allows: its project, its job, and its row (whose tree it may grow; None: no row); and
    the crawl's pid, the one process that may use it (None until it has started)."""

    project: str
    job: str
    row_id: int | None
    spider: str = ""
    pid: int | None = field(default=None)
    crawl: int | None = field(default=None)  # the crawl it works for, once it used the frontier


class Refused(ValueError):
    def __init__(self, code: int, message: str, index: int | None = None):
        super().__init__(message)
        self.code, self.index = code, index


class CrawlApi(resource.Resource):
    """The endpoint and the tokens of the crawls running on this node."""

    isLeaf = True

    def __init__(self, settings, store, node_name: str):
        super().__init__()
        self.settings, self.store, self.node_name = settings, store, node_name
        self.scopes: dict[str, CrawlScope] = {}
        self.address = ""

    # --- tokens (reactor thread) ------------------------------------------------------------------------------

    def admit(self, project: str, job: str, claimed, spider: str = "") -> str:
        """A new token for a crawl about to start (never logged)."""
        token = secrets.token_urlsafe(32)
        self.scopes[token] = CrawlScope(project, job, None if claimed is None else claimed.id, spider)
        return token

    def started(self, token: str, pid: int) -> None:
        """The crawl's process is known: only it may use its token."""
        scope = self.scopes.get(token)
        if scope is not None:
            scope.pid = pid

    def forget(self, token: str | None) -> None:
        """The crawl ended (or never started): its token dies with it."""
        self.scopes.pop(token or "", None)

    # --- listening --------------------------------------------------------------------------------------------

    def listen(self, directory: str):
        """Serve on ``directory/<pid>.sock``; on a loopback port when that path is too long for a Unix socket."""
        directory = os.path.abspath(directory)
        os.makedirs(directory, mode=0o711, exist_ok=True)
        os.chmod(directory, 0o711)  # crawls of other users reach the socket; none lists the directory
        path = os.path.join(directory, f"{os.getpid()}.sock")
        site = server.Site(self)
        # A body over max_request_bytes is counted and dropped, never kept: a crawl cannot fill its node's memory.
        # No Basic credentials: a crawl holds none, its token is its credential (checked by render_POST).
        site.requestFactory = bounded_request_class(self.node_name, Credentials(None), self.settings.max_request_bytes,
                                                    self.settings.max_request_bytes)
        site.log = lambda request: None  # no access log: nothing of a crawl's request is worth a line
        site.noisy = False
        if len(path.encode()) <= MAX_SOCKET_PATH:
            if os.path.exists(path):
                os.unlink(path)  # a node of the same pid before this one (a container restarted)
            port = reactor.listenUNIX(path, site, mode=0o666)  # any local process connects; _scope decides
            self.address = f"{UNIX}:{path}"
        else:
            log.warn("The crawl endpoint's socket path {path} is longer than a Unix socket allows: serving on a "
                     "loopback port instead (the per-job token still guards it)", path=path)
            port = reactor.listenTCP(0, site, interface="127.0.0.1")
            self.address = f"{TCP}:127.0.0.1:{port.getHost().port}"
        return port

    # --- requests ---------------------------------------------------------------------------------------------

    def render_POST(self, request):
        try:
            scope = self._scope(request)
            if request.path == SCHEDULE_PATH.encode():
                work, argument = self.schedule, self._jobs(request)
            elif request.path == FRONTIER_PATH.encode():
                work, argument = self.frontier_step, frontier_step_of(self._body(request))
            else:
                raise Refused(404, f"no such endpoint: POST {SCHEDULE_PATH} or {FRONTIER_PATH}")
        except Refused as e:
            return self._answer(request, e.code, self._error(e))
        gone = offload.watch(request)
        d = offload.in_thread(work, scope, argument, pool_name="crawl-api", size=API_THREADS)
        d.addCallbacks(lambda data: (200, data), self._failed)
        d.addCallback(lambda outcome: None if gone else self._write(request, *outcome))
        return server.NOT_DONE_YET

    def _scope(self, request) -> CrawlScope:
        authorization = (request.getHeader(b"authorization") or b"").decode(errors="replace")
        scheme, _, token = authorization.partition(" ")
        scope = self.scopes.get(token.strip()) if scheme.lower() == BEARER.lower() else None
        if scope is None:
            raise Refused(401, "unknown token: not a crawl running on this node (a token dies with its job)")
        peer = peer_pid(request)
        if peer is not None and peer != scope.pid:
            raise Refused(401, "this token is not the calling process's: a crawl's token works from that crawl only")
        return scope

    @staticmethod
    def _body(request) -> dict:
        from scrapyd_pgqueue.job_rules.job_requests import parse_json

        try:
            body = parse_json(request.content.read())
        except (ValueError, UnicodeDecodeError) as e:
            raise Refused(400, f"the body must be a JSON object: {e}") from None
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object")
        return body

    def _jobs(self, request) -> list:
        body = self._body(request)
        if not isinstance(body.get(JOBS), list):
            raise Refused(400, f'the body must be a JSON object {{"{JOBS}": [...]}}')
        return body[JOBS]

    def frontier_step(self, scope: CrawlScope, step: dict) -> dict:
        """Thread: one step of a worker, scoped to its job's crawl (the store's FrontierStore.step)."""
        from scrapyd_pgqueue.store.frontier import FrontierStore

        frontier = FrontierStore.for_engine(self.store.engine)
        if scope.row_id is None:
            raise Refused(403, "the frontier serves crawls of the queue only")
        if scope.crawl is None:
            scope.crawl = frontier.crawl_of(scope.row_id)
            if scope.crawl is None:
                raise Refused(409, f"job '{scope.job}' is not running")
        done = frontier.step(scope.crawl, scope.row_id, **step)
        count_frontier_step(scope, done)
        return {"status": "ok", STORED: done.stored, DUPLICATES: done.duplicates, OPEN: done.crawl_open,
                LEASED: [{ID: r.id, REQUEST: base64.b64encode(r.request).decode()} for r in done.leased]}

    def schedule(self, scope: CrawlScope, objects: list) -> dict:
        """Thread: check and store the jobs of one crawl's request, in its scope."""
        from scrapyd_pgqueue.job_rules.checks import InvalidJobError
        from scrapyd_pgqueue.job_rules.job_requests import RefusedJob, job_from_json
        from scrapyd_pgqueue.store import DuplicateJobError

        requests = []
        for index, job in enumerate(objects):
            if isinstance(job, dict) and job.get("parent") is None:
                job = {**job, "parent": scope.job}  # a crawl schedules children; never a new root
            try:
                requests.append(job_from_json(job, self.settings.default_retries))
            except RefusedJob as e:
                spider = job.get("spider") if isinstance(job, dict) else None
                raise Refused(400, f"{spider}: {e}", index) from None
        self._check_tree(scope, sorted({request.options.parent for request in requests}))
        try:
            jobs = [(request.message, request.priority, request.options) for request in requests]
            enqueued = copy_writer.enqueue_many(self.store, scope.project, jobs)
        except (DuplicateJobError, InvalidJobError) as e:
            raise Refused(400, str(e)) from None
        return {"status": "ok", JOBS: [{JOB: job.job, EXISTING: job.existing} for job in enqueued]}

    def _check_tree(self, scope: CrawlScope, parents: list[str]) -> None:
        others = [parent for parent in parents if parent != scope.job]
        if not others:
            return
        outside = others if scope.row_id is None else self.store.parents_outside_tree(scope.project, others,
                                                                                        scope.row_id)
        if outside:
            raise Refused(403, f"parent job '{outside[0]}' is not in the tree of job '{scope.job}': a crawl "
                               "schedules children of its own job or of its own tree's jobs only")

    def _failed(self, failure) -> tuple[int, dict]:
        from scrapyd_pgqueue.database.db import DatabaseError

        if failure.check(Refused):
            return failure.value.code, self._error(failure.value)
        if failure.check(DatabaseError):
            return 503, {"status": "error", "database": "unavailable", "message": str(failure.value)}
        log.failure("A crawl's request failed", failure)
        return 500, {"status": "error", "message": "internal error; see the node's log"}

    @staticmethod
    def _error(refused: Refused) -> dict:
        answer = {"status": "error", "message": str(refused)}
        if refused.index is not None:
            answer[INDEX] = refused.index
        return answer

    def _answer(self, request, code: int, data: dict) -> bytes:
        request.setResponseCode(code)
        data["node_name"] = self.node_name
        request.setHeader("Content-Type", "application/json")
        return json.dumps(data).encode() + b"\n"

    def _write(self, request, code: int, data: dict) -> None:
        request.write(self._answer(request, code, data))
        request.finish()


MAX_LEASE = 1000  # requests one step may lease
MAX_DELAY = 3600.0  # seconds between two leases of a download slot, at most


def frontier_step_of(body: dict) -> dict:
    """The arguments of FrontierStore.step from a worker's step (Refused 400 with the reason)."""
    from scrapyd_pgqueue.store.frontier import NewRequest

    def integers(name: str) -> list[int]:
        values = body.get(name, [])
        if not isinstance(values, list) or not all(type(value) is int for value in values):
            raise Refused(400, f"{name} must be a list of request ids")
        return values

    lease, per_slot = body.get(LEASE, 0), body.get(PER_SLOT, 8)
    for name, value, least in ((LEASE, lease, 0), (PER_SLOT, per_slot, 1)):
        if type(value) is not int or not least <= value <= MAX_LEASE:
            raise Refused(400, f"{name} must be an integer from {least} to {MAX_LEASE}")
    delay = body.get(DELAY, 0)
    if type(delay) not in (int, float) or not 0 <= delay <= MAX_DELAY:
        raise Refused(400, f"{DELAY} must be a number of seconds from 0 to {MAX_DELAY:.0f}")
    failed = body.get(FAILED, [])
    if not isinstance(failed, list) or not all(
            isinstance(f, list) and len(f) == 2 and type(f[0]) is int and isinstance(f[1], str) for f in failed):
        raise Refused(400, f"{FAILED} must be a list of [request id, error]")
    new = body.get(NEW, [])
    if not isinstance(new, list):
        raise Refused(400, f"{NEW} must be a list of requests")
    try:
        requests = [NewRequest(None if r[FINGERPRINT] is None else base64.b64decode(r[FINGERPRINT], validate=True),
                               int(r[PRIORITY]), str(r[SLOT]), base64.b64decode(r[REQUEST], validate=True))
                    for r in new]
    except (TypeError, KeyError, ValueError, binascii.Error) as e:
        raise Refused(400, f"{NEW}: each request needs {FINGERPRINT}, {PRIORITY}, {SLOT} and {REQUEST} ({e})") from None
    return {"new": requests, "done": integers(DONE), "failed": [tuple(f) for f in failed], "lease": lease,
            "per_slot": per_slot, "delay": float(delay)}


def count_frontier_step(scope: CrawlScope, done) -> None:
    """This node's frontier counters (``/metrics``): what its workers' steps did, by project and spider."""
    from scrapyd_pgqueue.web import metrics

    requests = metrics.FRONTIER_REQUESTS
    for event, count in (("stored", done.stored), ("duplicate", done.duplicates), ("leased", len(done.leased)),
                         ("done", done.finished), ("failed", done.failed)):
        if count:
            requests.labels(scope.project, scope.spider, event).inc(count)


def peer_pid(request) -> int | None:
    """The pid of the process at the other end of a Unix socket request (None over TCP, which cannot tell)."""
    sock = getattr(request.channel.transport, "socket", None)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid
