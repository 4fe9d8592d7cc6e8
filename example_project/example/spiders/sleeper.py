import time

import scrapy
from scrapy.utils.asyncio import sleep

from example.recording import RecordingSpider


class SleeperSpider(RecordingSpider):
    """Hold the job running for ``-a seconds=<float>`` (default 0), then yield one item."""

    name = "sleeper"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = float(kwargs.get("seconds", 0))

    async def start(self):
        # A data: URL needs no network; the wait happens in the callback.
        yield scrapy.Request("data:text/plain,sleeper", dont_filter=True)

    async def parse(self, response):
        started = time.time()
        # Non-blocking sleep (asyncio.sleep or deferLater, depending on the
        # reactor): the reactor keeps running, so the crawl stays responsive.
        await sleep(self.seconds)
        yield {"job": self.job, "seconds": self.seconds, "slept": round(time.time() - started, 3)}
