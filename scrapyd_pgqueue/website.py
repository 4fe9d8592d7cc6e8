"""Scrapyd's ``webroot`` for a cluster node now lives in ``web/root.py``; this path stays for configurations."""

from scrapyd_pgqueue.web.root import Home, Root  # noqa: F401

__all__ = ["Home", "Root"]
