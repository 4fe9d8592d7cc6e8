"""What a client may ask to schedule: the rules every way in applies (schedule.json, schedule_batch.json,
``scrapyd-pgqueue enqueue``), and the ISpiderQueue message a job object of a batch becomes.

No Twisted here: the operator command uses it too. The web services turn ``RefusedJob`` into Scrapyd's JSON error.
"""

from __future__ import annotations

import datetime
import functools
import json
import math
import uuid
from typing import Any, NamedTuple

import msgspec

from scrapyd_pgqueue.job_rules.checks import MAX_NAME_BYTES, InvalidJobError, is_finite
from scrapyd_pgqueue.job_rules.checks import check_priority as priority_rule
from scrapyd_pgqueue.job_rules.options import NO_OPTIONS, ON_CONFLICT, UNIQUE_SCOPES, JobOptions
from scrapyd_pgqueue.tags import InvalidTagsError, parse_tags

# Jobs one schedule_batch.json request may carry (the command streams any number, in batches of this size).
MAX_BATCH_JOBS = 10_000
# schedule.json's scheduling fields and the batch job object's keys for them (JobOptions); never spider arguments.
OPTION_FIELDS = {
    "_run_at": "run_at",
    "_delay": "delay",
    "_unique_key": "unique_key",
    "_on_conflict": "on_conflict",
    "_retries": "retries",
    "_retry_delay": "retry_delay",
    "_parent": "parent",
    "_unique_scope": "unique_scope",
    "_on_complete": "on_complete",
    "_on_complete_args": "on_complete_args",
    "_max_runtime": "max_runtime",
    "_stall_timeout": "stall_timeout",
    "_tags": "tags",
    "_workers": "workers",
    "_join": "join",
}
# The keys of a batch's job object (a crawl of several workers is schedule.json's alone).
JOB_KEYS = {"spider", "priority", "jobid", "args", "settings", "version", *OPTION_FIELDS.values()} - {"workers", "join"}
# Retries and delays beyond these are mistakes, not plans (2 ** 30 backoffs overflow any interval).
MAX_RETRIES = 30
MAX_DELAY_SECONDS = 10 * 365 * 86400
# run_at as Unix seconds: 1970-01-01 to 9999-12-31 (Python's last year; the API answers due times as ISO 8601).
RUN_AT_RANGE = (0, 253402300799)


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
SCHEDULE_PARAMETERS = {"project", "spider", "_version", "jobid", "priority", "setting", *OPTION_FIELDS}
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
            check_name_length(name, value)
    for jobid in fields.get("jobid", []):
        check_jobid(jobid)
    for priority in fields.get("priority", [])[:1]:
        try:
            number = float(priority)
        except ValueError:
            continue  # Scrapyd's own check answers "priority is invalid: ..."
        check_priority(number)
    for setting in fields.get("setting", []):
        if "=" not in setting:
            raise RefusedJob(f"setting must be NAME=VALUE, not {_shown(setting)}")
    arguments = {name: values[0] for name, values in fields.items() if name not in SCHEDULE_PARAMETERS}
    check_crawl_arguments(fields.get("setting", []), arguments)
    options_from_fields({name: values[0] for name, values in fields.items() if name in OPTION_FIELDS})


def check_name_length(name: str, value: str) -> None:
    """A project, spider or version fits the row's indexes (4 bytes a character at most: most need no encoding)."""
    if len(value) * 4 > MAX_NAME_BYTES and len(value.encode()) > MAX_NAME_BYTES:
        raise RefusedJob(f"{name} is longer than {MAX_NAME_BYTES} bytes")


def check_jobid(jobid: str) -> None:
    """A job id names the job's log file."""
    if not jobid:
        raise RefusedJob("jobid may not be empty")
    if "/" in jobid:
        raise RefusedJob("jobid may not contain '/': it names the job's log file")
    if len(jobid) * 4 > MAX_JOB_ID_BYTES and len(jobid.encode()) > MAX_JOB_ID_BYTES:
        raise RefusedJob(f"jobid is longer than {MAX_JOB_ID_BYTES} bytes: it names the job's log file")


