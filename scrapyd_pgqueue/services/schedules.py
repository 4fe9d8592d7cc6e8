"""Periodic jobs over HTTP, in Scrapyd's style, so that web tools can manage them: ``addperiodic.json``,
``listperiodic.json``, ``delperiodic.json``, ``pauseperiodic.json``, ``resumeperiodic.json``.

Answers are Scrapyd's JSON (``{"status": "ok", ...}``, or ``"error"`` with a plain message); any node answers for
the whole cluster, as ``scrapyd-pgqueue periodic`` does, over ``store.ScheduleStore``. ``addperiodic.json`` takes
schedule.json's fields (project, spider, priority, setting=NAME=VALUE, every other field a spider argument) plus
the periodic job's own (name, cron or every, timezone, overlap), and checks the spider as schedule.json does.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools

from scrapyd.webservice import param, spider_list

from scrapyd_pgqueue.job_rules.job_requests import RefusedJob
from scrapyd_pgqueue.job_rules.periodic_jobs import periodic_job
from scrapyd_pgqueue.job_rules.timing import InvalidScheduleError
from scrapyd_pgqueue.services.resource import DatabaseService, refuse
from scrapyd_pgqueue.store import DuplicateScheduleError, PeriodicJobRow, ScheduleNotFoundError, ScheduleStore


class ScheduleResource(DatabaseService):
    """A web service over the cluster's periodic jobs."""

    @functools.cached_property
    def schedules(self) -> ScheduleStore:
        return ScheduleStore.for_settings(self.settings)


class AddPeriodic(ScheduleResource):
    """Add a periodic job; the answer gives its first due time (ISO 8601, UTC)."""

    @param("name")
    @param("project")
    @param("spider")
    @param("cron", required=False)
    @param("every", required=False, type=float)
    @param("timezone", required=False, default="UTC")
    @param("priority", required=False, default=0, type=float)
    @param("overlap", required=False, default="skip")
    @param("setting", required=False, default=list, multiple=True)
    @param("_max_runtime", dest="max_runtime", required=False)
    @param("_stall_timeout", dest="stall_timeout", required=False)
    @param("_tags", dest="tags", required=False)
    def render_POST(self, txrequest, name, project, spider, cron, every, timezone, priority, overlap, setting,
                    max_runtime, stall_timeout, tags):
        self.check_project(project)
        if spider not in spider_list.get(project, None, runner=self.root.runner):
            raise refuse(f"spider '{spider}' not found")
        try:
            args = _spider_arguments(txrequest.args)  # what the decorators left: schedule.json's spider arguments
            settings = dict(_setting(value) for value in setting)
            job = periodic_job(name, project, spider, cron=cron, every=every, timezone=timezone, priority=priority,
                               args=args, settings=settings, overlap=overlap, max_runtime=max_runtime,
                               stall_timeout=stall_timeout, tags=tags)
            due = self.schedules.add_periodic(job)
        except (RefusedJob, InvalidScheduleError, DuplicateScheduleError) as e:
            raise refuse(str(e)) from e
        return {"name": name, "next_fire_time": due.isoformat()}


class ListPeriodic(ScheduleResource):
    """The periodic jobs (of ``project`` when given), each with its last firing."""

    @param("project", required=False)
    def render_GET(self, txrequest, project):
        self.check_project(project)
        return {"periodic": [periodic_entry(row) for row in self.schedules.list_periodic(project)]}


class DelPeriodic(ScheduleResource):
    """Remove a periodic job; the jobs it fired stay."""

    @param("name")
    def render_POST(self, txrequest, name):
        _change(self.schedules.remove_periodic, name)
        return {"name": name}


class PausePeriodic(ScheduleResource):
    """Stop firing a periodic job until it is resumed."""

    @param("name")
    def render_POST(self, txrequest, name):
        _change(self.schedules.pause_periodic, name)
        return {"name": name, "paused": True}


class ResumePeriodic(ScheduleResource):
    """Fire a paused periodic job again from its next due time; the answer gives that time."""

    @param("name")
    def render_POST(self, txrequest, name):
        due = _change(self.schedules.resume_periodic, name)
        return {"name": name, "paused": False, "next_fire_time": due.isoformat()}


def _change(operation, name: str):
    try:
        return operation(name)
    except ScheduleNotFoundError as e:
        raise refuse(str(e)) from e


def periodic_entry(row: PeriodicJobRow) -> dict:
    """A periodic job as JSON: its columns, times in ISO 8601 with their offset."""
    entry = dataclasses.asdict(row)
    for key, value in entry.items():
        if isinstance(value, datetime.datetime):
            entry[key] = value.isoformat()
    entry["every"] = entry.pop("every_seconds")
    return entry


def _spider_arguments(fields: dict[bytes, list[bytes]]) -> dict[str, str]:
    """The form's remaining fields as spider arguments (the first value of each, as schedule.json takes them)."""
    try:
        return {name.decode(): values[0].decode() for name, values in fields.items()}
    except UnicodeDecodeError:
        raise RefusedJob("spider arguments must be valid UTF-8") from None


def _setting(value: str) -> tuple[str, str]:
    name, equals, setting = value.partition("=")
    if not equals or not name:
        raise RefusedJob(f"setting must be NAME=VALUE, not {value!r}")
    return name, setting
