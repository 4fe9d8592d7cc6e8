"""Bad input through the HTTP API of a running node and through the Python API.

Every refusal is Scrapyd's JSON error ({"status": "error", "message": ..., "node_name": ...}) with a plain
message, never an HTTP 500 and never a second row; jobs already queued are neither lost nor altered. The
fuzzing (hypothesis) posts raw bytes over real HTTP to a node that claims nothing, so every job it accepts stays
in the table to be checked.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.parse
import urllib.request
import uuid

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from scrapyd.config import Config
from sqlalchemy import make_url

from helpers import connect, wait_for
from scrapyd_pgqueue import PostgresSpiderQueue
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.local.cluster import LocalCluster
from scrapyd_pgqueue.node.copy_writer import COPY_MIN_JOBS
from scrapyd_pgqueue.store import DuplicateJobError, JobStore

SQL_METACHARACTERS = ["'", '"', "';--", "'; DROP TABLE spider_job; --", "%", "_", "\\", "$1", "::text", "/*", "*/"]
# A message that starts with an exception's class name is not Scrapyd's style for a refused request.
CLASS_NAME_PREFIX = re.compile(r"^[A-Z]\w*(Error|Exception): ")


# --- a node that claims nothing ---------------------------------------------------------------------------------


def table(url) -> dict[int, tuple]:
    """Every row of spider_job by id, all columns; a running crawl's stats (its node writes them as it runs) as None."""
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT * FROM spider_job ORDER BY id")
        stats = [column.name for column in cursor.description].index("stats")
        return {row[0]: (*row[:stats], None, *row[stats + 1:]) for row in cursor.fetchall()}


@pytest.fixture(scope="module")
def queue_database(postgres_server):
    server_url, _ = postgres_server
    name = f"bad_input_{uuid.uuid4().hex[:10]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def node(queue_database, tmp_path_factory):
    """One real node that claims nothing more: its only slot runs an hour-long warm-up crawl for the whole module,
    so what it accepts stays pending. (Relying on a long poll interval alone raced with the node's start-up polls.)"""
    cluster = LocalCluster(queue_database, 1, directory=tmp_path_factory.mktemp("quiet"),
                           config={"poll_interval": "3600", "max_proc": "1"})
    with cluster:
        [node] = cluster.nodes
        warm_up = node.post("schedule.json", project="example", spider="sleeper", jobid="warm-up", seconds="3600")
        assert warm_up["status"] == "ok"
        wait_for(lambda: [job for job in node.get("listjobs.json")["running"] if job["pid"]], 60,
                 "the warm-up crawl to take the node's only slot")
        yield node


@pytest.fixture(scope="module")
def queued(queue_database, node):
    """Jobs already in the queue before any bad request: two pending, one running on another node."""
    store = JobStore.for_url(queue_database)
    store.enqueue("example", {"name": "sleeper", "_job": "running-1"}, priority=100)
    [running] = store.claim_next_jobs(["example"], 1, node="elsewhere", worker="w-elsewhere").jobs
    assert running.job == "running-1"
    store.enqueue("example", {"name": "sleeper", "_job": "pending-1", "seconds": "1"}, priority=3)
    store.enqueue("example", {"name": "quotes", "_job": "pending-2", "note": "it's; --"})
    return table(queue_database)


def form(*fields: tuple[str | bytes, str | bytes]) -> bytes:
    """A urlencoded body from raw fields: bytes are sent as they are (invalid UTF-8, NUL...)."""
    def encode(value):
        return urllib.parse.quote_from_bytes(value if isinstance(value, bytes) else value.encode(), safe="")
    return "&".join(f"{encode(name)}={encode(value)}" for name, value in fields).encode()