def check_crawl_arguments(settings: list[str], arguments: dict[str, str]) -> None:
    """What the crawl's command line will carry, -s NAME=VALUE for each setting and -a NAME=VALUE for each spider
    argument, fits a command line; an argument's name is neither reserved nor empty nor holds '='."""
    characters = sum(len(setting) for setting in settings) + sum(len(n) + len(v) + 1 for n, v in arguments.items())
    if characters * 4 <= MAX_CRAWL_ARGUMENT_BYTES and all(
            name and "=" not in name and name not in RESERVED_ARGUMENTS for name in arguments):
        return  # most jobs: even at 4 bytes a character, all of it fits in one argument
    total = 0
    for argument, pair in _command_line_pairs(settings, arguments):
        size = len(pair) if len(pair) * 4 <= MAX_CRAWL_ARGUMENT_BYTES else len(pair.encode())
        if size > MAX_CRAWL_ARGUMENT_BYTES:
            what = "setting" if argument is None else f"argument {_shown(argument)}"
            raise RefusedJob(
                f"{what} is {size} bytes long; a crawl's command line takes at most {MAX_CRAWL_ARGUMENT_BYTES} "
                "bytes per argument"
            )
        total += size
    if total * 4 > MAX_CRAWL_ARGUMENTS_TOTAL_BYTES:  # characters counted: bytes only where they might matter
        total = sum(len(pair.encode()) for _, pair in _command_line_pairs(settings, arguments))
        if total > MAX_CRAWL_ARGUMENTS_TOTAL_BYTES:
            raise RefusedJob(
                f"spider arguments and settings are {total} bytes long together; at most "
                f"{MAX_CRAWL_ARGUMENTS_TOTAL_BYTES} are accepted"
            )


def _command_line_pairs(settings: list[str], arguments: dict[str, str]):
    """(the argument's name, None for a setting; NAME=VALUE) of each setting and spider argument."""
    for setting in settings:
        yield None, setting
    for name, value in arguments.items():
        if name in RESERVED_ARGUMENTS:
            raise RefusedJob(f"{_shown(name)} is reserved and cannot be a spider argument")
        if not name or "=" in name:
            raise RefusedJob(f"spider argument names may not be empty or contain '=', not {_shown(name)}")
        yield name, f"{name}={value}"


class JobRequest(NamedTuple):
    """One job of a batch, checked: what to enqueue (a tuple: a million are made in seconds)."""

    spider: str
    version: str | None
    priority: float
    message: dict[str, Any]  # as schedule.json makes it: spider arguments, name, _job, settings, _version
    options: JobOptions = NO_OPTIONS


def check_priority(priority: Any) -> float:
    """The priority rule of every way in (``checks.check_priority``), refusing with RefusedJob."""
    try:
        return priority_rule(priority)
    except InvalidJobError as e:
        raise RefusedJob(str(e)) from None


def options_from_fields(fields: dict[str, str], default_retries: int = 0) -> JobOptions:
    """The scheduling fields of schedule.json (``_run_at``, ``_delay``, ...; RefusedJob when invalid)."""
    return _options({key: fields[name] for name, key in OPTION_FIELDS.items() if name in fields}, default_retries)


