"""The database's clock as this process knows it: its offset from this process's, learnt from each heartbeat, and
the deadline a write must meet on the database's clock (``answer_by``): after it, the caller has given up."""

from __future__ import annotations

import datetime
import time

from scrapyd_pgqueue.database.waits import DEFAULT_TIMEOUT, remaining_time

# How far the database's clock is ahead of this process's (seconds), learnt from each heartbeat.
_clock_offset = 0.0
ANSWER_MARGIN = 1.0  # seconds a statement's effect must precede the caller's deadline by: the reply's way back


def learn_clock_offset(database_clock: float, sent: float, received: float) -> None:
    """From a statement that read the database's clock between ``sent`` and ``received`` (this process's clock):
    only a quick one, whose midpoint is within a fraction of ANSWER_MARGIN."""
    global _clock_offset
    if received - sent < ANSWER_MARGIN / 4:
        _clock_offset = database_clock - (sent + received) / 2


def adopt_clock_offset(offset: float) -> None:
    """Take the clock offset a node learnt, in a helper process that runs its operations (``node/copy_helper.py``)."""
    global _clock_offset
    _clock_offset = offset


def clock_offset() -> float:
    """Seconds the database's clock is ahead of this process's, as last learnt (0 before the first heartbeat)."""
    return _clock_offset


def database_now() -> datetime.datetime:
    """The database's clock now (aware), as this process knows it from its heartbeats."""
    return datetime.datetime.fromtimestamp(time.time() + _clock_offset, datetime.timezone.utc)


def answer_by() -> float:
    """The database-clock time (Unix seconds) after which a write of this thread's operation must not happen: by
    then the caller has given up and answered an error, so a late write would be a ghost."""
    left = remaining_time()
    left = DEFAULT_TIMEOUT if left is None else left
    return time.time() + _clock_offset + left - min(ANSWER_MARGIN, left / 2)