def post(node, endpoint, *fields):
    started = time.monotonic()
    response = requests.post(f"{node.url}{endpoint}", data=form(*fields), timeout=30,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert time.monotonic() - started < 10
    return response


def get(node, endpoint, *fields):
    response = requests.get(f"{node.url}{endpoint}?{form(*fields).decode()}", timeout=30)
    return response


def answer(response) -> dict:
    """The JSON of a Scrapyd answer, which must be an HTTP 200 with status and node_name."""
    assert response.status_code == 200, response.text
    data = json.loads(response.content)
    assert data["status"] in ("ok", "error"), data
    assert data["node_name"] == "node1"
    return data


def refused(response, expected: str) -> str:
    data = answer(response)
    assert data["status"] == "error", data
    message = data["message"]
    assert expected in message, message
    assert not CLASS_NAME_PREFIX.match(message), message
    return message


def unchanged(url, before):
    """Rows that existed before are all there, unchanged; returns the rows added since."""
    after = table(url)
    assert {row_id: after.get(row_id) for row_id in before} == before
    return {row_id: row for row_id, row in after.items() if row_id not in before}


# --- schedule.json ----------------------------------------------------------------------------------------------

BASE = [("project", "example"), ("spider", "sleeper")]
BAD_SCHEDULES = {
    "missing project": ([("spider", "sleeper")], "'project' parameter is required"),
    "unknown project": ([("project", "nope"), ("spider", "sleeper")], "project 'nope' not found"),
    "unknown spider": ([("project", "example"), ("spider", "nope")], "spider 'nope' not found"),
    "SQL in project": ([("project", "example'; DROP TABLE spider_job; --"), ("spider", "sleeper")], "not found"),
    "SQL in spider": ([("project", "example"), ("spider", "x' OR '1'='1")], "not found"),
    "priority abc": (BASE + [("priority", "abc")], "priority is invalid"),
    "priority NaN": (BASE + [("priority", "NaN")], "priority must be a finite number"),
    "priority inf": (BASE + [("priority", "inf")], "priority must be a finite number"),
    "priority -Infinity": (BASE + [("priority", "-Infinity")], "priority must be a finite number"),
    "1 MB argument": (BASE + [("big", "x" * 1024 * 1024)], "bytes per argument"),
    "9 arguments of 120 KB": (BASE + [(f"a{i}", "x" * 120_000) for i in range(9)], "at most 1048576 are accepted"),
    "1 MB setting": (BASE + [("setting", "X=" + "x" * 1024 * 1024)], "bytes per argument"),
    "NUL in an argument": (BASE + [("arg", "a\x00b")], "may not contain NUL characters"),
    "NUL in an argument name": (BASE + [("a\x00b", "1")], "may not contain NUL characters"),
    "NUL in jobid": (BASE + [("jobid", "j\x00")], "may not contain NUL characters"),
    "NUL in spider": ([("project", "example"), ("spider", "sleeper\x00")], "may not contain NUL characters"),
    "invalid UTF-8 in an argument": (BASE + [("arg", b"\xff\xfe")], "is not valid UTF-8"),
    "invalid UTF-8 in an argument name": (BASE + [(b"\xc3\x28", "1")], "is not valid UTF-8"),
    "invalid UTF-8 in project": ([("project", b"ex\xffample"), ("spider", "sleeper")], "is not valid UTF-8"),
    "invalid UTF-8 in jobid": (BASE + [("jobid", b"\xed\xa0\x80")], "is not valid UTF-8"),  # a UTF-8 surrogate
    "long project": ([("project", "p" * 5000), ("spider", "sleeper")], "project is longer than 1000 bytes"),
    "long spider": ([("project", "example"), ("spider", "s" * 5000)], "spider is longer than 1000 bytes"),
    "long jobid": (BASE + [("jobid", "j" * 201)], "jobid is longer than 200 bytes"),
    "long version": (BASE + [("_version", "v" * 5000)], "_version is longer than 1000 bytes"),
    "jobid with a path": (BASE + [("jobid", "../../etc/passwd")], "may not contain '/'"),
    "empty jobid": (BASE + [("jobid", "")], "jobid may not be empty"),
    "setting without =": (BASE + [("setting", "LOG_LEVEL")], "setting must be NAME=VALUE"),
    "argument called name": (BASE + [("name", "x")], "'name' is reserved"),
    "argument called _job": (BASE + [("_job", "x")], "'_job' is reserved"),
    "argument called settings": (BASE + [("settings", "x")], "'settings' is reserved"),
    "argument name with =": (BASE + [("a=b", "c")], "may not be empty or contain '='"),
    "pending job id": (BASE + [("jobid", "pending-1")], "job id 'pending-1' is already pending or running"),
    "running job id": (BASE + [("jobid", "running-1")], "job id 'running-1' is already pending or running"),
}


@pytest.mark.parametrize("case", list(BAD_SCHEDULES))
def test_schedule_refuses_bad_input_with_a_plain_json_error_and_leaves_the_queue_alone(
    case, node, queued, queue_database
):
    fields, expected = BAD_SCHEDULES[case]
    before = table(queue_database)
    refused(post(node, "schedule.json", *fields), expected)
    assert unchanged(queue_database, before) == {}


# --- schedule_batch.json ----------------------------------------------------------------------------------------

GOOD_JOB = {"spider": "sleeper", "args": {"seconds": "1"}}
BAD_BATCH_JOBS = {
    "unknown spider": ({"spider": "nope"}, "spider 'nope' not found"),
    "no spider": ({"args": {}}, "spider must be a non-empty string"),
    "unknown key": ({"spider": "sleeper", "arguments": {}}, "unknown keys ['arguments']"),
    "priority NaN": ({"spider": "sleeper", "priority": float("nan")}, "priority must be a finite number"),
    "priority text": ({"spider": "sleeper", "priority": "high"}, "priority must be a finite number"),
    "1 MB argument": ({"spider": "sleeper", "args": {"big": "x" * 1024 * 1024}}, "bytes per argument"),
    "NUL in an argument": ({"spider": "sleeper", "args": {"a": "a\x00b"}}, "may not contain NUL characters"),
    "argument called name": ({"spider": "sleeper", "args": {"name": "x"}}, "'name' is reserved"),
    "argument called jobid": ({"spider": "sleeper", "args": {"jobid": "x"}}, "is a field of the job"),
    "argument that is a list": ({"spider": "sleeper", "args": {"a": [1]}}, "must be a string or a number"),
    "jobid with a path": ({"spider": "sleeper", "jobid": "a/b"}, "may not contain '/'"),
    "pending job id": ({"spider": "sleeper", "jobid": "pending-1"}, "job id 'pending-1' is already pending"),
    "unknown version": ({"spider": "sleeper", "version": "9.9"}, "version '9.9' not found"),
    "not an object": (["sleeper"], "a job must be a JSON object"),
}


def post_batch(node, body) -> requests.Response:
    return requests.post(f"{node.url}schedule_batch.json", data=json.dumps(body), timeout=30,
                         headers={"Content-Type": "application/json"})


# Good jobs before the bad one: a small batch, which the node stores itself, and a big one, which its COPY helper
# reads and stores (node/copy_writer.py): the same refusal, word for word.
GOOD_BEFORE = pytest.mark.parametrize("good_before", [3, COPY_MIN_JOBS + 50], ids=["small batch", "COPY batch"])


@GOOD_BEFORE
@pytest.mark.parametrize("case", list(BAD_BATCH_JOBS))
def test_a_batch_with_one_bad_job_stores_nothing_and_names_the_job(case, good_before, node, queued, queue_database):
    bad, expected = BAD_BATCH_JOBS[case]
    before = table(queue_database)
    jobs = [dict(GOOD_JOB, jobid=f"batch-good-{i}") for i in range(good_before)] + [bad] + [dict(GOOD_JOB)]
    message = refused(post_batch(node, {"project": "example", "jobs": jobs}), expected)
    assert message.startswith(f"job {good_before}: "), message
    assert unchanged(queue_database, before) == {}


@GOOD_BEFORE
def test_a_batch_repeating_a_job_id_stores_nothing_and_names_both(good_before, node, queued, queue_database):
    before = table(queue_database)
    jobs = [dict(GOOD_JOB, jobid=f"twice-{i}") for i in range(good_before)] + [dict(GOOD_JOB, jobid="twice-1")]
    refused(post_batch(node, {"project": "example", "jobs": jobs}),
            f"job {good_before}: job id 'twice-1' is also job 1")
    assert unchanged(queue_database, before) == {}


@pytest.mark.parametrize("body, expected", [
    (b"not json", "the body must be a JSON object"),
    ({"project": "example"}, "with at least one job"),
    ({"project": "example", "jobs": []}, "with at least one job"),
    ({"project": "nope", "jobs": [GOOD_JOB]}, "project 'nope' not found"),
    ({"project": "example", "jobs": [GOOD_JOB] * 10_001}, "a batch takes at most 10000"),
    ({"project": "example", "jobs": [dict(GOOD_JOB, jobid="twice"), dict(GOOD_JOB, jobid="twice")]},
     "job 1: job id 'twice' is also job 0"),
])
def test_a_bad_batch_is_refused_whole(body, expected, node, queued, queue_database):
    before = table(queue_database)
    response = requests.post(f"{node.url}schedule_batch.json", timeout=30, headers={"Content-Type": "application/json"},
                             data=body if isinstance(body, bytes) else json.dumps(body))
    refused(response, expected)
    assert unchanged(queue_database, before) == {}


def test_a_batch_lands_whole_in_order_as_schedule_json_would_have_queued_it(node, queued, queue_database):
    before = table(queue_database)
    jobs = [
        {"spider": "sleeper", "jobid": "batch-a", "priority": 1, "args": {"seconds": 2, "flag": True}},
        {"spider": "quotes", "jobid": "batch-b", "settings": {"LOG_LEVEL": "INFO"}},
        {"spider": "sleeper", "jobid": "batch-c", "priority": 1},
        {"spider": "sleeper"},  # a job id is made, as schedule.json makes one
    ]
    data = answer(post_batch(node, {"project": "example", "jobs": jobs}))
    assert data["status"] == "ok", data
    assert data["jobids"][:3] == ["batch-a", "batch-b", "batch-c"] and len(data["jobids"][3]) == 32
    single = answer(post(node, "schedule.json", *BASE, ("jobid", "batch-single"), ("seconds", "2"), ("flag", "true"),
                         ("priority", "1")))
    assert single["status"] == "ok"
    added = unchanged(queue_database, before)
    assert len(added) == 5
    pending = {job["id"]: job for job in answer(get(node, "listjobs.json", ("pending_limit", "10000")))["pending"]}
    # The same job through either endpoint is the same pending job.
    assert {k: v for k, v in pending["batch-a"].items() if k != "id"} == {
        k: v for k, v in pending["batch-single"].items() if k != "id"}
    assert pending["batch-b"]["settings"] == {"LOG_LEVEL": "INFO"}
    order = [job_id for job_id in pending if job_id.startswith("batch-") and job_id != "batch-single"]
    assert order == ["batch-a", "batch-c", "batch-b"]  # priority first, then the batch's order


def test_a_big_batch_lands_as_a_small_one_would(node, queued, queue_database):
    """The COPY helper's rows are the node's statement's: each column, the order, delayed and unique jobs."""
    def jobs(prefix: str, count: int) -> list[dict]:
        made = [{"spider": "sleeper", "jobid": f"{prefix}-{i}", "priority": i % 3, "args": {"n": str(i)}}
                for i in range(count)]
        made[1].update(unique_key="same-key" if prefix == "small" else "other-key", delay=3600)
        made[2].update(settings={"LOG_LEVEL": "INFO"})
        return made

    before = table(queue_database)
    small, big = jobs("small", 3), jobs("big", COPY_MIN_JOBS + 20)
    for batch in (small, big):
        data = answer(post_batch(node, {"project": "example", "jobs": batch}))
        assert data["jobids"] == [job["jobid"] for job in batch]
    assert len(unchanged(queue_database, before)) == len(small) + len(big)
    with contextlib.closing(connect(queue_database)) as connection, connection.cursor() as cursor:
        cursor.execute("""
            SELECT job, spider, version, priority, message - '_job', status, unique_key IS NOT NULL, retries,
                   retry_delay, periodic, max_runtime, stall_timeout, pool,
                   round(extract(epoch FROM run_at - created_time)), created_time > now() - interval '1 minute'
            FROM spider_job WHERE job LIKE 'small-%' OR job LIKE 'big-%' ORDER BY id""")
        rows = {row[0]: row[1:] for row in cursor.fetchall()}
    assert list(rows) == [job["jobid"] for job in small + big]  # row ids in each batch's order
    for i in range(3):
        assert rows[f"big-{i}"] == rows[f"small-{i}"]


def test_sql_metacharacters_in_job_ids_and_arguments_are_stored_exactly(node, queued, queue_database):
    before = table(queue_database)
    for i, text in enumerate(SQL_METACHARACTERS):
        jobid = f"sql-{i}-{text}".replace("/", "|")
        data = answer(post(node, "schedule.json", *BASE, ("jobid", jobid), (f"arg{text}", text),
                           ("setting", f"X={text}"), ("priority", "2")))
        assert data["status"] == "ok" and data["jobid"] == jobid, data
        assert answer(get(node, "status.json", ("job", jobid)))["currstate"] == "pending"
        [pending] = [job for job in answer(get(node, "listjobs.json", ("project", "example"),
                                                ("pending_limit", "1000")))["pending"] if job["id"] == jobid]
        assert pending["args"] == {f"arg{text}": text}
        assert pending["settings"] == {"X": text}
    added = unchanged(queue_database, before)
    assert len(added) == len(SQL_METACHARACTERS)


@pytest.mark.parametrize("endpoint, fields, expected", [
    ("cancel.json", [("project", "nope"), ("job", "x")], "project 'nope' not found"),
    ("cancel.json", [("job", "x")], "'project' parameter is required"),
    ("status.json", [("job", "x"), ("project", "nope")], "project 'nope' not found"),
    ("status.json", [], "'job' parameter is required"),
    ("listjobs.json", [("project", "nope' OR 1=1 --")], "not found"),
    ("listjobs.json", [("project", b"\xff")], "project is invalid"),
])
def test_other_services_refuse_bad_input_with_json_errors(endpoint, fields, expected, node, queued, queue_database):
    before = table(queue_database)
    response = post(node, endpoint, *fields) if endpoint == "cancel.json" else get(node, endpoint, *fields)
    data = answer(response)
    assert data["status"] == "error" and expected in data["message"], data
    assert unchanged(queue_database, before) == {}


def test_metacharacter_job_ids_find_nothing_and_cancel_nothing(node, queued, queue_database):
    before = table(queue_database)
    for text in SQL_METACHARACTERS + ["pending-%", "%", "running-_"]:
        assert answer(get(node, "status.json", ("job", text)))["currstate"] is None
        assert answer(post(node, "cancel.json", ("project", "example"), ("job", text)))["prevstate"] is None
    assert unchanged(queue_database, before) == {}


# --- numbers out of range ---------------------------------------------------------------------------------------

BEYOND_BIGINT, BELOW_BIGINT = str(2**63), str(-(2**63) - 1)
SIGNAL_REFUSED = "signal must be a signal's name (INT, TERM, KILL, ...) or number"
LISTJOBS, SCHEDULE, PERIODIC = "listjobs.json", "schedule.json", "addperiodic.json"
OUT_OF_RANGE = {
    "pending_limit over the maximum": (LISTJOBS, [("pending_limit", "10001")], "pending_limit may be at most 10000"),
    "pending_limit past bigint": (LISTJOBS, [("pending_limit", BEYOND_BIGINT)], "pending_limit may be at most"),
    "pending_offset past bigint": (LISTJOBS, [("pending_offset", BEYOND_BIGINT)], "pending_offset may be at most"),
    "pending_offset 1e400": (LISTJOBS, [("pending_offset", "1e400")], "pending_offset is invalid"),
    "pending_offset below bigint": (LISTJOBS, [("pending_offset", BELOW_BIGINT)], "may not be negative"),
    "priority past bigint": (SCHEDULE, BASE + [("priority", BEYOND_BIGINT)], "priority must be between"),
    "priority below bigint": (SCHEDULE, BASE + [("priority", BELOW_BIGINT)], "priority must be between"),
    "priority 1e400": (SCHEDULE, BASE + [("priority", "1e400")], "priority must be a finite number"),
    "_run_at in year 33658": (SCHEDULE, BASE + [("_run_at", "1e15")], "run_at must be between 1970-01-01"),
    "_run_at before 1970": (SCHEDULE, BASE + [("_run_at", BELOW_BIGINT)], "run_at must be between 1970-01-01"),
    "_delay 1e400": (SCHEDULE, BASE + [("_delay", "1e400")], "delay must be a finite number"),
    "_retries past bigint": (SCHEDULE, BASE + [("_retries", BEYOND_BIGINT)], "retries must be between 0 and 30"),
    "_retry_delay past bigint": (SCHEDULE, BASE + [("_retry_delay", BEYOND_BIGINT)], "retry_delay must be"),
    "_max_runtime past bigint": (SCHEDULE, BASE + [("_max_runtime", BEYOND_BIGINT)], "max_runtime must be more than"),
    "_stall_timeout 1e400": (SCHEDULE, BASE + [("_stall_timeout", "1e400")], "stall_timeout must be a finite number"),
    "periodic _max_runtime 0": (PERIODIC, BASE + [("name", "bounded"), ("every", "60"), ("_max_runtime", "0")],
                                "max_runtime must be more than 0"),
    "periodic priority past bigint": (PERIODIC, BASE + [("name", "big"), ("every", "60"), ("priority", BEYOND_BIGINT)],
                                      "priority must be between"),
    "periodic every 1e300": (PERIODIC, BASE + [("name", "long"), ("every", "1e300")], "every must be at most"),
    "tree failures past bigint": ("tree.json", BASE + [("job", "pending-1"), ("failures", BEYOND_BIGINT)],
                                  "failures must be between 0 and 1000"),
    "cancel signal past bigint": ("cancel.json", [("project", "example"), ("job", "running-1"),
                                                  ("signal", BEYOND_BIGINT)], SIGNAL_REFUSED),
    "cancel signal 65": ("cancel.json", [("project", "example"), ("job", "running-1"), ("signal", "65")],
                         SIGNAL_REFUSED),
    "cancel signal superscript two": ("cancel.json", [("project", "example"), ("job", "running-1"), ("signal", "²")],
                                      SIGNAL_REFUSED),
}


def database_errors(node) -> float:
    """scrapyd_pgqueue_database_errors_total of the node's /metrics, over every operation."""
    with urllib.request.urlopen(f"{node.url}metrics", timeout=30) as response:
        families = text_string_to_metric_families(response.read().decode())
    return sum(sample.value for family in families for sample in family.samples
               if sample.name == "scrapyd_pgqueue_database_errors_total")


@pytest.mark.parametrize("case", list(OUT_OF_RANGE))
def test_numbers_out_of_range_are_bad_input_not_a_database_outage(case, node, queued, queue_database):
    endpoint, fields, expected = OUT_OF_RANGE[case]
    before, errors = table(queue_database), database_errors(node)
    refused(get(node, endpoint, *fields) if endpoint in (LISTJOBS, "tree.json") else post(node, endpoint, *fields),
            expected)
    assert unchanged(queue_database, before) == {}
    assert database_errors(node) == errors


@pytest.mark.parametrize("job, expected", [
    ({"spider": "sleeper", "priority": 2**63}, "priority must be between"),
    ({"spider": "sleeper", "priority": -(2**63) - 1}, "priority must be between"),
    ({"spider": "sleeper", "priority": 10**400}, "priority must be a finite number"),
    ({"spider": "sleeper", "run_at": 10**400}, "run_at must be a finite number"),
    ({"spider": "sleeper", "run_at": 1e300}, "run_at must be between 1970-01-01"),
    ({"spider": "sleeper", "delay": 10**400}, "delay must be a finite number"),
    ({"spider": "sleeper", "retries": 2**63}, "retries must be between 0 and 30"),
    ({"spider": "sleeper", "max_runtime": 10**400}, "max_runtime must be a finite number"),
    ({"spider": "sleeper", "stall_timeout": -1}, "stall_timeout must be more than 0"),
])
def test_a_batch_refuses_numbers_out_of_range(job, expected, node, queued, queue_database):
    before, errors = table(queue_database), database_errors(node)
    refused(post_batch(node, {"project": "example", "jobs": [GOOD_JOB, job]}), f"job 1: {expected}")
    assert unchanged(queue_database, before) == {}
    assert database_errors(node) == errors


def test_the_jobs_page_refuses_an_offset_past_bigint_with_the_reason_not_a_database_error(node, queued):
    errors = database_errors(node)
    response = requests.get(f"{node.url}jobs", params={"pending_offset": BEYOND_BIGINT}, timeout=30)
    assert response.status_code == 400 and "pending_offset must be a whole number from 0 to" in response.text
    assert database_errors(node) == errors


def test_a_batch_sent_as_anything_but_json_is_refused(node, queued, queue_database):
    # A form on any web page can post this body as text/plain, with the browser's saved credentials for the node.
    before = table(queue_database)
    body = json.dumps({"project": "example", "jobs": [dict(GOOD_JOB, jobid="cross-site")]})
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        response = requests.post(f"{node.url}schedule_batch.json", data=body, headers=headers, timeout=30)
        refused(response, "Content-Type: application/json")
    assert unchanged(queue_database, before) == {}
    accepted = requests.post(f"{node.url}schedule_batch.json", data=body, timeout=30,
                             headers={"Content-Type": "application/json; charset=utf-8"})
    assert answer(accepted)["jobids"] == ["cross-site"]


@pytest.mark.parametrize("signal", ["0", "99", "-9", "9.0", "BOGUS", "SIG", "", " TERM", "\u00b2", "9" * 5000])
def test_cancel_refuses_what_is_not_a_signal_and_changes_nothing(signal, node, queued, queue_database):
    before = table(queue_database)
    for job in ("running-1", "pending-1"):
        refused(post(node, "cancel.json", ("project", "example"), ("job", job), ("signal", signal)),
                SIGNAL_REFUSED)
    assert unchanged(queue_database, before) == {}


# --- fuzzing over HTTP ------------------------------------------------------------------------------------------

raw_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(SQL_METACHARACTERS),
    st.binary(max_size=12),  # often invalid UTF-8
    st.text(alphabet=st.characters(codec="utf-8"), min_size=190, max_size=260),  # around the jobid limit
)
schedule_fields = st.fixed_dictionaries(
    {
        "project": st.one_of(st.just("example"), raw_text),
        "spider": st.one_of(st.sampled_from(["sleeper", "quotes"]), raw_text),
    },
    optional={
        "jobid": raw_text,
        "priority": st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), raw_text),
        "_version": raw_text,
        "setting": raw_text,
    },
).flatmap(lambda named: st.lists(st.tuples(raw_text, raw_text), max_size=3).map(
    lambda extra: [*named.items(), *extra]))


