"""Explore a site of unknown size, one job per section: each page spawns a child job per section it links to.

    curl http://node:6800/schedule.json -d project=trees -d spider=explore -d site=http://site.internal \
         -d _unique_key=section:0 -d _unique_scope=tree \
         -d _on_complete=tree_summary -d '_on_complete_args={"node": "http://node:6800/"}'

Every section is crawled once in the whole tree, however many pages link to it (``unique_key`` in tree scope):
the first job to find it schedules it, the others get the existing job's id. The root holds its own section's key
(``_unique_key=section:0`` with ``_unique_scope=tree``), so pages linking back to the home page schedule nothing.
When the last job of the tree has ended, the ``tree_summary`` job runs once.
"""

import asyncio
import json
import time

import scrapy

from example.recording import RecordingSpider
from scrapyd_pgqueue.crawl import FollowUp


class ExploreSpider(RecordingSpider):
    """Crawl ``{site}/section/{section}`` (default: section ``0``, the home page) and schedule a child job for each
    section it links to, keyed ``section:<id>`` in the tree. ``until``: Unix seconds; the crawl (and its children)
    wait until then before closing, so that many end at the same instant."""

    name = "explore"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.site = kwargs["site"].rstrip("/")
        self.section = kwargs.get("section", "0")
        self.until = kwargs.get("until")

    async def start(self):
        yield scrapy.Request(f"{self.site}/section/{self.section}", dont_filter=True)

    async def parse(self, response):
        links = [href.rsplit("/", 1)[-1] for href in response.css("a.section::attr(href)").getall()]
        yield {"job": self.job, "section": self.section, "title": response.css("h1::text").get(), "links": links}
        for section in links:
            if section != self.section:
                args = {"site": self.site, "section": section}
                if self.until:
                    args["until"] = self.until
                yield FollowUp("explore", args, unique_key=f"section:{section}")
        if self.until:
            await asyncio.sleep(max(0.0, float(self.until) - time.time()))


class TreeSummarySpider(RecordingSpider):
    """The tree's ``_on_complete`` job: reads ``tree.json`` of its tree (``tree``, the root's job id, which the
    queue passes) from ``node`` and appends it to ``<EXAMPLE_RECORD_DIR>/summaries.jsonl``."""

    name = "tree_summary"

    async def start(self):
        node = getattr(self, "node", None)
        if node:
            query = f"project={getattr(self, 'project', 'trees')}&job={self.tree}"
            yield scrapy.Request(f"{node.rstrip('/')}/tree.json?{query}", dont_filter=True)

    def parse(self, response):
        summary = json.loads(response.text)
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "summaries.jsonl", {
            "job": self.job, "tree": self.tree, "summarised": time.time(), "answer": summary,
        })
        yield {"job": self.job, **summary}
