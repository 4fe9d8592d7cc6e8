"""A crawl cancelled before Scrapy installs its shutdown handlers ends quietly.

The node cancels a crawl with a signal (SIGINT, then SIGTERM or another that cancel.json names). Until Scrapy's
``CrawlerProcess`` installs its handlers (once its reactor runs), Python's own would raise ``KeyboardInterrupt``
wherever the crawl stands (starting Python, importing the project): a traceback on the crawl's log, and an exit
status of 1 that the node logs as a process that died. Nothing of the crawl has started then, so there is nothing to
close: it exits at once with status 0, as Scrapy does when a signal stops a crawl.

The node's spawner starts every program with SIGINT and SIGTERM blocked (``node/spawner.py``), so that a cancel sent
before this module's handlers are in place waits, pending, instead of killing a Python that is still starting; the
runner and each crawl a warm process forks unblock them here. Used in the crawl process (no reactor, nothing of the
package imported).
"""

from __future__ import annotations

import os
import signal

CANCEL_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _exit_quietly(signum, frame) -> None:
    os._exit(0)  # nothing to flush or close: no spider has opened


def exit_quietly_until_scrapy_handles_signals() -> None:
    """From now until Scrapy replaces them, a cancel ends this process at once, with status 0 and nothing logged (one
    that came before ends it now)."""
    for signum in CANCEL_SIGNALS:
        signal.signal(signum, _exit_quietly)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CANCEL_SIGNALS)
