"""Schedule follow-up jobs from inside a running crawl: the public API of crawl trees.

A crawl started by a node of the cluster schedules more jobs into the shared queue, each a child of the crawl
itself (it joins the crawl's tree: see docs/how-to/crawl-trees.md)::

    from scrapyd_pgqueue.crawl import FollowUp, schedule

    class Listing(scrapy.Spider):
        name = "listing"
        custom_settings = {"ITEM_PIPELINES": {"scrapyd_pgqueue.crawl.FollowUpPipeline": 100}}

        def parse(self, response):
            for href in response.css("a.detail::attr(href)").getall():
                # buffered by FollowUpPipeline and stored 500 at a time; a key found twice in the tree runs once
                yield FollowUp("detail", {"url": response.urljoin(href)}, unique_key=href)
            schedule("report", {"day": "today"})  # one job now; returns its job id

The parent is the running crawl: Scrapyd gives it its job id as the spider argument ``_job`` (and the node's
launcher as ``SCRAPY_JOB``). A crawl holds no database URL: it asks the node that runs it, over the node's Unix socket,
with a token of its own job that dies with it, both given in its launch (never its environment) and good from its own
process only.
The node decides the project (the crawl's own) and refuses a parent outside the crawl's tree (``node/crawl_api.py``;
the crawl's side is ``crawl_process/crawl_node.py``, standard library only). Nothing here imports Twisted's reactor (the pipeline
uses the one the crawl runs): a crawl pays nothing to import this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scrapyd_pgqueue.crawl_process.crawl_node import (  # noqa: F401 - the API's errors and variables, importable from here
    JOB_VARIABLE,
    NodeUnavailableError,
    NotInACrawlError,
)
from scrapyd_pgqueue.crawl_process.crawl_node import (
    scheduler as _scheduler,
)

log = logging.getLogger(__name__)

# FollowUpPipeline's batch: follow-ups stored per request (the setting FOLLOW_UP_BATCH_SIZE changes it).
BATCH_SIZE = 500


@dataclasses.dataclass
class FollowUp:
    """A job to schedule as a child of the running crawl: yield it from a callback (``FollowUpPipeline`` stores it
    and drops it from the item stream), or pass it to ``schedule_many``.

    ``args`` and ``settings`` are the child's spider arguments and Scrapy settings (strings, or numbers written as
    text); ``unique_key`` with ``unique_scope="tree"`` (the default) schedules the key once in the whole tree,
    whatever became of its job; ``unique_scope="waiting"`` is schedule.json's ``_unique_key`` (with
    ``on_conflict``). ``run_at`` (Unix seconds or ISO 8601 with an offset) or ``delay`` (seconds) delay it;
    ``retries`` and ``retry_delay`` retry it; ``version`` pins an egg version (default: the version this crawl was
    pinned to, else the newest); ``jobid`` names it (default: a new one); ``max_runtime`` and ``stall_timeout``
    (seconds) are schedule.json's ``_max_runtime`` and ``_stall_timeout``; ``tags`` (a list, or a comma-separated
    string) is its ``_tags``: only nodes with all of them run the child (default: the child spider's route).
    """

    spider: str
    args: Mapping[str, Any] | None = None
    settings: Mapping[str, Any] | None = None
    priority: float = 0
    unique_key: str | None = None
    unique_scope: str = "tree"
    on_conflict: str | None = None
    run_at: float | str | None = None
    delay: float | None = None
    retries: int | None = None
    retry_delay: float | None = None
    version: str | None = None
    jobid: str | None = None
    max_runtime: float | None = None
    stall_timeout: float | None = None
    tags: Sequence[str] | str | None = None


def schedule(
    spider: str,
    args: Mapping[str, Any] | None = None,
    *,
    settings: Mapping[str, Any] | None = None,
    priority: float = 0,
    unique_key: str | None = None,
    unique_scope: str = "tree",
    on_conflict: str | None = None,
    run_at: float | str | None = None,
    delay: float | None = None,
    retries: int | None = None,
    retry_delay: float | None = None,
    version: str | None = None,
    jobid: str | None = None,
    parent: str | None = None,
    max_runtime: float | None = None,
    stall_timeout: float | None = None,
    tags: Sequence[str] | str | None = None,
) -> str:
    """Schedule one child job of the running crawl now, in the crawl's own project; return its job id (for a tree
    key scheduled before, the job that has it). ``parent`` defaults to the running crawl (``NotInACrawlError`` when
    there is none); ``ValueError`` says what is wrong with a job that cannot be scheduled; ``NodeUnavailableError``:
    the node or its database did not answer, nothing was stored."""
    follow_up = FollowUp(
        spider, args, settings, priority, unique_key, unique_scope, on_conflict, run_at, delay, retries,
        retry_delay, version, jobid, max_runtime, stall_timeout, tags,
    )
    return schedule_many([follow_up], parent=parent)[0]


def schedule_many(follow_ups: Iterable[FollowUp], *, parent: str | None = None) -> list[str]:
    """Schedule many child jobs of the running crawl in one request, all or none, in their order; return their
    job ids. A unique key may appear once in a call."""
    return _scheduler(parent).schedule(list(follow_ups))


# --- the pipeline ------------------------------------------------------------------------------------------------


class FollowUpPipeline:
    """An item pipeline: ``FollowUp`` items are checked at once (a spider of the project), buffered, stored ``FOLLOW_UP_BATCH_SIZE`` (500) at a
    time and when the spider closes, and dropped from the item stream; other items pass through.

    Batches are stored off the reactor thread, and a full buffer holds the next follow-up until its batch is stored,
    so memory stays bounded. A tree key this crawl scheduled already (or twice in a batch) costs no row. The spider's
    close waits for the last batch, so the children are stored before the crawl ends: its tree cannot be done
    without them. A follow-up the node refuses (its own checks, its job id already live, its ``on_conflict="error"``
    key held) loses only itself: logged as an error with the reason, counted in ``followup/refused`` (as are follow-ups
    refused at once), its key not taken as scheduled; the rest of its batch is stored. A batch the node could
    not take for a while (it or its database was away) stays buffered and goes with the next one; one still unstored when the
    spider closes is logged as an error, with its count in the stats (``followup/unscheduled``). The parent is the
    spider's ``_job`` argument (Scrapyd's), else ``SCRAPY_JOB``.
    """

    def __init__(self, crawler=None):
        self.crawler = crawler
        settings = getattr(crawler, "settings", None)
        self.batch_size = settings.getint("FOLLOW_UP_BATCH_SIZE", BATCH_SIZE) if settings is not None else BATCH_SIZE
        # Checked jobs in arrival order, by tree key (a batch holds a key once), ("waiting", key) or a number.
        self.buffer: dict[Any, dict] = {}
        self.sent_keys: set[str] = set()  # tree keys this crawl has scheduled already
        self.keys_on_their_way: set[str] = set()  # tree keys of the batches being stored
        self.standby: dict[str, dict] = {}  # a key found again while on its way: stored if the first is refused
        self.scheduler = None  # crawl_node.Scheduler, at the first follow-up
        self.scheduled = 0
        self.added = 0
        self.known_spiders: set[str] | None = None

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def open_spider(self, spider=None):
        """The project's spiders, to refuse a follow-up of a spider that does not exist at once."""
        settings = getattr(self.crawler, "settings", None)
        if settings is None:
            return
        try:
            from scrapy.utils.misc import load_object

            loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
            self.known_spiders = set(loader.list()) or None  # none listed: not in a project (runspider)
        except Exception:  # noqa: BLE001 - no check then; a wrong name fails when its job starts
            self.known_spiders = None

    async def process_item(self, item, spider=None):
        if not isinstance(item, FollowUp):
            return item
        key = _tree_key(item)
        if key is not None and (key in self.sent_keys or key in self.buffer or key in self.standby):
            self._count("followup/known")  # scheduled once in the tree: the database would answer "existing"
            raise _dropped()
        try:
            job = self._checked_job(item, spider)
        except ValueError:
            self._count("followup/refused")
            raise  # Scrapy logs the reason as this item's error
        if key in self.keys_on_their_way:
            self.standby[key] = job
            raise _dropped()
        if key is None and item.unique_key is not None:
            key = ("waiting", item.unique_key)
            if key in self.buffer:
                await self._flush()  # it replaces the waiting one: stored after it, not in the same statement
        elif key is None:
            self.added += 1
            key = ("job", self.added)
        self.buffer[key] = job
        if len(self.buffer) >= self.batch_size:
            await self._flush()
        raise _dropped()

    async def close_spider(self, spider=None):
        while self.buffer:  # a follow-up on standby may take a refused one's place
            await self._flush(last=True)
        if self.scheduled:
            log.info("Scheduled %d follow-up jobs as children of job %s", self.scheduled, self._parent_job(spider))

    async def _flush(self, last: bool = False):
        if not self.buffer:
            return
        from twisted.internet import threads

        batch, self.buffer = self.buffer, {}
        keys = {key for key in batch if isinstance(key, str)}
        self.keys_on_their_way |= keys  # the same key found meanwhile waits on standby
        try:
            outcomes, error = await _awaitable(threads.deferToThread(self.scheduler.enqueue_each, list(batch.values())))
        finally:
            self.keys_on_their_way -= keys
        unstored = self._settle(batch, outcomes)
        if unstored and last:
            self._count("followup/unscheduled", len(unstored))
            log.error("Could not schedule %d follow-up jobs: %s", len(unstored), error)
        elif unstored:
            self.buffer = {**unstored, **self.buffer}  # with the next batch
            log.warning("Could not schedule %d follow-up jobs yet, trying again with the next batch: %s",
                        len(unstored), error)
        for key in keys & self.standby.keys():
            job = self.standby.pop(key)
            if key in self.sent_keys:
                self._count("followup/known")
            else:
                self.buffer.setdefault(key, job)  # in the place of the one that was not stored

    def _settle(self, batch: dict[Any, dict], outcomes: list) -> dict[Any, dict]:
        """Count and log how a batch went: stored, known, refused (each alone); return the jobs not stored."""
        unstored, stored = {}, []
        for (key, job), outcome in zip(batch.items(), outcomes):
            if outcome is None:
                unstored[key] = job
            elif isinstance(outcome, ValueError):
                self._count("followup/refused")
                log.error("Follow-up job %s of spider %s refused: %s", job["jobid"], job["spider"], outcome)
            else:
                stored.append(outcome)
                if isinstance(key, str):
                    self.sent_keys.add(key)
        new = sum(not job.existing for job in stored)
        self.scheduled += new
        self._count("followup/scheduled", new)
        self._count("followup/known", len(stored) - new)
        return unstored

    def _checked_job(self, item: FollowUp, spider=None) -> dict:
        """The job of a follow-up; ValueError says what is wrong with it."""
        if self.known_spiders is not None and item.version is None and item.spider not in self.known_spiders:
            raise ValueError(f"FollowUp of spider {item.spider!r}: no such spider in this project")
        if self.scheduler is None:
            self.scheduler = _scheduler(self._parent_job(spider))
        return self.scheduler.job(item)

    def _parent_job(self, spider=None) -> str | None:
        spider = spider or getattr(self.crawler, "spider", None)
        return getattr(spider, "_job", None) or os.environ.get(JOB_VARIABLE)

    def _count(self, key: str, count: int = 1) -> None:
        stats = getattr(self.crawler, "stats", None)
        if stats is not None:
            stats.inc_value(key, count)


def _tree_key(item: FollowUp) -> str | None:
    return item.unique_key if item.unique_key is not None and item.unique_scope == "tree" else None


def _dropped():
    """DropItem for a stored follow-up, logged at DEBUG where Scrapy allows it (2.13+), not as a warning each."""
    from scrapy.exceptions import DropItem

    try:
        return DropItem("scheduled as a follow-up job", log_level="DEBUG")
    except TypeError:
        return DropItem("scheduled as a follow-up job")


async def _awaitable(deferred):
    """A Deferred awaited from a Scrapy coroutine, whichever reactor runs it (asyncio needs a Future)."""
    try:
        from scrapy.utils.defer import maybe_deferred_to_future
    except ImportError:  # Scrapy before 2.6: coroutines run on Twisted's loop
        return await deferred
    return await maybe_deferred_to_future(deferred)