def decoded(value):
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else value


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=schedule_fields)
def test_fuzzed_schedule_requests_get_a_json_answer_and_never_disturb_the_queue(fields, node, queued, queue_database):
    before = table(queue_database)
    data = answer(post(node, "schedule.json", *fields))
    added = unchanged(queue_database, before)
    if data["status"] == "error":
        assert data["message"] and not CLASS_NAME_PREFIX.match(data["message"]), data
        assert added == {}
        return
    [row] = added.values()  # exactly one new row, holding what was sent
    jobid = data["jobid"]
    with contextlib.closing(connect(queue_database)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT status, project, spider, job, message FROM spider_job WHERE id = %s", (row[0],))
        status, project, spider, job, message = cursor.fetchone()
    first = {}
    for name, value in fields:
        first.setdefault(decoded(name), decoded(value))
    assert (status, project, spider, job) == ("pending", first["project"], first["spider"], jobid)
    reserved = {"project", "spider", "jobid", "priority", "setting", "_version"}
    for name, value in first.items():
        if name not in reserved:
            assert message[name] == value


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job=raw_text, project=st.one_of(st.none(), st.just("example"), raw_text), signal=raw_text)
def test_fuzzed_status_listjobs_and_cancel_requests_get_a_json_answer(job, project, signal, node, queued,
                                                                     queue_database):
    before = table(queue_database)
    scope = [] if project is None else [("project", project)]
    answer(get(node, "status.json", ("job", job), *scope))
    answer(get(node, "listjobs.json", *scope, ("pending_limit", "5")))
    answer(post(node, "cancel.json", ("project", "example" if project is None else project), ("job", job),
                ("signal", signal)))
    after = table(queue_database)
    for row_id, row in before.items():  # a cancel may end a job of that exact id; nothing else changes
        if row[3] != decoded(job) or row[1] != ("example" if project is None else decoded(project)):
            assert after[row_id] == row