def _options(given: dict[str, Any], default_retries: int) -> JobOptions:
    """JobOptions from the options' values by key (strings from a form, or JSON values from a batch)."""
    if given.get("run_at") is not None and given.get("delay") is not None:
        raise RefusedJob("give run_at or delay, not both")
    on_conflict = given.get("on_conflict", ON_CONFLICT[0])
    if on_conflict not in ON_CONFLICT:
        raise RefusedJob(f"on_conflict must be one of {', '.join(ON_CONFLICT)}, not {_shown(str(on_conflict))}")
    unique_key = given.get("unique_key")
    if unique_key is not None:
        unique_key = _text("unique_key", unique_key)
        if len(unique_key.encode()) > MAX_NAME_BYTES:
            raise RefusedJob(f"unique_key is longer than {MAX_NAME_BYTES} bytes")
    retries = default_retries if given.get("retries") is None else _number("retries", given["retries"], integer=True)
    if not 0 <= retries <= MAX_RETRIES:
        raise RefusedJob(f"retries must be between 0 and {MAX_RETRIES}, not {retries}")
    delay = None if given.get("delay") is None else _number("delay", given["delay"])
    retry_delay = 0.0 if given.get("retry_delay") is None else _number("retry_delay", given["retry_delay"])
    for what, seconds in (("delay", delay), ("retry_delay", retry_delay)):
        if seconds is not None and not 0 <= seconds <= MAX_DELAY_SECONDS:
            raise RefusedJob(f"{what} must be between 0 and {MAX_DELAY_SECONDS} seconds, not {seconds}")
    run_at = None if given.get("run_at") is None else _run_at(given["run_at"])
    workers = None if given.get("workers") is None else _number("workers", given["workers"], integer=True)
    if workers is not None and workers < 1:
        raise RefusedJob(f"workers must be at least 1, not {workers}")
    return JobOptions(
        run_at, delay, unique_key, on_conflict, int(retries), float(retry_delay or 0), **_tree_options(given),
        **watchdog_limits(given), tags=required_tags(given.get("tags")),
        workers=None if workers is None else int(workers),
        join=None if given.get("join") is None else _text("join", given["join"]),
    )


def required_tags(given: Any) -> tuple[str, ...] | None:
    """The tags a job requires (a comma-separated string, or a JSON list of strings), checked and sorted; None when
    not given (its spider's route applies); an empty string or list requires none, whatever the route."""
    if given is None:
        return None
    try:
        return parse_tags(given)
    except InvalidTagsError as e:
        raise RefusedJob(f"_tags: {e}") from None


def watchdog_limits(given: dict[str, Any]) -> dict[str, float | None]:
    """max_runtime and stall_timeout (seconds, from a form's text or JSON numbers; None when not given)."""
    limits = {}
    for what in ("max_runtime", "stall_timeout"):
        seconds = None if given.get(what) in (None, "") else _number(what, given[what])
        if seconds is not None and not 0 < seconds <= MAX_DELAY_SECONDS:
            raise RefusedJob(f"{what} must be more than 0 and at most {MAX_DELAY_SECONDS} seconds, not {seconds:g}")
        limits[what] = seconds
    return limits


