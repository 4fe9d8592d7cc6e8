"""Deprecated alias of ``web/root.py`` (Scrapyd's ``webroot`` for a cluster node), kept for configurations."""

from scrapyd_pgqueue import deprecated_names

_NAMES = ("Home", "Root")
__getattr__ = deprecated_names(__name__, {name: f"scrapyd_pgqueue.web.root.{name}" for name in _NAMES})
__all__ = list(_NAMES)
