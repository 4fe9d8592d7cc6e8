"""The crawl and ``scrapy list`` runner of a one-line node: Scrapyd's ``scrapyd.runner`` with the cluster's defaults.

Scrapyd's runner reads the configuration files again in the subprocess; with only the one line there, it would build
Scrapyd's file egg storage and miss every egg deployed to the database. This one applies the one-line defaults to
that configuration first, enters the launch its node gave it (``crawl_process/launch.py``: its arguments, its token,
its directories, its Landlock domain) before any of the project's code loads, activates the egg the node sealed, and
adds the extension that reports the crawl's stats to its node. No reactor import: this is the crawl process, where
importing Twisted's reactor would install the default one before Scrapy installs its asyncio reactor, and every crawl
would fail.
"""

from __future__ import annotations

from scrapyd_pgqueue.crawl_process.early_cancel import exit_quietly_until_scrapy_handles_signals
from scrapyd_pgqueue.crawl_process.not_dumpable import make_not_dumpable

if __name__ == "__main__":  # a crawl or `scrapy list`: before anything else, a cancel ends it quietly and other
    exit_quietly_until_scrapy_handles_signals()  # processes lose sight of it
    make_not_dumpable()

from scrapyd import runner as scrapyd_runner  # noqa: E402 - after the line above

from scrapyd_pgqueue.crawl_process import frontier_outputs, launch, stats_extension  # noqa: E402
from scrapyd_pgqueue.one_line_config import OneLineConfig  # noqa: E402


def main():
    launch.enter(launch.read_launch())
    scrapyd_runner.Config = OneLineConfig  # project_environment() builds its egg storage from Config()
    scrapyd_runner.activate_egg = launch.activate_egg  # the sealed egg, imported by its /proc/self/fd path
    stats_extension.install()  # the crawl reports its stats to its node (crawl_process/job_stats.py)
    frontier_outputs.install()  # a frontier worker learns when a request is done
    scrapyd_runner.main()


if __name__ == "__main__":
    main()
