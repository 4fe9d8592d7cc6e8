"""A spider that replaces its own log file with a FIFO, as one that wants to freeze its node would: a node that
opened the log to store it would wait for a writer that never comes. Records the path in
<EXAMPLE_RECORD_DIR>/fifos.jsonl."""

import os

from example.recording import RecordingSpider


class FifoLogSpider(RecordingSpider):
    name = "fifo_log"

    async def start(self):
        path = self.crawler.settings.get("LOG_FILE")  # Scrapyd's logs_dir/<project>/<spider>/<job>.log
        os.unlink(path)  # Scrapy keeps writing to the file it opened; the node finds a FIFO at its path
        os.mkfifo(path)
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "fifos.jsonl",
                           {"job": self.job, "fifo": path})
        return
        yield
