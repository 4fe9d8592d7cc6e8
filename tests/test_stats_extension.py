"""The crawl's side of its stats (crawl_process/stats_extension.py), over a real pipe: what it writes, and what it leaves alone."""

from __future__ import annotations

import datetime
import json
import os
from types import SimpleNamespace

from scrapyd_pgqueue.crawl_process.job_stats import MAX_LINE_BYTES
from scrapyd_pgqueue.crawl_process.stats_extension import Channel, ReportStats


class Stats:
    def __init__(self, stats):
        self.stats = stats

    def get_stats(self):
        return self.stats


def extension_on_a_pipe(stats):
    read, write = os.pipe()
    return ReportStats(SimpleNamespace(stats=Stats(stats)), Channel(write), 30.0), read


def test_the_close_sends_the_whole_stats_json_safe_with_the_reason_on_one_line():
    started = datetime.datetime(2026, 11, 27, 15, 2, 11)
    extension, read = extension_on_a_pipe({"item_scraped_count": 3, "start_time": started, "rate": float("inf")})
    extension.spider_closed(reason="closespider_timeout")
    data = os.read(read, 65536)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data) == {"event": "closed", "reason": "closespider_timeout", "stats": {
        "item_scraped_count": 3, "start_time": "2026-11-27T15:02:11", "rate": None,
        "finish_reason": "closespider_timeout"}}


def test_stats_too_big_for_a_line_are_sent_as_their_summary():
    extension, read = extension_on_a_pipe({"item_scraped_count": 3, "log_count/ERROR": 1,
                                           "huge": "x" * MAX_LINE_BYTES})
    extension.send("progress")
    assert json.loads(os.read(read, 65536)) == {"event": "progress", "stats": {
        "item_scraped_count": 3, "log_count/ERROR": 1, "scrapyd_pgqueue/stats_truncated": 1}}


def test_a_node_that_is_gone_costs_the_crawl_nothing():
    extension, read = extension_on_a_pipe({"item_scraped_count": 1})
    os.close(read)
    extension.send("progress")  # EPIPE: no exception, nothing more is tried
    assert not extension.out.open


def test_between_two_whole_sends_a_change_of_the_counts_is_sent_alone():
    stats = {"item_scraped_count": 1, "downloader/request_count": 2, "memusage/max": 10**8}
    extension, read = extension_on_a_pipe(stats)
    extension.send("opened")
    os.read(read, 65536)
    extension.look()  # nothing changed, the interval (30 s) not passed: nothing sent
    stats["item_scraped_count"] = 2
    extension.look()
    assert json.loads(os.read(read, 65536)) == {"event": "counts", "stats": {
        "item_scraped_count": 2, "downloader/request_count": 2}}
    os.set_blocking(read, False)
    extension.look()  # sent already
    assert _nothing_to_read(read)
    extension.sent_at -= 30  # the interval passed: the whole stats
    extension.look()
    assert json.loads(os.read(read, 65536))["stats"]["memusage/max"] == 10**8


def _nothing_to_read(fd: int) -> bool:
    try:
        os.read(fd, 1)
    except BlockingIOError:
        return True
    return False
