"""The operator's command line, ``scrapyd-pgqueue`` (console script ``scrapyd_pgqueue.cli:main``).

``entry`` builds the parser with every subcommand and runs one; ``queue``, ``schedules``, ``trees`` and ``health``
hold the subcommands; ``output`` holds the tables, JSON and messages they share.
"""

from scrapyd_pgqueue.cli.entry import main

__all__ = ["main"]
