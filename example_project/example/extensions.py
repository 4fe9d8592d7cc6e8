"""The project's own extension (``EXTENSIONS`` in settings.py): it must run beside the node's."""

from scrapy import signals

from example.recording import RecordingSpider


class RecordClose:
    """Appends each crawl's close to ``<EXAMPLE_RECORD_DIR>/extensions.jsonl``."""

    def __init__(self, crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler):
        extension = cls(crawler)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_closed(self, spider, reason):
        RecordingSpider.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "extensions.jsonl",
                                      {"job": getattr(spider, "job", None), "reason": reason})
