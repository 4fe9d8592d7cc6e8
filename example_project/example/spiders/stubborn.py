import os
import signal
import time

import scrapy
from scrapy.utils.asyncio import sleep

from example.recording import RecordingSpider


class StubbornSpider(RecordingSpider):
    """A crawl that cannot stop itself: it ignores SIGINT and SIGTERM (as a spider blocked in C code would) and
    holds the job running for ``-a seconds=<float>`` (default 600); only SIGKILL ends it sooner. With ``-a
    hang=1`` it blocks in ``__init__`` instead (a spider waiting on a server that never answers): its crawl never
    reaches the spider's opening. Its run is recorded before it blocks."""

    name = "stubborn"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = float(kwargs.get("seconds", 600))
        if kwargs.get("hang") == "1":
            self.record_run(os.environ.get("EXAMPLE_RECORD_DIR"))
            time.sleep(self.seconds)

    async def start(self):
        yield scrapy.Request("data:text/plain,stubborn", dont_filter=True)

    async def parse(self, response):
        # Here, not in __init__: Scrapy installs its own handlers when the crawl starts.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.logger.info("Ignoring SIGINT and SIGTERM")  # tests wait for it before they cancel
        await sleep(self.seconds)
        yield {"job": self.job}
