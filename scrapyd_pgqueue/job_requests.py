"""What a client may ask to schedule: the rules every way in applies (schedule.json, schedule_batch.json,
``scrapyd-pgqueue enqueue``), and the ISpiderQueue message a job object of a batch becomes.

No Twisted here: the operator command uses it too. The web services turn ``RefusedJob`` into Scrapyd's JSON error.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.store import MAX_NAME_BYTES

# Jobs one schedule_batch.json request may carry (the command streams any number, in batches of this size).
MAX_BATCH_JOBS = 10_000
# The keys of a batch's job object.
JOB_KEYS = {"spider", "priority", "jobid", "args", "settings", "version"}


class RefusedJob(ValueError):
    """The job cannot be queued or cannot run as asked; the message says why."""


# Linux refuses to start a process with one command-line argument longer than this (MAX_ARG_STRLEN, the NUL
# included): a spider argument or setting ``name=value`` that long can never be passed to the crawl.
MAX_CRAWL_ARGUMENT_BYTES = 131072 - 1
# All spider arguments and settings together; the whole command line and the environment share ARG_MAX (2 MiB).
MAX_CRAWL_ARGUMENTS_TOTAL_BYTES = 1024 * 1024
# A job id names the job's log file, <jobid>.log, and file names are at most 255 bytes.
MAX_JOB_ID_BYTES = 200
# Form fields schedule.json reads itself; every other field is a spider argument.
SCHEDULE_PARAMETERS = {"project", "spider", "_version", "jobid", "priority", "setting"}
# Keys the job's message uses for itself: a spider argument of that name would clash with them.
RESERVED_ARGUMENTS = {"name", "settings", "_job", "_project", "_spider"}


def _shown(value: str, limit: int = 100) -> str:
    """A value for an error message: quoted, and cut short when long."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def check_form(args: dict[bytes, list[bytes]]) -> None:
    """Refuse (RefusedJob) a schedule.json request, as Twisted parsed its form, that cannot become a runnable job."""
    fields = {}
    for raw_name, raw_values in args.items():
        try:
            name = raw_name.decode()
            values = [value.decode() for value in raw_values]
        except UnicodeDecodeError:
            raise RefusedJob(f"{_shown(raw_name.decode(errors='replace'))} is not valid UTF-8") from None
        fields[name] = values
    check_fields(fields)


def check_fields(fields: dict[str, list[str]]) -> None:
    """Refuse (RefusedJob) a job given as schedule.json's fields (decoded) that cannot become a runnable job."""
    for name, values in fields.items():
        if "\x00" in name or any("\x00" in value for value in values):
            raise RefusedJob(f"{_shown(name)} may not contain NUL characters")
    for name in ("project", "spider", "_version"):
        for value in fields.get(name, []):
            if len(value.encode()) > MAX_NAME_BYTES:
                raise RefusedJob(f"{name} is longer than {MAX_NAME_BYTES} bytes")
    for jobid in fields.get("jobid", []):
        if not jobid:
            raise RefusedJob("jobid may not be empty")
        if "/" in jobid:
            raise RefusedJob("jobid may not contain '/': it names the job's log file")
        if len(jobid.encode()) > MAX_JOB_ID_BYTES:
            raise RefusedJob(f"jobid is longer than {MAX_JOB_ID_BYTES} bytes: it names the job's log file")
    for priority in fields.get("priority", [])[:1]:
        try:
            number = float(priority)
        except ValueError:
            continue  # Scrapyd's own check answers "priority is invalid: ..."
        if not math.isfinite(number):
            raise RefusedJob(f"priority must be a finite number, not {_shown(priority)}")

    # What the crawl's command line will carry: -s NAME=VALUE for each setting, -a NAME=VALUE for each argument.
    pairs = []
    for setting in fields.get("setting", []):
        if "=" not in setting:
            raise RefusedJob(f"setting must be NAME=VALUE, not {_shown(setting)}")
        pairs.append(("setting", setting))
    for name, values in fields.items():
        if name in SCHEDULE_PARAMETERS:
            continue
        if name in RESERVED_ARGUMENTS:
            raise RefusedJob(f"{_shown(name)} is reserved and cannot be a spider argument")
        if not name or "=" in name:
            raise RefusedJob(f"spider argument names may not be empty or contain '=', not {_shown(name)}")
        pairs.append((f"argument {_shown(name)}", f"{name}={values[0]}"))
    total = 0
    for what, pair in pairs:
        size = len(pair.encode())
        if size > MAX_CRAWL_ARGUMENT_BYTES:
            raise RefusedJob(
                f"{what} is {size} bytes long; a crawl's command line takes at most {MAX_CRAWL_ARGUMENT_BYTES} "
                "bytes per argument"
            )
        total += size
    if total > MAX_CRAWL_ARGUMENTS_TOTAL_BYTES:
        raise RefusedJob(
            f"spider arguments and settings are {total} bytes long together; at most "
            f"{MAX_CRAWL_ARGUMENTS_TOTAL_BYTES} are accepted"
        )


@dataclass(frozen=True)
class JobRequest:
    """One job of a batch, checked: what to enqueue."""

    spider: str
    version: str | None
    priority: float
    message: dict[str, Any]  # as schedule.json makes it: spider arguments, name, _job, settings, _version


def job_from_json(job: Any) -> JobRequest:
    """A batch's job object ({"spider", "priority", "jobid", "args", "settings", "version"}) checked by the same
    rules as schedule.json's fields, as the message schedule.json would have queued."""
    if not isinstance(job, dict):
        raise RefusedJob(f"a job must be a JSON object, not {type(job).__name__}")
    unknown = sorted(set(job) - JOB_KEYS)
    if unknown:
        raise RefusedJob(f"unknown keys {unknown}: a job has {sorted(JOB_KEYS)}")
    spider = _text("spider", job.get("spider"))
    version = None if job.get("version") is None else _text("version", job["version"])
    jobid = uuid.uuid1().hex if job.get("jobid") is None else _text("jobid", job["jobid"])
    priority = job.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not math.isfinite(priority):
        raise RefusedJob(f"priority must be a finite number, not {_shown(str(priority))}")
    args = _strings("args", job.get("args", {}))
    settings = _strings("settings", job.get("settings", {}))
    fields = {"spider": [spider], "jobid": [jobid], "setting": [f"{name}={value}" for name, value in settings.items()]}
    if version is not None:
        fields["_version"] = [version]
    for name, value in args.items():
        if name in SCHEDULE_PARAMETERS:
            raise RefusedJob(f"{_shown(name)} is a field of the job, not a spider argument")
        fields[name] = [value]
    check_fields(fields)
    message = {**args, "name": spider, "_job": jobid, "settings": settings}
    if version is not None:
        message["_version"] = version
    return JobRequest(spider, version, float(priority), message)


def _text(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise RefusedJob(f"{what} must be a non-empty string")
    return value


def _strings(what: str, values: Any) -> dict[str, str]:
    """Spider arguments or settings: names to strings (numbers and booleans are written as schedule.json would)."""
    if not isinstance(values, dict):
        raise RefusedJob(f"{what} must be a JSON object of names to values")
    strings = {}
    for name, value in values.items():
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (int, float)) and math.isfinite(value):
            value = str(value)
        elif not isinstance(value, str):
            raise RefusedJob(f"{what} {_shown(name)} must be a string or a number")
        strings[name] = value
    return strings
