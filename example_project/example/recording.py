"""Base spider shared by the example spiders: job id, run record, forced failure."""

import json
import os
import time

import scrapy


class RecordingSpider(scrapy.Spider):
    """Spider base class that records every run.

    Spider arguments (all optional):

    * ``_job``: the Scrapyd job id (Scrapyd passes it as ``-a _job=<id>``); copied
      into every item as ``job``.
    * ``fail``: if ``"1"``, the crawl fails to start and ``scrapy crawl`` exits
      with status 1.

    When the ``EXAMPLE_RECORD_DIR`` setting (defaulting to the environment
    variable of the same name) is set, one JSON line is appended per run to
    ``<EXAMPLE_RECORD_DIR>/runs.jsonl``, and one per run that closed to
    ``<EXAMPLE_RECORD_DIR>/ends.jsonl``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # sets every kwarg as an attribute
        self.spider_args = dict(kwargs)
        self.job = kwargs.get("_job")

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        # Record when the spider is created, just before it opens, so that
        # failing runs (fail=1) are recorded too: tests can count every run.
        spider.record_run(crawler.settings.get("EXAMPLE_RECORD_DIR"))
        if kwargs.get("fail") == "1":
            # CloseSpider or an exception in a callback still exits with 0.
            # An exception while the spider is being created makes Scrapy set
            # bootstrap_failed, so `scrapy crawl` exits with status 1.
            raise RuntimeError(f"spider {cls.name!r} asked to fail (fail=1)")
        return spider

    def record_run(self, record_dir):
        self.append_record(record_dir, "runs.jsonl", {
            "job": self.job,
            "spider": self.name,
            "pid": os.getpid(),
            "node": os.environ.get("SCRAPYD_NODE_NAME"),
            "args": self.spider_args,
            "started": time.time(),
        })

    def closed(self, reason):
        # The end of each run as well (<EXAMPLE_RECORD_DIR>/ends.jsonl), so that
        # tests can tell which crawls ran at the same time.
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "ends.jsonl", {
            "job": self.job,
            "spider": self.name,
            "pid": os.getpid(),
            "node": os.environ.get("SCRAPYD_NODE_NAME"),
            "ended": time.time(),
            "reason": reason,
        })

    @staticmethod
    def append_record(record_dir, filename, record):
        if not record_dir:
            return
        line = json.dumps(record) + "\n"
        os.makedirs(record_dir, exist_ok=True)
        # O_APPEND plus a single write() per line: lines written concurrently by
        # crawls on several nodes/processes do not interleave.
        fd = os.open(
            os.path.join(record_dir, filename),
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
            0o644,
        )
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
