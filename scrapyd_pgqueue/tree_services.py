"""Deprecated alias of ``services/trees.py`` (``tree.json``), kept for configurations."""

from scrapyd_pgqueue import deprecated_names

_NAMES = ("Tree",)
__getattr__ = deprecated_names(__name__, {name: f"scrapyd_pgqueue.services.trees.{name}" for name in _NAMES})
__all__ = list(_NAMES)
