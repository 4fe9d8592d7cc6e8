"""When a frontier request is done (``scrapyd_pgqueue.frontier``): the spider middleware that sees its callback's output
end, and how a request is stored. Installed in every crawl process (as the stats extension is), inert in a crawl whose
scheduler is not the frontier's; no reactor import here (the runner imports it before Scrapy installs its own)."""

from __future__ import annotations

import pickle
import weakref

# The meta key of a leased request's frontier id (dropped from requests a callback yields: those are new).
FRONTIER_ID = "frontier_request_id"
# Outermost (closest to the engine): it sees a callback's output after every other middleware filtered it, and
# the exceptions no other middleware handled.
ORDER = 1
MIDDLEWARE = "scrapyd_pgqueue.crawl_process.frontier_outputs.Outputs"
_schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(crawler, scheduler) -> None:
    """``scheduler`` is the frontier scheduler of ``crawler``: its Outputs report to it."""
    _schedulers[crawler] = scheduler


def install() -> None:
    """Add Outputs to Scrapy's default spider middlewares in this process, before any crawler reads its settings
    (inert where the crawl's scheduler is not the frontier's)."""
    from scrapy.settings import default_settings

    if MIDDLEWARE not in default_settings.SPIDER_MIDDLEWARES_BASE:
        default_settings.SPIDER_MIDDLEWARES_BASE = {**default_settings.SPIDER_MIDDLEWARES_BASE, MIDDLEWARE: ORDER}


def stored_request(request, spider) -> bytes:
    """A request as the frontier stores it: Scrapy's Request.to_dict, pickled (as Scrapy's disk queues do). A
    request that cannot be stored fails here, named."""
    try:
        return pickle.dumps(request.to_dict(spider=spider), protocol=4)
    except (ValueError, pickle.PicklingError, TypeError, AttributeError) as e:
        raise ValueError(f"{request} cannot be stored in the frontier: {e} (callbacks must be methods of the "
                         "spider, meta values picklable)") from e


class Outputs:
    """A leased request is done when its callback's output has passed, failed when its callback raised; the
    spider's start requests wait while a step's worth are still to be sent."""

    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def _scheduler(self):
        return _schedulers.get(self.crawler)  # None: the crawl's scheduler is another

    async def process_start(self, start):
        """A spider may yield millions of start requests at once (Scrapy reads ``start()`` as fast as it yields): each
        waits here until the worker has room for it, so a worker's memory stays flat whatever the crawl's size."""
        from scrapy.utils.defer import maybe_deferred_to_future

        async for item_or_request in start:
            yield item_or_request
            scheduler = self._scheduler()
            room = None if scheduler is None else scheduler.room_for_new()
            if room is not None:
                await maybe_deferred_to_future(room)

    def process_spider_output(self, response, result, spider=None):
        for output in result:
            yield self._new(output)
        self._done(response)

    async def process_spider_output_async(self, response, result, spider=None):
        async for output in result:
            yield self._new(output)
        self._done(response)

    def process_spider_exception(self, response, exception, spider=None):
        scheduler = self._scheduler()
        if scheduler is not None:
            scheduler.request_failed(response.request.meta.get(FRONTIER_ID),
                                     f"{type(exception).__name__}: {exception}")
        return None  # Scrapy logs it as ever

    @staticmethod
    def _new(output):
        from scrapy.http import Request

        if isinstance(output, Request):
            output.meta.pop(FRONTIER_ID, None)  # response.request.replace(...) keeps meta: a new request all the same
        return output

    def _done(self, response) -> None:
        scheduler = self._scheduler()
        if scheduler is not None and response.request is not None:
            scheduler.request_done(response.request.meta.get(FRONTIER_ID))
