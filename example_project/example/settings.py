import os

BOT_NAME = "example"

SPIDER_MODULES = ["example.spiders"]
NEWSPIDER_MODULE = "example.spiders"

# Everything is offline: never fetch robots.txt, and keep start-up lean.
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
# Scrapy 2.19's remote-control extension opens an HTTP port per crawl (code
# execution endpoint); not wanted in a cluster of crawl processes.
REMOTE_CONTROL_ENABLED = False
LOG_LEVEL = "INFO"
FEED_EXPORT_ENCODING = "utf-8"

# Directory for the runs.jsonl run record (see example.recording.RecordingSpider).
# Taken from the environment so Scrapyd-launched crawls inherit it; it can also
# be overridden per crawl with `-s EXAMPLE_RECORD_DIR=...`.
EXAMPLE_RECORD_DIR = os.environ.get("EXAMPLE_RECORD_DIR") or None

# The project's own extension, beside Scrapy's and the node's (which reports the crawl's stats).
EXTENSIONS = {"example.extensions.RecordClose": 500}
