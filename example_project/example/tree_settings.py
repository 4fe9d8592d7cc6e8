"""The ``trees`` project: the example project's settings with the crawl-tree spiders (``example.tree_spiders``).

Baked into a node next to ``example`` with ``trees = example.tree_settings`` in ``[settings]`` (the tests do). A
project of its own, so that ``example`` keeps listing just ``quotes`` and ``sleeper``.
"""

from example.settings import *  # noqa: F403 - the same offline, lean settings

SPIDER_MODULES = ["example.tree_spiders"]
NEWSPIDER_MODULE = "example.tree_spiders"

# FollowUp items become child jobs in the shared queue (stored 500 at a time and when the spider closes).
ITEM_PIPELINES = {"scrapyd_pgqueue.crawl.FollowUpPipeline": 100}
