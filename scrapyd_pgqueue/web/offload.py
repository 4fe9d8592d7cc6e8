"""Web work off the reactor: a request that waits for the database never holds up the node's other requests.

The services and pages run their work (store calls, ``scrapy list``) in the node's web threads, a bounded pool of
their own: requests stuck on a stalled database fill it, not the reactor's pool, which claims, starts and records
crawls. ``daemonstatus.json`` probes the database in threads of its own with a short deadline, so it answers
within a second even while every web thread waits. The reactor only parses requests and writes answers.
"""

from __future__ import annotations

from twisted.internet import threads
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool
from twisted.web import resource, server

log = Logger()

WEB_THREADS = 4  # requests that may wait for the database at once; the pool has database_pool_size connections
PROBE_THREADS = 2  # daemonstatus.json's probes, each bounded by its deadline

_pools: dict[str, ThreadPool] = {}


def pool(name: str, size: int) -> ThreadPool:
    """The process's pool ``name``, started on first use and stopped with the reactor."""
    from twisted.internet import reactor

    if name not in _pools:
        threadpool = ThreadPool(0, size, name=f"scrapyd_pgqueue-{name}")
        threadpool.start()
        reactor.addSystemEventTrigger("during", "shutdown", threadpool.stop)
        _pools[name] = threadpool
    return _pools[name]


def in_thread(function, *args, pool_name: str = "web", size: int = WEB_THREADS):
    """A Deferred of ``function(*args)`` run in the pool ``pool_name``."""
    from twisted.internet import reactor

    return threads.deferToThreadPool(reactor, pool(pool_name, size), function, *args)


def watch(request) -> list:
    """A list that is no longer empty once the request ended (the client went away): nothing more to do for it."""
    gone = []
    request.notifyFinish().addBoth(gone.append)
    return gone


def answer(content: bytes | int | None, request, gone: list) -> None:
    """Write what a render produced in a thread, unless the client went away meanwhile or the render answers by
    itself (NOT_DONE_YET: a producer writes and finishes the request, as a log served from the database does)."""
    if gone or content is None or content is server.NOT_DONE_YET:
        return
    request.write(content)
    request.finish()


def fail(failure, request, gone: list) -> None:
    log.failure("Could not answer {path}", failure, path=request.path)
    if not gone:
        request.setResponseCode(500)
        answer(b"Internal error; see the node's log.\n", request, gone)


def json_answer(service, request, data: dict) -> bytes:
    """``data`` answered as Scrapyd's ``WsResource.render`` answers it: ``node_name`` added, the same headers."""
    data["node_name"] = service.root.node_name
    content = service.json_encoder.encode(data).encode() + b"\n"
    request.setHeader("Content-Type", "application/json")
    request.setHeader("Access-Control-Allow-Origin", "*")
    request.setHeader("Access-Control-Allow-Methods", service.methods)
    request.setHeader("Access-Control-Allow-Headers", "X-Requested-With")
    request.setHeader("Content-Length", str(len(content)))
    return content


class OffTheReactor(resource.Resource):
    """The first base of a Scrapyd web service (a WsResource): its whole ``render`` (the service's method, and the
    JSON or error Scrapyd makes of it) runs in the web threads; the answer is written from the reactor.

    OPTIONS (no work) is answered at once, as Scrapyd does.
    """

    def render(self, request):
        if request.method == b"OPTIONS":
            return super().render(request)
        gone = watch(request)
        in_thread(self._render_unless_gone, super().render, request, gone).addCallbacks(
            answer, fail, callbackArgs=(request, gone), errbackArgs=(request, gone)
        )
        return server.NOT_DONE_YET

    @staticmethod
    def _render_unless_gone(render, request, gone) -> bytes | None:
        return None if gone else render(request)
