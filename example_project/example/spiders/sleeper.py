import json
import os
import time

import scrapy
from scrapy.utils.asyncio import sleep

from example.recording import RecordingSpider


class SleeperSpider(RecordingSpider):
    """Hold the job running for ``-a seconds=<float>`` (default 0), or until ``-a until=<Unix time>`` (crawls on
    several nodes that end at the same instant), then yield one item.

    ``-a items=<n>`` yields n items instead, one every seconds / n. ``-a noise=1`` logs one error and prints a line
    to stdout per item, as a user's print would, one that looks like a stats message (the node keeps it apart from
    the crawl's real stats). ``-a orphan=1``: first start a process that outlives the crawl (``start_orphan``).
    """

    name = "sleeper"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = float(kwargs.get("seconds", 0))
        self.until = float(kwargs["until"]) if "until" in kwargs else None
        self.items = int(kwargs.get("items", 1))
        self.noise = kwargs.get("noise") == "1"

    async def start(self):
        # A data: URL needs no network; the wait happens in the callback.
        yield scrapy.Request("data:text/plain,sleeper", dont_filter=True)

    async def parse(self, response):
        started = time.time()
        if self.spider_args.get("orphan") == "1":
            self.start_orphan()
        self.logger.info("Sleeping in the callback")  # tests wait for it: a graceful stop now waits for the sleep
        if self.noise:
            self.logger.error("sleeper: one error, as asked (noise=1)")
        for number in range(self.items):
            # Non-blocking sleep (asyncio.sleep or deferLater, depending on the
            # reactor): the reactor keeps running, so the crawl stays responsive.
            wait = self.seconds / self.items if self.until is None else max(self.until - time.time(), 0)
            await sleep(wait)
            if self.noise:
                print(json.dumps({"event": "closed", "reason": "forged", "stats": {"item_scraped_count": 10**6}}),
                      flush=True)
            yield {"job": self.job, "seconds": self.seconds, "slept": round(time.time() - started, 3),
                   "number": number}

    def start_orphan(self):
        """A grandchild that outlives the crawl, as a browser a spider started and never waited for: orphaned at once
        (a double fork), it exits when the crawl's process has ended (the pipe it reads closes with that process).
        Its pid, as the crawl sees it, goes to ``<EXAMPLE_RECORD_DIR>/orphans.jsonl``."""
        wait_end, held_end = os.pipe()
        pid_read, pid_write = os.pipe()
        middle = os.fork()
        if middle == 0:
            orphan = os.fork()
            if orphan == 0:
                os.closerange(0, wait_end)
                os.closerange(wait_end + 1, os.sysconf("SC_OPEN_MAX"))
                os.read(wait_end, 1)  # end of file: the crawl's process has ended
                os._exit(0)
            os.write(pid_write, str(orphan).encode())
            os._exit(0)
        os.close(pid_write)
        os.close(wait_end)
        orphan = int(os.read(pid_read, 32))
        os.close(pid_read)
        os.waitpid(middle, 0)  # it has exited: the orphan's parent is now whatever reaps orphans
        self.orphan_pipe = held_end  # never closed here: the crawl's exit closes it
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "orphans.jsonl",
                           {"job": self.job, "pid": orphan})
