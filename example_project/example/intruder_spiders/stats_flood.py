"""A spider that floods its node with stats, as a hostile one could. On the stats descriptor its node reads (3,
written directly), ``lines`` lines (150) of ``keys`` keys each (6,000), new keys on every line, values of every
shape (numbers, nested dicts, lists, text, booleans, nulls, a dated text, a long text filling the line to just
under the 256 KiB a node reads): the first a "progress" message, the others "counts", which a node merges into what
it has. Through Scrapy's own stats besides, ``counters`` counters (3,000) and a nested and a long value, which the
node's extension sends whole (with ``-a lines=0 -a counters=0``, an ordinary crawl). Then it fetches one page and
finishes. Records the lines and bytes it wrote in <EXAMPLE_RECORD_DIR>/stats_floods.jsonl.
"""

import json
import os

import scrapy

from example.recording import RecordingSpider
from example.spiders.quotes import data_url

STATS_FD = 3
MAX_LINE_BYTES = 256 * 1024  # what a node reads of one line (scrapyd_pgqueue's job_stats): each line fits
SHAPES = (
    lambda j: j,
    lambda j: j / 3,
    lambda j: {"nested": {"deeper": {"deepest": [j]}}},
    lambda j: [j, str(j), None],
    lambda j: "text",
    lambda j: True,
    lambda j: None,
    lambda j: "2026-11-27T15:02:11+00:00",
)


def flood_line(number, keys):
    """One message of ``keys`` new keys, filled up to just under the line limit with one long text."""
    event = "progress" if number == 0 else "counts"
    stats = {f"flood/{number}/{j}": SHAPES[j % len(SHAPES)](j) for j in range(keys)}
    stats["k" * 1000] = 1  # a long key
    size = len(json.dumps({"event": event, "stats": stats}, separators=(",", ":"))) + 64
    stats[f"flood/{number}/long"] = "x" * max(0, MAX_LINE_BYTES - 1024 - size)
    line = json.dumps({"event": event, "stats": stats}, separators=(",", ":")).encode() + b"\n"
    assert len(line) < MAX_LINE_BYTES, len(line)
    return line


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class StatsFloodSpider(RecordingSpider):
    name = "stats_flood"

    async def start(self):
        lines, keys, counters = int(getattr(self, "lines", 150)), int(getattr(self, "keys", 6000)), int(
            getattr(self, "counters", 3000))
        written = 0
        for number in range(lines):
            line = flood_line(number, keys)
            write_all(STATS_FD, line)
            written += len(line)
        stats = self.crawler.stats
        for j in range(counters):
            stats.set_value(f"flood/set/{j}", j)
        if counters:
            stats.set_value("flood/set/nested", {"a": {"b": {"c": list(range(100))}}})
            stats.set_value("flood/set/long", "y" * 20000)
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "stats_floods.jsonl",
                           {"job": self.job, "lines": lines, "bytes": written})
        yield scrapy.Request(data_url("<html><body><p>after the flood</p></body></html>"))

    def parse(self, response):
        return
        yield
