"""One crawl on many workers: Scrapy's scheduler over the cluster's frontier (``store/frontier.py``).

``schedule.json`` with ``_workers=N`` gives each of the crawl's jobs ``SCHEDULER = scrapyd_pgqueue.frontier.Scheduler``;
a project may name it in its own settings too (each crawl of it is then a crawl of one worker that survives its
node). The scheduler holds no database credential: it asks its node (the crawl API, ``POST /frontier``, with its
job's token), which scopes every step to the crawl of that job.

What a worker does, and why:

- **New requests** are kept in a small batch and sent with the next step, fingerprinted with the crawler's own
  ``request_fingerprinter`` (none for ``dont_filter``): the frontier stores each fingerprint once per crawl. Start
  requests are the crawl's, not each worker's: they are fingerprinted even when ``dont_filter`` (as Scrapy makes
  ``start_urls``), so every worker may send them and one copy is stored.
- **Requests are leased**, a few at a time, into a local buffer refilled in a thread, never on the reactor. A leased
  request is done only once its callback's output has passed (``Outputs``, a spider middleware): its new requests
  are sent in the same step as its acknowledgement, all or none. Retries and redirects of a leased request stay with
  the worker that holds it. A request that fails past Scrapy's retries (no errback) is recorded failed, with its
  error. A worker that dies loses nothing: its node gives its leases back when its job stops.
- **The end**: a worker keeps its spider open while the crawl has a ready request or any worker holds one
  (``has_pending_requests``); when neither remains, every worker closes with ``finished``.
"""

from __future__ import annotations

import base64
import logging
import pickle
from collections import deque

from scrapy.core.scheduler import BaseScheduler
from scrapy.http import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import request_from_dict
from twisted.internet import defer, threads

from scrapyd_pgqueue.crawl_process import crawl_node
from scrapyd_pgqueue.crawl_process.crawl_node import (
    DELAY,
    DONE,
    DUPLICATES,
    FAILED,
    FINGERPRINT,
    ID,
    LEASE,
    LEASED,
    NEW,
    OPEN,
    PER_SLOT,
    PRIORITY,
    REQUEST,
    SLOT,
)
from scrapyd_pgqueue.crawl_process.frontier_outputs import FRONTIER_ID, Outputs, install, register, stored_request

__all__ = ["Outputs", "Scheduler", "install"]

logger = logging.getLogger(__name__)

# Seconds between steps while this worker waits for others (nothing to take, the crawl still open), and after the
# node did not answer.
IDLE_STEP_SECONDS = 0.5
RETRY_SECONDS = 1.0
# Outputs and acknowledgements sent at once, at most; more wait for the next step.
MAX_STEP_REQUESTS = 500
# New requests a worker keeps unsent at most: the next step's while one is under way (the spider makes them while the
# node stores the last ones).
MAX_UNSENT_REQUESTS = 2 * MAX_STEP_REQUESTS


def _reactor():
    from twisted.internet import reactor  # the one Scrapy installed: never imported before it does

    return reactor