# --- the Python API -------------------------------------------------------------------------------------------


@pytest.fixture
def queue(database_url):
    return PostgresSpiderQueue(Config(values={"database_url": database_url}), "p")


@pytest.mark.parametrize("args, error, expected", [
    ({"priority": float("nan")}, InvalidJobError, "priority must be a finite number, not nan"),
    ({"priority": float("inf")}, InvalidJobError, "priority must be a finite number, not inf"),
    ({"priority": "abc"}, InvalidJobError, "priority must be a number, not 'abc'"),
    ({"arg": "a\x00b"}, InvalidJobError, "may not contain NUL characters"),
    ({"arg": "\udcff"}, InvalidJobError, "must be valid Unicode text"),  # an undecodable byte, surrogate-escaped
    ({"arg": object()}, InvalidJobError, "JSON-serialisable"),
    ({"_job": "j" * 2000}, InvalidJobError, "job id is longer than 1000 bytes"),
    ({"_job": ""}, InvalidJobError, "job id may not be empty"),
    ({"_job": "taken"}, DuplicateJobError, "job id 'taken' is already pending or running in project 'p'"),
])
def test_the_python_api_refuses_bad_jobs_with_a_clear_error(args, error, expected, queue, database_url):
    queue.add("s", _job="taken")
    before = table(database_url)
    with pytest.raises(error) as raised:
        queue.add("s", **{"_job": "new", **args})
    assert expected in str(raised.value)
    assert table(database_url) == before


