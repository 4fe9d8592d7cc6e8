import time

import scrapy
from scrapy.utils.asyncio import sleep

from example.recording import RecordingSpider


class SleeperSpider(RecordingSpider):
    """Hold the job running for ``-a seconds=<float>`` (default 0), or until ``-a until=<Unix time>`` (crawls on
    several nodes that end at the same instant), then yield one item."""

    name = "sleeper"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = float(kwargs.get("seconds", 0))
        self.until = float(kwargs["until"]) if "until" in kwargs else None

    async def start(self):
        # A data: URL needs no network; the wait happens in the callback.
        yield scrapy.Request("data:text/plain,sleeper", dont_filter=True)

    async def parse(self, response):
        started = time.time()
        self.logger.info("Sleeping in the callback")  # tests wait for it: a graceful stop now waits for the sleep
        # Non-blocking sleep (asyncio.sleep or deferLater, depending on the
        # reactor): the reactor keeps running, so the crawl stays responsive.
        await sleep(self.seconds if self.until is None else max(self.until - time.time(), 0))
        yield {"job": self.job, "seconds": self.seconds, "slept": round(time.time() - started, 3)}
