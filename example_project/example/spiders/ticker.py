import time

import scrapy
from scrapy.utils.asyncio import sleep

from example.recording import RecordingSpider


class TickerSpider(RecordingSpider):
    """Make progress for ``-a seconds=<float>`` (default 60): a request, a response and an item every ``-a
    step=<float>`` seconds (default 0.5). A graceful stop (SIGINT) ends it within one step."""

    name = "ticker"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = float(kwargs.get("seconds", 60))
        self.step = float(kwargs.get("step", 0.5))
        self.began = time.time()

    async def start(self):
        yield self.tick(0)

    def tick(self, number):
        return scrapy.Request(f"data:text/plain,tick{number}", dont_filter=True, cb_kwargs={"number": number})

    async def parse(self, response, number):
        await sleep(self.step)
        yield {"job": self.job, "tick": number}
        if time.time() - self.began < self.seconds:
            yield self.tick(number + 1)
