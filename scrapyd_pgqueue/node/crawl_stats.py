"""The node's side of its crawls' stats (``crawl_process/job_stats.py``): read from each crawl's descriptor 3, kept per crawl, written
by the node's tick and with the finish.

``CrawlStats`` (one per crawl, ``process.crawl_stats``) is fed on the reactor thread with what the pipe gives. It
keeps the latest stats dict, whether and when the spider opened, the close reason, and the progress counters
(requests, responses, items) with the time they last changed: what a watchdog reads. A line longer than
``MAX_LINE_BYTES`` or that is not a stats message (the crawl is untrusted code: it may write anything there) is
dropped and counted, never buffered past the limit.

``stats_due`` and ``written`` are the lease thread's: each tick carries the stats that changed since they were
last written, at most every ``stats_interval`` seconds per crawl (``JobStore.node_tick``'s ``stats``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from twisted.logger import Logger

from scrapyd_pgqueue.crawl_process.job_stats import (
    ERROR_COUNTS, FINISH_REASON, ITEMS, MAX_LINE_BYTES, REQUESTS, RESPONSES, json_safe,
)
from scrapyd_pgqueue.web import metrics
from scrapyd_pgqueue.store.throttled_log import ThrottledLog

log = Logger()
trouble = ThrottledLog(lambda message: log.warn("{message}", message=message))
EVENTS = ("opened", "progress", "counts", "closed")


class CrawlStats:
    """What one crawl reported on its stats channel (reactor thread; the lease thread reads ``stats``)."""

    def __init__(self, project: str, spider: str):
        self.project, self.spider = project, spider
        self.buffer = bytearray()
        self.skipping = False  # inside a line over the limit: dropped up to its end
        self.stats: dict[str, Any] | None = None  # the latest, replaced (never changed in place) by each message
        self.opened_at: float | None = None  # time.monotonic() of the spider_opened message
        self.finish_reason: str | None = None
        self.progress: tuple[int, int, int] = (0, 0, 0)  # requests, responses, items
        self.progress_at: float | None = None  # time.monotonic() when progress last changed
        self.dropped = 0  # lines dropped: too long, or not a stats message
        self.written: dict | None = None  # lease thread: the stats its tick last wrote, and when
        self.written_at = -math.inf

    def receive(self, data: bytes) -> None:
        """Bytes from the pipe: each complete line is one message."""
        while data:
            end = data.find(b"\n")
            part, data = (data, b"") if end < 0 else (data[:end], data[end + 1:])
            if not self.skipping:
                self.buffer += part
            if len(self.buffer) > MAX_LINE_BYTES:
                self.buffer.clear()
                self.skipping = True
            if end >= 0:
                if self.skipping:
                    self.drop("a line over MAX_LINE_BYTES")
                else:
                    self.message(bytes(self.buffer))
                self.buffer.clear()
                self.skipping = False

    def message(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return self.drop("not JSON")
        if not isinstance(message, dict) or message.get("event") not in EVENTS or not isinstance(
                message.get("stats"), dict):
            return self.drop("not a stats message")
        stats = json_safe(message["stats"])  # as Postgres's jsonb takes it: one bad value must not fail the tick
        if message["event"] == "counts":  # the summary's keys alone: merged into the whole stats the node has
            stats = {**(self.stats or {}), **stats}
        now = time.monotonic()
        if message["event"] == "opened" and self.opened_at is None:
            self.opened_at = now
        if message["event"] == "closed" and isinstance(message.get("reason"), str):
            self.finish_reason = stats[FINISH_REASON] = json_safe(message["reason"])
        self.count(stats)
        progress = (counter(stats, REQUESTS), counter(stats, RESPONSES), counter(stats, ITEMS))
        if progress != self.progress or self.progress_at is None:
            self.progress, self.progress_at = progress, now
        self.stats = stats

    def count(self, stats: dict) -> None:
        """This node's counters move by what the crawl added since its last message."""
        before = self.stats or {}
        items = counter(stats, ITEMS) - counter(before, ITEMS)
        errors = sum(counter(stats, key) - counter(before, key) for key in ERROR_COUNTS)
        if items > 0:
            metrics.ITEMS_SCRAPED.labels(self.project, self.spider).inc(items)
        if errors > 0:
            metrics.CRAWL_ERRORS.labels(self.project, self.spider).inc(errors)

    def drop(self, why: str) -> None:
        self.dropped += 1
        metrics.STATS_LINES_DROPPED.inc()
        trouble.report(f"Dropped a line of the stats of a crawl of {self.project}/{self.spider}: {why}",
                       key="stats-line")


def counter(stats: dict, key: str) -> int:
    value = stats.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def stats_due(processes, interval: float) -> list[tuple[Any, CrawlStats, dict]]:
    """Lease thread: (claim, crawl stats, stats) of the crawls whose stats changed since they were last written, at
    least ``interval`` seconds ago."""
    now = time.monotonic()
    due = []
    for process in processes:
        crawl_stats, claimed = process.crawl_stats, process.claimed
        if crawl_stats is None or claimed is None:
            continue
        stats = crawl_stats.stats
        if stats is not None and stats is not crawl_stats.written and now - crawl_stats.written_at >= interval:
            due.append((claimed, crawl_stats, stats))
    return due


def written(due: list[tuple[Any, CrawlStats, dict]]) -> None:
    """Lease thread: the tick wrote these."""
    now = time.monotonic()
    for _, crawl_stats, stats in due:
        crawl_stats.written, crawl_stats.written_at = stats, now
