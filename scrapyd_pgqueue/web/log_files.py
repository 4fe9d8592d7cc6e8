"""A crawl's log files, read by the node without trusting them: the crawl may have replaced its log with a FIFO
(a plain open() waits for a writer that never comes, and the node's finishes or its reactor wait with it) or with a
link to a file of the node's (its configuration: the link's target would be stored or served)."""

from __future__ import annotations

import errno
import os
import stat


def open_log(path: str):
    """``path`` opened for reading, without blocking or following a link in its last component; a FileNotFoundError
    (ENOENT) when it is not a regular file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path) from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise FileNotFoundError(errno.ENOENT, "not a regular file", path)
    return os.fdopen(descriptor, "rb")


def read_log_tail(path: str, max_bytes: int) -> tuple[int, bytes]:
    """A log file's size and its last ``max_bytes`` (OSError when it is missing or not a regular file)."""
    with open_log(path) as file:
        size = os.fstat(file.fileno()).st_size
        file.seek(max(0, size - max_bytes))
        return size, file.read(max_bytes)


def is_inside(path: str, directory: str) -> bool:
    """Whether ``path``, its links resolved, is ``directory`` or below it (a linked directory may lead anywhere)."""
    real, base = os.path.realpath(path), os.path.realpath(directory)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)
