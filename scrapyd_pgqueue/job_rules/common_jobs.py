"""The fast path of a job object in its common form: a spider, a job id, a priority, string arguments and settings,
maybe a version, a delay or a unique key (most lines of a bulk schedule).

msgspec decodes such an object into ``CommonJob`` in C, types checked as it goes; the same rules as
``job_requests.job_from_json`` then apply, by the same functions, without the type checks a JSON value of any shape
needs. Anything else (another key, a number or boolean where text goes, a value a rule refuses) takes the general
path, which gives every refusal its one message: the fast path never refuses a job itself, and a job it takes
comes out exactly as the general path makes it (tests/test_job_rules_common_jobs.py checks both on random objects).
"""

from __future__ import annotations

import uuid

import msgspec

from scrapyd_pgqueue.job_rules.checks import MAX_NAME_BYTES
from scrapyd_pgqueue.job_rules.job_requests import (
    MAX_DELAY_SECONDS,
    SCHEDULE_PARAMETERS,
    JobRequest,
    RefusedJob,
    _default_options,
    check_crawl_arguments,
    check_jobid,
    check_name_length,
    check_priority,
    job_from_json,
    parse_json,
)
from scrapyd_pgqueue.job_rules.options import ON_CONFLICT, JobOptions

# Priorities the fast path takes: decoded as a float, an integer beyond 2 ** 52 may have been rounded before the
# priority rule saw it (the general path sees the integer itself).
MAX_FAST_PRIORITY = 2.0 ** 52


class CommonJob(msgspec.Struct, forbid_unknown_fields=True):
    """A job object of a batch or a line in its common form."""

    spider: str
    jobid: str | None = None
    priority: float = 0.0
    args: dict[str, str] = {}
    settings: dict[str, str] = {}
    version: str | None = None
    delay: float | None = None
    unique_key: str | None = None
    on_conflict: str | msgspec.UnsetType = msgspec.UNSET  # null is refused, where a missing value is the default


class CommonBatch(msgspec.Struct):
    """A schedule_batch.json body whose jobs are all in the common form (other keys of the body are ignored, as
    the general path ignores them)."""

    project: str
    jobs: list[CommonJob]


class SpiderOfJob(msgspec.Struct):
    """What a node checks of a job before it is stored: its spider in its version (the rest is skipped unread)."""

    spider: str
    version: str | None = None


class BatchOutline(msgspec.Struct):
    """A schedule_batch.json body as far as the node checks it before its jobs are read."""

    project: str
    jobs: list[SpiderOfJob]


class NotCommon(Exception):
    """A job of a batch is not in the common form: the general path must read the batch."""


_DECODER = msgspec.json.Decoder(CommonJob)
_BATCH_DECODER = msgspec.json.Decoder(CommonBatch)
_OUTLINE_DECODER = msgspec.json.Decoder(BatchOutline)


def job_from_json_text(document: str | bytes, default_retries: int = 0, default_tags: str | None = None
                       ) -> JobRequest:
    """The job object ``document`` (JSON text) as ``job_requests.job_from_json`` makes it (RefusedJob, or
    ValueError for text that is not JSON, when it is not a job); ``default_tags``: the "tags" of an object without
    its own, as if it held them (the enqueue command's --tags)."""
    try:
        request = common_job_request(_DECODER.decode(document), default_retries, default_tags)
    except (msgspec.ValidationError, msgspec.DecodeError):
        request = None
    if request is not None:
        return request
    job = parse_json(document)
    if default_tags is not None and isinstance(job, dict):
        job.setdefault("tags", default_tags)
    return job_from_json(job, default_retries)


def common_batch(document: bytes, default_retries: int = 0) -> tuple[str, list[JobRequest]] | None:
    """A batch body's project and jobs, each as job_from_json makes it, where every job takes the fast path; else
    None (the general path then reads the body and says what is wrong with it)."""
    try:
        batch = _BATCH_DECODER.decode(document)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    requests = []
    for job in batch.jobs:
        request = common_job_request(job, default_retries)
        if request is None:
            return None
        requests.append(request)
    return (batch.project, requests) if requests else None


def batch_outline(document: bytes) -> BatchOutline | None:
    """A batch body's project and each job's spider and version, a tenth of the time of reading it whole; None
    where the body is not that shape (the general path then says what is wrong)."""
    try:
        return _OUTLINE_DECODER.decode(document)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


class CommonJobs:
    """A batch body's jobs as (message, priority, options), each made as it is read (the store checks each as the
    database stores the ones before it); NotCommon at the first job the fast path does not take (``common_batch``
    for the same body returns None then)."""

    def __init__(self, document: bytes, default_retries: int = 0):
        try:
            self.jobs = _BATCH_DECODER.decode(document).jobs
        except (msgspec.ValidationError, msgspec.DecodeError):
            raise NotCommon from None
        self.default_retries = default_retries

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self):
        for job in self.jobs:
            request = common_job_request(job, self.default_retries)
            if request is None:
                raise NotCommon
            yield request.message, request.priority, request.options


def common_job_request(job: CommonJob, default_retries: int = 0, default_tags: str | None = None
                       ) -> JobRequest | None:
    """``job`` as the JobRequest job_from_json makes of it (given ``default_tags`` as its "tags": a common object
    has none of its own), or None where the general path must decide."""
    try:
        spider, version = job.spider, job.version
        jobid = uuid.uuid1().hex if job.jobid is None else job.jobid
        if not _plain_name(spider) or (version is not None and not _plain_name(version)) or "\x00" in jobid:
            return None
        check_jobid(jobid)
        if not -MAX_FAST_PRIORITY <= job.priority <= MAX_FAST_PRIORITY:
            return None
        priority = check_priority(job.priority)
        args, settings = job.args, job.settings
        for name, value in args.items():
            if name in SCHEDULE_PARAMETERS or "\x00" in name or "\x00" in value:
                return None
        pairs = [f"{name}={value}" for name, value in settings.items()]
        if any("\x00" in pair for pair in pairs):
            return None
        check_crawl_arguments(pairs, args)
        options = _default_options(default_retries, default_tags)
        if job.delay is not None or job.unique_key is not None or job.on_conflict is not msgspec.UNSET:
            options = _options(job, options)
            if options is None:
                return None
    except RefusedJob:
        return None
    message = {**args, "name": spider, "_job": jobid, "settings": settings}
    if version is not None:
        message["_version"] = version
    return JobRequest(spider, version, priority, message, options)


def _plain_name(name: str) -> bool:
    """A spider or version name that job_requests' name rule takes (non-empty, no NUL, fits the indexes)."""
    try:
        check_name_length("name", name)
    except RefusedJob:
        return False
    return bool(name) and "\x00" not in name


def _options(job: CommonJob, default):
    """The default options with ``job``'s delay, unique key and on_conflict, or None where the general path must
    decide."""
    delay, key = job.delay, job.unique_key
    on_conflict = default.on_conflict if job.on_conflict is msgspec.UNSET else job.on_conflict
    if (delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS) or on_conflict not in ON_CONFLICT:
        return None
    if key is not None and (not key or "\x00" in key or len(key) * 4 > MAX_NAME_BYTES):
        return None
    return JobOptions(delay=delay, unique_key=key, on_conflict=on_conflict, retries=default.retries,
                      tags=default.tags)
