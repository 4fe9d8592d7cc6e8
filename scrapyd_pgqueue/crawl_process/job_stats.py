"""A job's Scrapy stats: what the crawl sends its node, how they are made JSON-safe, and their summary.

The crawl (``stats_extension.py``) writes one JSON object per line on descriptor ``STATS_FD``, which its node
(``node/crawl_stats.py``) reads apart from the crawl's stdout and stderr:

* ``{"event": "opened", "stats": {...}}`` when the spider opens;
* ``{"event": "progress", "stats": {...}}`` every ``stats_interval`` seconds;
* ``{"event": "counts", "stats": {...}}`` within ``COUNTS_SECONDS`` of a change of its requests, responses or items
  between two of those: the summary's keys alone, which the node merges into the stats it has (so a watchdog sees
  progress within a second, whatever ``stats_interval`` is);
* ``{"event": "closed", "reason": R, "stats": {...}}`` when the spider closes (and again, with what the closing
  added, when the engine stops).

``stats`` is the whole of Scrapy's stats dict. Pure functions, no Twisted: the crawl process imports this module.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

STATS_FD = 3  # the crawl's descriptor for its stats, after stdin, stdout and stderr
# The runner that adds the stats extension to a spawned crawl (runner.py; a warm process adds it itself): a crawl
# spawned by another runner reports nothing, not even its spider's opening.
REPORTING_RUNNER = "scrapyd_pgqueue.runner"
# Set by the node in each crawl's environment: seconds between two progress messages.
INTERVAL_VARIABLE = "SCRAPYD_PGQUEUE_STATS_INTERVAL"
# Seconds between two looks of the crawl at its counts (a "counts" message when they changed).
COUNTS_SECONDS = 1.0
# A line longer than this is not sent (the crawl sends the summary's keys instead) nor read (the node drops it).
MAX_LINE_BYTES = 256 * 1024
MAX_DEPTH = 8  # nesting kept in a stats value; deeper parts become their text

ITEMS = "item_scraped_count"
REQUESTS = "downloader/request_count"
RESPONSES = "response_received_count"
ERROR_COUNTS = ("log_count/ERROR", "log_count/CRITICAL")
FINISH_REASON = "finish_reason"
# The keys a summary and the watchdog read: what a crawl whose stats are too big still sends.
SUMMARY_KEYS = (ITEMS, REQUESTS, RESPONSES, *ERROR_COUNTS, FINISH_REASON)


def stats_summary(stats: Mapping[str, Any] | None) -> dict[str, Any]:
    """A job's stats in four keys, as ``listjobs.json`` gives them: ``items`` (scraped), ``requests`` (downloaded),
    ``errors`` (log lines at ERROR or above) and ``finish_reason`` (Scrapy's close reason; None while it runs or
    when the crawl never closed its spider). Counts are None when the crawl reported no stats at all."""
    if not stats:
        return {"items": None, "requests": None, "errors": None, "finish_reason": None}
    return {
        "items": _count(stats.get(ITEMS)),
        "requests": _count(stats.get(REQUESTS)),
        "errors": sum(_count(stats.get(key)) for key in ERROR_COUNTS),
        "finish_reason": stats.get(FINISH_REASON) if isinstance(stats.get(FINISH_REASON), str) else None,
    }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON that Postgres's jsonb takes: datetimes as ISO 8601 text, other objects as their text, no NaN
    or infinity (null), no NUL character, string keys, at most MAX_DEPTH levels."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if depth < MAX_DEPTH and isinstance(value, Mapping):
        return {json_safe(str(key)): json_safe(item, depth + 1) for key, item in value.items()}
    if depth < MAX_DEPTH and isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item, depth + 1) for item in value]
    return json_safe(str(value))


def summary_only(stats: Mapping[str, Any]) -> dict[str, Any]:
    """What a crawl sends when its whole stats would make a line over MAX_LINE_BYTES."""
    return {key: stats[key] for key in SUMMARY_KEYS if key in stats and isinstance(stats[key], (int, float, str))}
