"""A shared Postgres job queue for any number of Scrapyd nodes.

Components are loaded lazily: the crawl subprocess (``scrapyd.runner``) imports this package through the
egg storage, and importing Twisted's reactor there would break Scrapy's own reactor choice.
"""

import importlib

__version__ = "0.1.0"

_COMPONENTS = {
    "PostgresSpiderQueue": "scrapyd_pgqueue.components.spiderqueue",
    "PostgresJobStorage": "scrapyd_pgqueue.components.jobstorage",
    "PostgresPoller": "scrapyd_pgqueue.components.poller",
    "PostgresLauncher": "scrapyd_pgqueue.components.launcher",
    "PostgresEggStorage": "scrapyd_pgqueue.components.eggstorage",
}

__all__ = list(_COMPONENTS)


def __getattr__(name):
    if name == "application":  # the one-line setup; the module is callable (see application.py)
        return importlib.import_module("scrapyd_pgqueue.application")
    if name in _COMPONENTS:
        return getattr(importlib.import_module(_COMPONENTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
