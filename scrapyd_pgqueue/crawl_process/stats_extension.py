"""The crawl's side of its stats: a Scrapy extension that sends Scrapy's stats to the node (``job_stats.py``).

The node's runner adds it to Scrapy's default extensions (``install``, called by ``runner.py`` for a spawned crawl
and by ``warm_process.py`` before it forks one), so the project changes nothing and its own ``EXTENSIONS`` merge
with it as with Scrapy's. It writes on descriptor 3 only when the node asked for it (``INTERVAL_VARIABLE`` in the
environment) and that descriptor is a pipe: a crawl started another way reports nothing. The user's prints go to
stdout and stderr and never mix in. No reactor import here: this module is imported before Scrapy installs its
reactor.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time

from scrapyd_pgqueue.crawl_process.job_stats import (
    COUNTS_SECONDS,
    FINISH_REASON,
    INTERVAL_VARIABLE,
    ITEMS,
    MAX_LINE_BYTES,
    REQUESTS,
    RESPONSES,
    STATS_FD,
    json_safe,
    summary_only,
)

logger = logging.getLogger(__name__)

EXTENSION = "scrapyd_pgqueue.crawl_process.stats_extension.ReportStats"
ORDER = 1000  # after Scrapy's own (0): its spider_closed handler sees what CoreStats and LogStats add at close
DEFAULT_INTERVAL = 30.0


def install() -> None:
    """Add ReportStats to Scrapy's default extensions in this process, before any crawler reads its settings."""
    from scrapy.settings import default_settings

    if EXTENSION not in default_settings.EXTENSIONS_BASE:
        default_settings.EXTENSIONS_BASE = {**default_settings.EXTENSIONS_BASE, EXTENSION: ORDER}


class Channel:
    """Descriptor 3 as the node opened it: one JSON object per line; once the node is gone, nothing more."""

    def __init__(self, fd: int):
        self.fd = fd
        self.open = True
        os.set_inheritable(fd, False)  # a subprocess of the spider must not hold the node's pipe open

    @classmethod
    def of_this_crawl(cls) -> Channel | None:
        """The channel, when the node passed one; None for a crawl started otherwise (its descriptor 3, if any,
        is not ours)."""
        if INTERVAL_VARIABLE not in os.environ:
            return None
        try:
            if not stat.S_ISFIFO(os.fstat(STATS_FD).st_mode):
                return None
        except OSError:
            return None
        return cls(STATS_FD)

    def send(self, line: bytes) -> None:
        view = memoryview(line)
        try:
            while view and self.open:
                view = view[os.write(self.fd, view):]
        except OSError:  # the node is gone: the crawl goes on without reporting
            self.open = False


_channel: Channel | None = None


def channel() -> Channel | None:
    global _channel
    if _channel is None:
        _channel = Channel.of_this_crawl()
    return _channel


class ReportStats:
    """Sends the crawl's stats when the spider opens, every ``interval`` seconds, and when it closes; in between,
    its counts alone within ``COUNTS_SECONDS`` of a change (a watchdog's stall timeout may be shorter than the
    interval)."""

    def __init__(self, crawler, out: Channel, interval: float):
        self.stats = crawler.stats
        self.out = out
        self.interval = interval
        self.task = None
        self.reason: str | None = None
        self.truncated = 0
        self.sent_at = time.monotonic()
        self.sent_counts: tuple = ()

    @classmethod
    def from_crawler(cls, crawler):
        from scrapy import signals
        from scrapy.exceptions import NotConfigured

        out = channel()
        if out is None:
            raise NotConfigured
        try:
            interval = float(os.environ[INTERVAL_VARIABLE])
        except ValueError:
            interval = DEFAULT_INTERVAL
        extension = cls(crawler, out, interval if interval > 0 else DEFAULT_INTERVAL)
        crawler.signals.connect(extension.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(extension.engine_stopped, signal=signals.engine_stopped)
        return extension

    def spider_opened(self, spider=None) -> None:
        self.send("opened")
        self.task = looping_call(self.look)
        self.task.start(min(self.interval, COUNTS_SECONDS), now=False)

    def counts(self) -> tuple:
        stats = self.stats.get_stats()
        return tuple(stats.get(key, 0) for key in (REQUESTS, RESPONSES, ITEMS))

    def look(self) -> None:
        """The whole stats once ``interval`` has passed since the last send; before, the counts when they changed."""
        if time.monotonic() - self.sent_at >= self.interval:
            self.send("progress")
        elif self.counts() != self.sent_counts:
            self.sent_counts = self.counts()
            self.out.send(json.dumps({"event": "counts", "stats": summary_only(json_safe(self.stats.get_stats()))},
                                     separators=(",", ":"), allow_nan=False).encode() + b"\n")

    def spider_closed(self, spider=None, reason: str = "finished") -> None:
        if self.task is not None and self.task.running:
            self.task.stop()
        self.reason = reason
        self.send("closed")

    def engine_stopped(self) -> None:
        """Again, with what the closing added after spider_closed (feed exports' counts, for one)."""
        if self.reason is not None:
            self.send("closed")

    def send(self, event: str) -> None:
        self.sent_at, self.sent_counts = time.monotonic(), self.counts()
        stats = json_safe(self.stats.get_stats())
        message = {"event": event, "stats": stats}
        if self.reason is not None:
            message["reason"] = stats[FINISH_REASON] = stats.get(FINISH_REASON) or self.reason
        line = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        if len(line) > MAX_LINE_BYTES:
            self.truncated += 1
            if self.truncated == 1:
                logger.warning("This crawl's stats take %d bytes, over the %d its node takes: only their summary "
                               "is reported", len(line), MAX_LINE_BYTES)
            message["stats"] = {**summary_only(stats), "scrapyd_pgqueue/stats_truncated": self.truncated}
            line = json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        self.out.send(line)


def looping_call(function, *args):
    """Scrapy's looping call for its reactor (2.14+), or Twisted's."""
    try:
        from scrapy.utils.asyncio import create_looping_call
    except ImportError:
        from twisted.internet.task import LoopingCall

        return LoopingCall(function, *args)
    return create_looping_call(function, *args)