def _tree_options(given: dict[str, Any]) -> dict[str, Any]:
    """parent, unique_scope, on_complete and on_complete_args (a JSON object, or its text from a form)."""
    parent = None if given.get("parent") is None else _text("parent", given["parent"])
    scope = given.get("unique_scope", UNIQUE_SCOPES[0])
    if scope not in UNIQUE_SCOPES:
        raise RefusedJob(f"unique_scope must be one of {', '.join(UNIQUE_SCOPES)}, not {_shown(str(scope))}")
    if scope == "tree" and given.get("unique_key") is None:
        raise RefusedJob("unique_scope tree needs a unique_key (the key of this job in its tree: its parent's, or "
                         "the tree a root starts)")
    on_complete = None if given.get("on_complete") is None else _text("on_complete", given["on_complete"])
    if on_complete is not None and parent is not None:
        raise RefusedJob("on_complete belongs on a root (a job without a parent): its tree is its parent's")
    args = given.get("on_complete_args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            raise RefusedJob(f"on_complete_args must be a JSON object, not {_shown(args)}") from None
    if args is not None:
        if on_complete is None:
            raise RefusedJob("on_complete_args goes with on_complete")
        args = _strings("on_complete_args", args)
    return {"parent": parent, "unique_scope": scope, "on_complete": on_complete, "on_complete_args": args}


def parse_run_at(value: Any) -> float:
    """A time as Unix seconds: ISO 8601 with its UTC offset ("2026-11-23T14:00:00+01:00", "...Z"), or Unix seconds."""
    if isinstance(value, str):
        try:
            return _number("run_at", value)
        except RefusedJob:
            pass
        try:
            moment = datetime.datetime.fromisoformat(value)
        except ValueError:
            raise RefusedJob(f"run_at must be ISO 8601 with an offset or Unix seconds, not {_shown(value)}") from None
        if moment.tzinfo is None:
            raise RefusedJob(f"run_at needs a UTC offset (+00:00 or Z): {_shown(value)}")
        return moment.timestamp()
    return _number("run_at", value)


def _run_at(value: Any) -> float:
    seconds = parse_run_at(value)
    if not RUN_AT_RANGE[0] <= seconds <= RUN_AT_RANGE[1]:
        raise RefusedJob(f"run_at must be between 1970-01-01 and 9999-12-31, not {_shown(str(value))}")
    return seconds


def _number(what: str, value: Any, integer: bool = False) -> float:
    """A finite number from a form's string or a JSON number (an integer where ``integer``)."""
    if isinstance(value, bool):
        raise RefusedJob(f"{what} must be a number, not {_shown(str(value))}")
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            raise RefusedJob(f"{what} must be {'an integer' if integer else 'a number'}, not {_shown(value)}") from None
    if not isinstance(value, (int, float)) or not is_finite(value) or (integer and value != int(value)):
        raise RefusedJob(f"{what} must be {'an integer' if integer else 'a finite number'}, not {_shown(str(value))}")
    return int(value) if integer else float(value)


def job_from_json(job: Any, default_retries: int = 0) -> JobRequest:
    """A batch's job object ({"spider", "priority", "jobid", "args", "settings", "version"}) checked by the same
    rules as schedule.json's fields, as the message schedule.json would have queued."""
    if not isinstance(job, dict):
        raise RefusedJob(f"a job must be a JSON object, not {type(job).__name__}")
    if not job.keys() <= JOB_KEYS:
        raise RefusedJob(f"unknown keys {sorted(set(job) - JOB_KEYS)}: a job has {sorted(JOB_KEYS)}")
    spider = _name("spider", job.get("spider"))
    version = None if job.get("version") is None else _name("_version", job["version"])
    jobid = uuid.uuid1().hex if job.get("jobid") is None else _text("jobid", job["jobid"])
    _no_nul("jobid", jobid)
    check_jobid(jobid)
    priority = check_priority(job.get("priority", 0))
    args = _strings("args", job.get("args", {}))
    settings = _strings("settings", job.get("settings", {}))
    for name, value in args.items():
        if name in SCHEDULE_PARAMETERS:
            raise RefusedJob(f"{_shown(name)} is a field of the job, not a spider argument")
        _no_nul(name, name + value)
    pairs = [f"{name}={value}" for name, value in settings.items()]
    for pair in pairs:
        _no_nul("setting", pair)
    check_crawl_arguments(pairs, args)
    given = {key: job[key] for key in OPTION_FIELDS.values() if key in job}
    options = _options(given, default_retries) if given else _default_options(default_retries)
    message = {**args, "name": spider, "_job": jobid, "settings": settings}
    if version is not None:
        message["_version"] = version
    return JobRequest(spider, version, priority, message, options)


@functools.lru_cache(maxsize=8)
def _default_options(default_retries: int, tags: str | None = None) -> JobOptions:
    """The options of a job that gives none (most of a bulk schedule's), or only ``tags``: worked out once."""
    return _options({} if tags is None else {"tags": tags}, default_retries)


def _name(what: str, value: Any) -> str:
    """A spider or version name: a non-empty string without NUL that fits the row's indexes."""
    value = _text(what.lstrip("_"), value)
    _no_nul(what, value)
    check_name_length(what, value)
    return value


def _no_nul(what: str, value: str) -> None:
    if "\x00" in value:
        raise RefusedJob(f"{_shown(what)} may not contain NUL characters")


def parse_json(document: str | bytes) -> Any:
    """A JSON document exactly as ``json.loads`` reads it (integers of any size, NaN, Infinity; its errors), parsed
    by msgspec, several times faster, where msgspec can (all but those numbers and malformed documents)."""
    try:
        return _DECODER.decode(document)
    except msgspec.DecodeError:
        return json.loads(document)


_DECODER = msgspec.json.Decoder()


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
        elif isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
            value = str(value)
        elif not isinstance(value, str):
            raise RefusedJob(f"{what} {_shown(name)} must be a string or a number")
        strings[name] = value
    return strings
