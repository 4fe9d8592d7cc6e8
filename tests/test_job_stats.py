"""A job's stats as values (crawl_process/job_stats.py) and as the node reads them from a crawl's pipe (node/crawl_stats.py): pure
functions, no process."""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

from scrapyd_pgqueue.crawl_process.job_stats import MAX_LINE_BYTES, SUMMARY_KEYS, json_safe, stats_summary
from scrapyd_pgqueue.node.crawl_stats import CrawlStats
from scrapyd_pgqueue.store.all_jobs import FINISHED_JOBS, RUNNING_JOBS
from scrapyd_pgqueue.web import metrics

SCHEMA = Path(__file__).resolve().parents[1] / "scrapyd_pgqueue" / "store" / "schema.sql"


def line(event, stats, **extra) -> bytes:
    return json.dumps({"event": event, "stats": stats, **extra}).encode() + b"\n"


def test_the_summary_reads_items_requests_errors_and_the_reason():
    stats = {"item_scraped_count": 7, "downloader/request_count": 9, "log_count/ERROR": 2,
             "log_count/CRITICAL": 1, "finish_reason": "closespider_timeout"}
    assert stats_summary(stats) == {"items": 7, "requests": 9, "errors": 3, "finish_reason": "closespider_timeout"}
    assert stats_summary({"start_time": "x"}) == {"items": 0, "requests": 0, "errors": 0, "finish_reason": None}
    assert stats_summary(None) == {"items": None, "requests": None, "errors": None, "finish_reason": None}
    forged = {"item_scraped_count": "many", "log_count/ERROR": -4, "finish_reason": {"not": "text"}}
    assert stats_summary(forged) == {"items": 0, "requests": 0, "errors": 0, "finish_reason": None}


def test_the_lists_of_jobs_read_every_key_of_the_summary_and_no_other():
    """The database's summary of a job's stats (spider_job_stats_summary, which the lists of jobs read) keeps the
    keys the summary reads."""
    schema = SCHEMA.read_text()
    function = schema[schema.index("FUNCTION spider_job_stats_summary"):]
    function = function[:function.index("$function$;")]
    assert sorted(re.findall(r"p_stats->'([^']+)'", function)) == sorted(SUMMARY_KEYS)
    assert all("spider_job_stats_summary(j.stats) AS stats" in statement.text
               for statement in (RUNNING_JOBS, FINISHED_JOBS))


def test_values_are_made_what_postgres_jsonb_takes():
    started = datetime.datetime(2026, 11, 27, 15, 2, 11, 418263)
    stats = {"start_time": started, "elapsed": datetime.timedelta(seconds=1.5), "rate": math.nan,
             "nul": "a\x00b", 3: {1, 2}, "object": object}
    safe = json_safe(stats)
    assert safe["start_time"] == "2026-11-27T15:02:11.418263" and safe["elapsed"] == 1.5
    assert safe["rate"] is None and safe["nul"] == "ab" and safe["3"] == [1, 2] and safe["object"].startswith("<class")
    json.dumps(safe, allow_nan=False)  # no NaN left
    deep = {}
    for _ in range(50):
        deep = {"d": deep}
    json.dumps(json_safe(deep))  # bounded depth


def test_messages_split_across_reads_are_joined_and_progress_is_stamped_when_it_changes():
    crawl = CrawlStats("p", "s")
    data = line("opened", {"item_scraped_count": 0}) + line("progress", {"item_scraped_count": 2,
                                                                          "downloader/request_count": 3})
    for start in range(0, len(data), 7):
        crawl.receive(data[start:start + 7])
    assert crawl.opened_at is not None and crawl.stats["item_scraped_count"] == 2
    assert crawl.progress == (3, 0, 2) and crawl.progress_at is not None
    changed_at = crawl.progress_at
    crawl.receive(line("progress", {"item_scraped_count": 2, "downloader/request_count": 3, "memory": 1}))
    assert crawl.progress_at == changed_at  # no progress: its time stays
    crawl.receive(line("closed", {"item_scraped_count": 2}, reason="finished"))
    assert crawl.finish_reason == crawl.stats["finish_reason"] == "finished" and crawl.dropped == 0


def dropped() -> float:
    return metrics.REGISTRY.get_sample_value("scrapyd_pgqueue_stats_lines_dropped_total")


def test_a_line_over_the_limit_or_not_a_stats_message_is_dropped_and_counted():
    dropped_before = dropped()
    crawl = CrawlStats("p", "s")
    crawl.receive(line("progress", {"item_scraped_count": 1}))
    huge = line("progress", {"item_scraped_count": 99, "padding": "x" * MAX_LINE_BYTES})
    for start in range(0, len(huge), 65536):
        crawl.receive(huge[start:start + 65536])
        assert len(crawl.buffer) <= MAX_LINE_BYTES  # never buffered past the limit
    crawl.receive(b"not json\n" + b'{"event": "other", "stats": {}}\n' + b'["a list"]\n' + b"NaN\n")
    crawl.receive(line("progress", {"item_scraped_count": 4}))
    assert crawl.dropped == 5 and crawl.stats == {"item_scraped_count": 4}
    assert dropped() - dropped_before == 5  # on /metrics
