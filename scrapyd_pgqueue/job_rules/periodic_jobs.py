"""A periodic job as the operator defines it (``schedules.json``, ``scrapyd-pgqueue schedules``), checked by
schedule.json's rules for what reaches the crawl."""

from __future__ import annotations

from dataclasses import dataclass

from scrapyd_pgqueue.job_rules.job_requests import check_priority, job_from_json, required_tags, watchdog_limits
from scrapyd_pgqueue.job_rules.timing import Timing, check_timing


@dataclass(frozen=True)
class PeriodicJob:
    """A periodic job as the operator defines it."""

    name: str
    project: str
    spider: str
    timing: Timing
    priority: float = 0.0
    args: dict[str, str] | None = None
    settings: dict[str, str] | None = None
    overlap: str = "skip"
    max_runtime: float | None = None  # each fired job's _max_runtime and _stall_timeout
    stall_timeout: float | None = None
    tags: tuple[str, ...] | None = None  # each fired job's _tags (checked); None: its spider's route at each firing


def periodic_job(name, project, spider, *, cron=None, every=None, timezone="UTC", priority=0.0, args=None,
                 settings=None, overlap="skip", max_runtime=None, stall_timeout=None, tags=None):
    """A PeriodicJob checked by schedule.json's rules for what reaches the crawl (RefusedJob or
    InvalidScheduleError say why not)."""
    timing = check_timing(Timing(cron=cron, timezone=timezone, every_seconds=every))
    job_from_json({"spider": spider, "args": args or {}, "settings": settings or {}})  # RefusedJob: what is wrong
    limits = watchdog_limits({"max_runtime": max_runtime, "stall_timeout": stall_timeout})
    return PeriodicJob(name, project, spider, timing, check_priority(priority), dict(args or {}),
                       dict(settings or {}), overlap, **limits, tags=required_tags(tags))
