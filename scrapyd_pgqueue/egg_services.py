"""Deprecated alias of ``services/eggs.py`` (Scrapyd's egg services off the reactor), kept for configurations."""

from scrapyd_pgqueue import deprecated_names

_NAMES = ("AddVersion", "DeleteProject", "DeleteVersion", "ListSpiders", "ListVersions")
__getattr__ = deprecated_names(__name__, {name: f"scrapyd_pgqueue.services.eggs.{name}" for name in _NAMES})
__all__ = list(_NAMES)
