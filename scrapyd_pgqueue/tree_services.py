"""``tree.json`` now lives in ``services/trees.py``; this path stays for configurations."""

from scrapyd_pgqueue.services.trees import Tree  # noqa: F401

__all__ = ["Tree"]
