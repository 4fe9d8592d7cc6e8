"""The crawl and ``scrapy list`` runner of a one-line node: Scrapyd's ``scrapyd.runner`` with the cluster's defaults.

Scrapyd's runner reads the configuration files again in the subprocess; with only the one line there, it would build
Scrapyd's file egg storage and miss every egg deployed to the database. This one applies the one-line defaults to
that configuration first, and adds the extension that reports the crawl's stats to its node. No reactor import:
this is the crawl process, where importing Twisted's reactor would install the default one before Scrapy installs
its asyncio reactor, and every crawl would fail.
"""

from __future__ import annotations

from scrapyd_pgqueue.node.crawl_keys import make_not_dumpable

if __name__ == "__main__":  # a crawl or `scrapy list`: before anything else, other crawls lose sight of its token
    make_not_dumpable()

from scrapyd import runner as scrapyd_runner  # noqa: E402 - after the line above
from scrapyd.config import Config

from scrapyd_pgqueue import deprecated_names, stats_extension
from scrapyd_pgqueue.application import apply_defaults


class OneLineConfig(Config):
    """Scrapyd's configuration with the one-line node's defaults applied (``application.apply_defaults``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        apply_defaults(self)


__getattr__ = deprecated_names(__name__, {"ClusterConfig": "scrapyd_pgqueue.runner.OneLineConfig"})  # a former name


def main():
    scrapyd_runner.Config = OneLineConfig  # project_environment() builds its egg storage from Config()
    stats_extension.install()  # the crawl reports its stats to its node (job_stats.py)
    scrapyd_runner.main()


if __name__ == "__main__":
    main()
