"""A spider that replaces its own log file, as one that wants to freeze its node or read the node's files would:
with a FIFO (a node that opened it would wait for a writer that never comes), or with a link to ``-a link=PATH``
(a node that followed it would store and serve that file as the job's log). Records the path in
<EXAMPLE_RECORD_DIR>/swapped_logs.jsonl."""

import os

from example.recording import RecordingSpider


class LogSwapSpider(RecordingSpider):
    name = "log_swap"

    async def start(self):
        path = self.crawler.settings.get("LOG_FILE")  # Scrapyd's logs_dir/<project>/<spider>/<job>.log
        os.unlink(path)  # Scrapy keeps writing to the file it opened; the node finds the replacement at its path
        if getattr(self, "link", None):
            os.symlink(self.link, path)
        else:
            os.mkfifo(path)
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "swapped_logs.jsonl",
                           {"job": self.job, "path": path})
        return
        yield