def test_the_python_api_refuses_bad_names(database_url):
    config = Config(values={"database_url": database_url})
    with pytest.raises(InvalidJobError, match="project is longer than 1000 bytes"):
        PostgresSpiderQueue(config, "p" * 1001).add("s")
    with pytest.raises(InvalidJobError, match="spider name may not contain NUL characters"):
        PostgresSpiderQueue(config, "p").add("s\x00")
    assert PostgresSpiderQueue(config, "p").count() == 0


def test_the_python_api_stores_sql_metacharacters_exactly(queue):
    for i, text in enumerate(SQL_METACHARACTERS):
        queue.add(f"spider{text}", priority=-i, _job=f"job{text}", **{f"arg{text}": text})
    assert queue.list() == [
        {"name": f"spider{text}", "_job": f"job{text}", f"arg{text}": text} for text in SQL_METACHARACTERS
    ]


def test_jobs_that_cannot_be_spawned_end_failed_with_the_reason_and_the_slot_lives_on(database_url, tmp_path):
    """A job id that is no file name (the Python API does not check it) cannot be spawned: the node records it. A 1 MB
    argument (refused by schedule.json, which the Python API lets through) runs: it goes in the crawl's launch, on no
    command line, whose length once made it unspawnable."""
    queue = PostgresSpiderQueue(Config(values={"database_url": database_url}), "example")
    queue.add("sleeper", _job="huge-argument", big="x" * 1024 * 1024)
    queue.add("sleeper", _job="a/path")
    queue.add("sleeper", _job="fine")
    cluster = LocalCluster(database_url, 1, directory=tmp_path, config={"max_proc": "1", "poll_interval": "1"})
    with cluster, contextlib.closing(connect(database_url)) as connection, connection.cursor() as cursor:
        deadline = time.monotonic() + 60
        while True:
            cursor.execute("SELECT job, status, outcome, reason FROM spider_job ORDER BY id")
            rows = cursor.fetchall()
            if all(status == "terminated" for _, status, _, _ in rows):
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
    outcomes = {job: (outcome, reason) for job, _, outcome, reason in rows}
    assert outcomes["huge-argument"] == ("finished", None)
    assert outcomes["a/path"][0] == "failed"
    assert "could not start the crawl" in outcomes["a/path"][1]
    assert outcomes["fine"] == ("finished", None)  # the only slot was not lost
