"""When periodic jobs are due: pure functions of a schedule and the time, no SQL (``schedules`` runs them).

The next due time comes from the schedule (cron in its time zone, or the previous due time plus whole periods),
never from "now + period": firings do not drift, and a schedule that missed several due times while every node was
down fires once, then resumes on its grid.
"""

from __future__ import annotations

import datetime
import math
import zoneinfo
from dataclasses import dataclass

MIN_EVERY_SECONDS = 1.0  # shorter periods are mistakes, and would keep every node firing
MAX_EVERY_SECONDS = 10 * 365 * 86400.0  # longer ones too, and past a datetime's range they cannot be computed


class InvalidScheduleError(ValueError):
    """The schedule or limit cannot be stored as given (reason in the message)."""


@dataclass(frozen=True)
class Timing:
    """When a periodic job is due: a cron expression in a time zone, or every N seconds."""

    cron: str | None = None
    timezone: str = "UTC"
    every_seconds: float | None = None


def check_timing(timing: Timing) -> Timing:
    """The timing, or InvalidScheduleError saying what is wrong with it."""
    if (timing.cron is None) == (timing.every_seconds is None):
        raise InvalidScheduleError("give a cron expression or every seconds, not both or neither")
    try:
        zoneinfo.ZoneInfo(timing.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidScheduleError(f"unknown time zone {timing.timezone!r} (examples: UTC, Europe/Paris)") from None
    from croniter import croniter  # imported when a schedule is written or fired, not by every node at start-up

    if timing.cron is not None and not croniter.is_valid(timing.cron):
        raise InvalidScheduleError(f"invalid cron expression {timing.cron!r} (example: '*/15 * * * *')")
    if timing.every_seconds is not None:
        every = timing.every_seconds
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every):
            raise InvalidScheduleError(f"every must be a number of seconds, not {every!r}")
        if every < MIN_EVERY_SECONDS:
            raise InvalidScheduleError(f"every must be at least {MIN_EVERY_SECONDS:g} second, not {every:g}")
        if every > MAX_EVERY_SECONDS:
            raise InvalidScheduleError(
                f"every must be at most {MAX_EVERY_SECONDS:.0f} seconds (ten years), not {every:g}")
    return timing


def first_due_after(timing: Timing, now: datetime.datetime, previous: datetime.datetime | None = None):
    """The first due time strictly after ``now`` (aware datetimes, UTC result).

    Every N seconds: on the grid of ``previous`` (the due time just fired or skipped), so firings never drift and
    any number of missed periods collapse into one firing; without ``previous`` (a new schedule), now + N.
    Cron: the expression's next match after ``now`` in the schedule's time zone.
    """
    if timing.every_seconds is not None:
        period = datetime.timedelta(seconds=timing.every_seconds)
        if previous is None:
            return (now + period).astimezone(datetime.timezone.utc)
        periods = max(math.floor((now - previous) / period) + 1, 1)
        return (previous + periods * period).astimezone(datetime.timezone.utc)
    local = now.astimezone(zoneinfo.ZoneInfo(timing.timezone))
    from croniter import croniter

    return croniter(timing.cron, local).get_next(datetime.datetime).astimezone(datetime.timezone.utc)
