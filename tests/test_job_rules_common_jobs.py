"""The fast path of the common job object: whatever the object, it gives what the general path gives (the same
request, or the same refusal), and it does take the common lines of a bulk schedule."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapyd_pgqueue.job_rules.common_jobs import (
    CommonJob,
    CommonJobs,
    NotCommon,
    batch_outline,
    common_batch,
    common_job_request,
    job_from_json_text,
)
from scrapyd_pgqueue.job_rules.job_requests import MAX_DELAY_SECONDS, RefusedJob, job_from_json, parse_json

# Values near every rule's edges: empty, NUL, '/', '=', reserved names, long text, non-text where text goes.
TEXTS = st.one_of(
    st.sampled_from(["", "a", "s", "x/y", "a=b", "\x00", "name", "_job", "settings", "priority", "jobid",
                     "é" * 300, "k" * 1001, "u" * 60_000]),
    st.text(max_size=12),
)
VALUES = st.one_of(TEXTS, st.integers(-10, 10), st.floats(allow_nan=False), st.booleans(), st.none(),
                   st.just(2 ** 53 + 1), st.just(2 ** 52), st.just(MAX_DELAY_SECONDS + 1), st.just([]))
FIELDS = ("spider", "jobid", "priority", "args", "settings", "version", "delay", "unique_key", "on_conflict",
          "retries", "colour")
# A common job with one to three fields changed or left out: most objects are then one rule away from valid.
COMMON = {"spider": "s", "jobid": "j", "priority": 1, "args": {"url": "u"}, "settings": {"S": "1"}, "version": "v",
          "delay": 10, "unique_key": "k", "on_conflict": "keep"}
CHANGES = st.dictionaries(st.sampled_from(FIELDS), st.one_of(
    VALUES, st.dictionaries(TEXTS, VALUES, max_size=3), st.sampled_from(["replace", "keep", "error", "omit"])),
    min_size=1, max_size=3)
JOB_OBJECTS = st.builds(
    lambda base, changes: {name: value for name, value in {**base, **changes}.items() if value != "omit"},
    st.sampled_from([COMMON, {"spider": "s"}, {"spider": "s", "unique_key": "k"}]), CHANGES)


def _outcome(make):
    try:
        request = make()
    except (RefusedJob, ValueError) as e:
        return "refused", str(e)
    if request.message.get("_job") is not None:
        return request
    return request._replace(message={**request.message, "_job": None})  # a job id made for the job: random


@settings(max_examples=1500, deadline=None)
@given(JOB_OBJECTS)
def test_the_fast_path_gives_what_the_general_path_gives(job):
    if "jobid" not in job or job["jobid"] is None:
        job = {**job, "jobid": "fixed"}  # both paths would make a random id
    text = json.dumps(job)
    assert _outcome(lambda: job_from_json_text(text)) == _outcome(lambda: job_from_json(parse_json(text)))


@settings(max_examples=500, deadline=None)
@given(JOB_OBJECTS, st.sampled_from(["gpu", "gpu,eu", " eu , gpu ", "", ",", "bad tag!", "x" * 64]))
def test_with_default_tags_the_fast_path_gives_what_the_general_path_gives(job, tags):
    """The enqueue command's --tags: the tags of every line without its own "tags", a bad one refused alike."""
    job = {**job, "jobid": "fixed"} if job.get("jobid") is None else job
    text = json.dumps(job)

    def general():
        given = parse_json(text)
        if isinstance(given, dict):
            given.setdefault("tags", tags)
        return job_from_json(given)

    assert _outcome(lambda: job_from_json_text(text, default_tags=tags)) == _outcome(general)


@pytest.mark.parametrize("line", [
    {"spider": "sleeper", "jobid": "j-1", "priority": 2, "args": {"url": "https://e.x/1"}},
    {"spider": "sleeper", "jobid": "j-2", "unique_key": "k-2", "args": {"url": "https://e.x/2"}},
    {"spider": "sleeper", "jobid": "j-3", "delay": 3600, "settings": {"DOWNLOAD_DELAY": "1"}},
    {"spider": "sleeper", "jobid": "j-4", "unique_key": "k-4", "on_conflict": "replace", "version": "r7"},
])
def test_the_common_lines_of_a_bulk_schedule_take_the_fast_path(line):
    request = common_job_request(msgspec.json.decode(json.dumps(line), type=CommonJob))
    assert request is not None
    assert request == job_from_json(line)


@settings(max_examples=300, deadline=None)
@given(st.lists(JOB_OBJECTS, min_size=1, max_size=4))
def test_a_batch_read_job_by_job_gives_what_it_gives_read_whole(jobs):
    """CommonJobs (the COPY helper's reading, a job as the store takes it) yields common_batch's jobs, or stops at
    NotCommon where common_batch leaves the body to the general path."""
    jobs = [{**job, "jobid": f"fixed-{index}"} for index, job in enumerate(jobs)]  # no random job ids
    document = json.dumps({"project": "p", "jobs": jobs}).encode()
    whole = common_batch(document)
    try:
        one_by_one = list(CommonJobs(document))
    except NotCommon:
        one_by_one = None
    assert one_by_one == (None if whole is None else [(job.message, job.priority, job.options) for job in whole[1]])
    outline = batch_outline(document)
    if whole is not None:  # what the node checks before the helper reads the batch
        assert (outline.project, [(job.spider, job.version) for job in outline.jobs]) == \
            ("p", [(job.spider, job.version) for job in whole[1]])
