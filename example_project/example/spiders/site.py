"""Crawl a whole site by its links, one request per page: the spider for a crawl spread over workers.

    curl http://node:6800/schedule.json -d project=example -d spider=site -d site=http://site.internal -d _workers=4

Each page fetched is appended to ``<EXAMPLE_RECORD_DIR>/pages.jsonl`` (the job and node that fetched it, when, and the
page), so that tests count every fetch of every page from what the crawls themselves saw.
"""

import os
import time

import scrapy

from example.recording import RecordingSpider


class SiteSpider(RecordingSpider):
    """Fetch ``{site}/section/0`` and every page it reaches through ``a.section`` links; with ``start_pages=N``, start
    from pages 0 to N-1 (a sitemap's worth of start requests, yielded at once)."""

    name = "site"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.site = kwargs["site"].rstrip("/")
        self.start_pages = int(kwargs.get("start_pages", 1))

    async def start(self):
        for page in range(self.start_pages):
            yield scrapy.Request(f"{self.site}/section/{page}", dont_filter=True)

    def parse(self, response):
        page = response.url.rsplit("/", 1)[-1]
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "pages.jsonl",
                           {"job": self.job, "node": os.environ.get("SCRAPYD_NODE_NAME"), "page": page,
                            "fetched": time.time()})
        yield {"job": self.job, "page": page}
        for href in response.css("a.section::attr(href)").getall():
            yield response.follow(href)
