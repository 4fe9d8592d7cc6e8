"""Scrapyd's configuration as a one-line node and its crawls read it."""

from __future__ import annotations

from scrapyd.config import Config

from scrapyd_pgqueue.config import apply_defaults


class OneLineConfig(Config):
    """Scrapyd's configuration with the one-line node's defaults applied (``apply_defaults``): what a crawl's runner
    reads, so it finds the eggs in the database and not in Scrapyd's egg folder."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        apply_defaults(self)
