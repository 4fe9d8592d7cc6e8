"""A process that no other process of its user may read or trace: the node at start, and each crawl for itself.

Crawls run as the node's user. Linux lets a process of the same user read ``/proc/<pid>/environ`` and ``mem`` of
another, and attach to it, unless that one is not dumpable: the node would give its keys away, and a crawl its
token to its node. Used in the crawl process too (no reactor, nothing of the package imported).
"""

from __future__ import annotations

import ctypes
import os

PR_SET_DUMPABLE = 4


def make_not_dumpable() -> None:
    """This process's memory and ``/proc/<pid>/environ``, ``maps``, ``mem`` become unreadable (and it cannot be
    traced) by any process of the same user that is not root: the crawls."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_DUMPABLE, 0) failed: {os.strerror(errno)}")