class Scheduler(BaseScheduler):
    """Scrapy's scheduler interface over the crawl's frontier (see the module's text)."""

    def __init__(self, crawler):
        self.crawler, self.stats = crawler, crawler.stats
        self.fingerprinter = crawler.request_fingerprinter
        self.lease_size = self.lease_size_for(crawler.settings.getint("CONCURRENT_REQUESTS", 16))
        # Scrapy's manners, held by the frontier for the whole crawl: the cap per download slot (per IP when set, as
        # Scrapy's slots then are) and the delay between two requests of a slot (the spider's download_delay first).
        settings = crawler.settings
        self.per_slot = max(1, settings.getint("CONCURRENT_REQUESTS_PER_IP")
                            or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN", 8))
        self.delay = settings.getfloat("DOWNLOAD_DELAY")
        self.buffer: deque[Request] = deque()  # leased, not yet handed to the engine
        self.local: deque[Request] = deque()  # retries and redirects of requests this worker holds
        self.held: set[int] = set()  # leased ids handed to the engine, not yet done
        self.new: list[dict] = []
        self.waiting_for_room: list[defer.Deferred] = []  # start requests that wait for a step (room_for_new)
        self.done: list[int] = []
        self.failed: list[list] = []
        self.crawl_open = True
        self.stepping = False
        self.sending = False  # the step under way carries outputs or acknowledgements
        self.step_soon = None
        self.spider = None
        register(crawler, self)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    @staticmethod
    def lease_size_for(concurrent_requests: int) -> int:
        """Requests a worker holds at most, waiting or downloading: its downloader's room (CONCURRENT_REQUESTS), so
        that it never hoards what other workers could fetch, its memory stays flat, and a worker that dies held
        little."""
        return max(1, concurrent_requests)

    def open(self, spider):
        self.spider = spider
        self.delay = max(0.0, float(getattr(spider, "download_delay", self.delay)))
        self._step()

    def close(self, reason):
        if self.step_soon is not None and self.step_soon.active():
            self.step_soon.cancel()
        self._give_room(force=True)
        if self.new or self.done or self.failed:  # what this worker found is the crawl's, whatever the reason
            return threads.deferToThread(self._send_rest)
        return None

    def has_pending_requests(self) -> bool:
        return bool(self.crawl_open or self.buffer or self.local or self.held or self.new or self.done or self.failed
                    or self.sending)

    def enqueue_request(self, request: Request) -> bool:
        if request.meta.get(FRONTIER_ID) in self.held:  # a retry or a redirect of a request this worker holds
            self.local.append(request)
            return True
        start = request.meta.get("is_start_request", False)
        fingerprint = None if request.dont_filter and not start else self.fingerprinter.fingerprint(request)
        self.new.append({
            FINGERPRINT: None if fingerprint is None else base64.b64encode(fingerprint).decode(),
            PRIORITY: request.priority,
            SLOT: self._slot_of(request),
            REQUEST: base64.b64encode(stored_request(request, self.spider)).decode(),
        })
        self._later()
        return True

    def room_for_new(self) -> defer.Deferred | None:
        """None if a new request may come now, else a Deferred that fires once a step has taken a batch: at most
        ``MAX_UNSENT_REQUESTS`` wait to be sent (``Outputs.process_start`` holds the start requests back)."""
        if len(self.new) < MAX_UNSENT_REQUESTS:
            return None
        waiting = defer.Deferred()
        self.waiting_for_room.append(waiting)
        return waiting

    def _slot_of(self, request: Request) -> str:
        """The request's download slot as this worker's Scrapy keys it (its meta's download_slot, else its host, or
        the host's address once resolved when CONCURRENT_REQUESTS_PER_IP is set)."""
        downloader = getattr(getattr(self.crawler, "engine", None), "downloader", None)
        if downloader is not None:
            return downloader.get_slot_key(request)
        return request.meta.get("download_slot") or urlparse_cached(request).hostname or ""

    def next_request(self) -> Request | None:
        if self.local:
            return self.local.popleft()
        if self.crawl_open and self._room():
            self._step()  # a refill, off the reactor; once the crawl is done, none
        if not self.buffer:
            return None
        request = self.buffer.popleft()
        self.held.add(request.meta[FRONTIER_ID])
        return request

    # --- what the spider middleware reports ---------------------------------------------------------------------

    def request_done(self, request_id: int | None) -> None:
        if request_id in self.held:
            self.held.discard(request_id)
            self.done.append(request_id)
            self._later()

    def request_failed(self, request_id: int | None, error: str) -> None:
        if request_id in self.held:
            self.held.discard(request_id)
            self.failed.append([request_id, error[:2000]])
            self.stats.inc_value("frontier/failed")
            self._later()

    def _errback(self, request_id: int, original):
        def failed(failure):
            if original is not None:  # its own errback decides; its output passes Outputs, which acknowledges it
                return original(failure)
            logger.error("Gave up %s: %s", getattr(failure, "request", request_id), failure.getErrorMessage())
            self.request_failed(request_id, f"{failure.type.__name__}: {failure.getErrorMessage()}")
            return None

        return failed

    # --- steps ------------------------------------------------------------------------------------------------

    def _later(self) -> None:
        """A step soon: outputs and acknowledgements of one reactor turn go together."""
        if self.step_soon is None or not self.step_soon.active():
            self.step_soon = _reactor().callLater(0, self._step)

    def _step(self) -> None:
        if self.stepping or self.spider is None:
            return
        body = {NEW: self.new[:MAX_STEP_REQUESTS], DONE: self.done[:MAX_STEP_REQUESTS],
                FAILED: self.failed[:MAX_STEP_REQUESTS],
                LEASE: self._room(), PER_SLOT: self.per_slot, DELAY: self.delay}
        del self.new[:MAX_STEP_REQUESTS], self.done[:MAX_STEP_REQUESTS], self.failed[:MAX_STEP_REQUESTS]
        self._give_room()
        self.stepping, self.sending = True, bool(body[NEW] or body[DONE] or body[FAILED])
        d = threads.deferToThread(crawl_node.frontier_step, body)
        d.addCallbacks(self._stepped, self._not_stepped, errbackArgs=(body,))

    def _room(self) -> int:
        """Requests to lease now: what this worker can start, never more (the rest is for the other workers)."""
        return max(0, self.lease_size - len(self.buffer) - len(self.held))

    def _stepped(self, answer: dict) -> None:
        self.stepping = self.sending = False
        if answer[DUPLICATES]:
            self.stats.inc_value("dupefilter/filtered", answer[DUPLICATES])
        for leased in answer[LEASED]:
            request = request_from_dict(pickle.loads(base64.b64decode(leased[REQUEST])), spider=self.spider)
            request.meta[FRONTIER_ID] = leased[ID]
            request.errback = self._errback(leased[ID], request.errback)
            self.buffer.append(request)
        self.crawl_open = answer[OPEN]
        self._give_room()
        if self.new or self.done or self.failed:
            self._later()
        elif self.crawl_open and not self.buffer and not self.held and not self.local:
            _reactor().callLater(IDLE_STEP_SECONDS, self._step)  # others hold the crawl's requests: ask again
        self._wake_engine()

    def _not_stepped(self, failure, body: dict) -> None:
        self.stepping = self.sending = False
        self.new[:0], self.done[:0], self.failed[:0] = body[NEW], body[DONE], body[FAILED]  # sent again
        if failure.check(crawl_node.NodeUnavailableError):
            logger.warning("The frontier did not answer (%s): trying again", failure.getErrorMessage())
            _reactor().callLater(RETRY_SECONDS, self._step)
            return
        logger.error("The frontier refused this crawl: %s", failure.getErrorMessage())
        self.crawl_open = False
        self.buffer.clear()
        self.new.clear()
        self._give_room()
        self._wake_engine()

    def _give_room(self, force: bool = False) -> None:
        if force or len(self.new) < MAX_UNSENT_REQUESTS:
            waiting, self.waiting_for_room = self.waiting_for_room, []
            for deferred in waiting:
                deferred.callback(None)

    def _send_rest(self) -> None:
        """Thread, at close: what is left, in steps that lease nothing."""
        while self.new or self.done or self.failed:
            body = {NEW: self.new[:MAX_STEP_REQUESTS], DONE: self.done[:MAX_STEP_REQUESTS],
                    FAILED: self.failed[:MAX_STEP_REQUESTS], LEASE: 0}
            del self.new[:MAX_STEP_REQUESTS], self.done[:MAX_STEP_REQUESTS], self.failed[:MAX_STEP_REQUESTS]
            crawl_node.frontier_step(body)

    def _wake_engine(self) -> None:
        """The engine asks for requests again at once, not at its next heartbeat (every 5 s)."""
        slot = getattr(getattr(self.crawler, "engine", None), "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()
