"""A shared Postgres job queue for any number of Scrapyd nodes.

Components are loaded lazily: the crawl subprocess (``scrapyd.runner``) imports this package through the
egg storage, and importing Twisted's reactor there would break Scrapy's own reactor choice.
"""

import importlib
import warnings

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


def deprecated_names(module: str, new_paths: dict[str, str]):
    """A ``__getattr__`` (PEP 562) for ``module``'s former names: each, taken, warns with its new path and is the same
    object. Importing the module stays silent, so a configuration that names a former path still loads."""

    def __getattr__(name):
        if name not in new_paths:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_module, _, new_name = new_paths[name].rpartition(".")
        warnings.warn(f"{module}.{name} is deprecated: use {new_paths[name]}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__
