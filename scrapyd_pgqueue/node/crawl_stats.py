"""The node's side of its crawls' stats (``crawl_process/job_stats.py``): read from each crawl's descriptor 3, kept per crawl, written
by the node's tick and with the finish.

``CrawlStats`` (one per crawl, ``process.crawl_stats``) is fed on the reactor thread with what the pipe gives. It
keeps the latest stats dict, whether and when the spider opened, the close reason, and the progress counters
(requests, responses, items) with the time they last changed: what a watchdog reads. A line longer than
``MAX_LINE_BYTES`` or that is not a stats message (the crawl is untrusted code: it may write anything there) is
dropped and counted, never buffered past the limit.

Of each message, only what Scrapy's own stats look like is kept (``scrapy_like``: counters, its dates, the finish
reason), at most ``MAX_KEYS`` keys and ``MAX_STATS_BYTES`` bytes, the summary's keys first (``ALWAYS_KEPT``): a
crawl that floods its descriptor costs its node, its row and its stats.json no more than that, and still reports
its progress. A "counts" message adds the summary's keys alone. The keys dropped are counted in the stats
(``KEYS_DROPPED``) and said once per crawl in the log.

``stats_due`` and ``written`` are the lease thread's: each tick carries the stats that changed since they were
last written, at most every ``stats_interval`` seconds per crawl (``JobStore.node_tick``'s ``stats``).
"""

from __future__ import annotations

import datetime
import json
import math
import time
from typing import Any

from twisted.logger import Logger

from scrapyd_pgqueue.crawl_process.job_stats import (
    ERROR_COUNTS,
    FINISH_REASON,
    ITEMS,
    MAX_LINE_BYTES,
    REQUESTS,
    RESPONSES,
    SUMMARY_KEYS,
)
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.web import metrics

log = Logger()
trouble = ThrottledLog(lambda message: log.warn("{message}", message=message))
EVENTS = ("opened", "progress", "counts", "closed")
# Scrapy's own stats are tens of keys (a few hundred with many status codes, retry reasons and feeds): room for a
# project's own counters besides, not for a flood.
MAX_KEYS = 1_000
MAX_STATS_BYTES = 64 * 1024  # the kept stats as JSON: a row and a stats.json read at once, whatever the crawl sends
MAX_KEY_CHARS = 200  # Scrapy's longest keys (retry/reason_count/<exception's path>) are well under
MAX_REASON_CHARS = 200  # CloseSpider's reasons are words
MAX_DATETIME_CHARS = 40  # "2026-11-27T15:02:11.418263+00:00", as json_safe writes Scrapy's datetimes, is 32
# Kept whatever the caps: the summary's keys (what a watchdog and listjobs.json read), then CoreStats' times.
ALWAYS_KEPT = (*SUMMARY_KEYS, "start_time", "finish_time", "elapsed_time_seconds")
KEYS_DROPPED = "scrapyd_pgqueue/stats_keys_dropped"  # the node's: keys of the crawl's stats these lack


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
        self.keys_dropped = 0  # keys dropped from the messages read: not Scrapy-like, or over the caps
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
        event, sent = message["event"], message["stats"]
        if event == "counts":  # the summary's keys alone: merged into the whole stats the node has
            stats, dropped = with_counts(self.stats or {}, sent)
        else:
            stats, dropped = kept(sent)
        if dropped:
            self.trimmed(dropped, len(sent))
        now = time.monotonic()
        if event == "opened" and self.opened_at is None:
            self.opened_at = now
        if event == "closed" and isinstance(message.get("reason"), str):
            self.finish_reason = stats[FINISH_REASON] = reason_text(message["reason"])
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

    def trimmed(self, dropped: int, sent: int) -> None:
        """Said at the crawl's first message that lost keys (a flood sends hundreds): later ones are counted."""
        if not self.keys_dropped:
            trouble.report(
                f"Dropped {dropped} of the {sent} keys of a stats message of a crawl of {self.project}/{self.spider}: "
                f"a node keeps Scrapy's counters, dates and finish reason alone, at most {MAX_KEYS} keys and "
                f"{MAX_STATS_BYTES} bytes; the crawl's stats count what it drops later ({KEYS_DROPPED})",
                key="stats-keys")
        self.keys_dropped += dropped


def kept(sent: dict) -> tuple[dict, int]:
    """(what the node keeps of a message's stats, how many of its keys it drops): those of ``ALWAYS_KEPT`` first,
    then the others in the crawl's order (Scrapy's own come early), up to the caps."""
    stats = {key: sent[key] for key in ALWAYS_KEPT if key in sent and scrapy_like(key, sent[key])}
    size = 2 + entry_bytes(KEYS_DROPPED, -2 ** 63) + sum(entry_bytes(key, value) for key, value in stats.items())
    for key, value in sent.items():
        if len(stats) >= MAX_KEYS:
            break
        if key in stats or key == KEYS_DROPPED or not scrapy_like(key, value):
            continue
        size += entry_bytes(key, value)
        if size > MAX_STATS_BYTES:
            break
        stats[key] = value
    dropped = len(sent) - len(stats)
    if dropped:
        stats[KEYS_DROPPED] = dropped
    return stats, dropped


def with_counts(before: dict, sent: dict) -> tuple[dict, int]:
    """The stats the node has with a "counts" message's summary keys: nothing else of it, so that a crawl sending
    new keys in each one grows nothing."""
    counts = {key: sent[key] for key in SUMMARY_KEYS if key in sent and scrapy_like(key, sent[key])}
    dropped = len(sent) - len(counts)
    stats = {**before, **counts}
    if dropped:
        stats[KEYS_DROPPED] = counter(before, KEYS_DROPPED) + dropped
    return stats, dropped


def scrapy_like(key: str, value: Any) -> bool:
    """Whether a stat looks like one of Scrapy's: a short key to a number (or null), to one of its datetimes as
    json_safe writes them, or the finish reason. Nothing nested, no text of the crawl's own: what jsonb takes, too."""
    if not (isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS and storable(key)):
        return False
    if value is None:  # LogStats' items_per_minute of a crawl too short to tell
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -2 ** 63 <= value < 2 ** 63  # a counter, not thousands of digits
    if isinstance(value, float):
        return math.isfinite(value)
    if not isinstance(value, str):
        return False
    if key == FINISH_REASON:
        return len(value) <= MAX_REASON_CHARS and storable(value)
    if len(value) > MAX_DATETIME_CHARS:
        return False
    try:
        datetime.datetime.fromisoformat(value)  # refuses NUL and lone surrogates too
    except ValueError:
        return False
    return True


def storable(text: str) -> bool:
    """No NUL and no lone surrogate (JSON's "\\ud800"): Postgres's jsonb takes neither, and one would fail the tick
    that writes every crawl's stats."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def entry_bytes(key: str, value: Any) -> int:
    """Bytes of ``"key":value,`` in the stats as the tick writes them."""
    return len(json.dumps(key)) + len(json.dumps(value)) + 2


def reason_text(reason: str) -> str:
    """A closed message's reason as a finish reason: short, storable."""
    return reason[:MAX_REASON_CHARS].replace("\x00", "").encode(errors="replace").decode()


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
