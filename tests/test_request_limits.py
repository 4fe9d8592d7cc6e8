"""Request bodies over their limit, sent over real HTTP to a real node: Scrapyd's JSON error once the body has
arrived, nothing read into the queue, and the connection still usable; addversion.json's own, larger limit; basic
authentication first; the limits' options."""

from __future__ import annotations

import http.client
import json
import shutil
import urllib.parse
import zipfile

import pytest
import requests
from scrapyd.config import Config

from helpers import database_with_secret_owner, query
from scrapyd_pgqueue.config import ConfigurationError, settings
from scrapyd_pgqueue.local.cluster import LocalCluster

MAX_REQUEST_BYTES = 65536
MAX_EGG_BYTES = 1024 * 1024
SPIDER = [("project", "example"), ("spider", "sleeper")]


@pytest.fixture(scope="module")
def database(postgres_server):
    return database_with_secret_owner(postgres_server[0])


@pytest.fixture(scope="module")
def node(database, tmp_path_factory):
    url, _ = database
    config = {"max_request_bytes": str(MAX_REQUEST_BYTES), "max_egg_bytes": str(MAX_EGG_BYTES),
              "poll_interval": "3600", "listen_notify": "off", "max_proc": "1"}
    with LocalCluster(url, 1, directory=tmp_path_factory.mktemp("limits"), config=config) as cluster:
        yield cluster.nodes[0]


def rows(database) -> list[tuple]:
    return query(database[1], "SELECT * FROM spider_job ORDER BY id")


def refused_for_size(response: requests.Response, path: str, limit: int, option: str, node_name="node1") -> None:
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["status"] == "error" and answer["node_name"] == node_name, answer
    assert f"{path} takes at most {limit} ({option})" in answer["message"], answer


def form(*fields) -> bytes:
    return urllib.parse.urlencode(fields).encode()


@pytest.mark.parametrize("endpoint, body, content_type", [
    ("schedule.json", form(*SPIDER, ("big", "x" * MAX_REQUEST_BYTES)), "application/x-www-form-urlencoded"),
    ("schedule_batch.json", json.dumps({"project": "example", "jobs": [{"spider": "sleeper"}] * 5000}).encode(),
     "application/json"),
    ("cancel.json", form(("project", "example"), ("job", "j" * MAX_REQUEST_BYTES)),
     "application/x-www-form-urlencoded"),
    ("listjobs.json", b"x" * (MAX_REQUEST_BYTES + 1), "text/plain"),
])
def test_a_body_over_max_request_bytes_gets_a_json_error_and_changes_nothing(endpoint, body, content_type, node,
                                                                            database):
    before = rows(database)
    with requests.Session() as session:
        response = session.post(f"{node.url}{endpoint}", data=body, timeout=30, headers={"Content-Type": content_type})
        refused_for_size(response, f"/{endpoint}", MAX_REQUEST_BYTES, "max_request_bytes")
        assert f"the request body is {len(body)} bytes" in response.json()["message"]
        # The same connection serves the next request: the refused body was read to its end, not left in the pipe.
        assert session.get(f"{node.url}daemonstatus.json", timeout=30).json()["status"] == "ok"
    assert rows(database) == before


def test_a_body_at_the_limit_is_read_and_served(node, database):
    padding = MAX_REQUEST_BYTES - len(form(*SPIDER, ("jobid", "at-limit"), ("pad", "")))
    body = form(*SPIDER, ("jobid", "at-limit"), ("pad", "x" * padding))
    assert len(body) == MAX_REQUEST_BYTES
    answer = requests.post(f"{node.url}schedule.json", data=body, timeout=60,
                           headers={"Content-Type": "application/x-www-form-urlencoded"}).json()
    assert answer["status"] == "ok" and answer["jobid"] == "at-limit", answer
    assert query(database[1], "SELECT job FROM spider_job WHERE job = 'at-limit'") == [("at-limit",)]


def test_a_chunked_body_without_content_length_is_cut_off_at_the_limit(node, database):
    before = rows(database)
    chunks = [b"big=" + b"x" * 16384] + [b"x" * 16384] * 7  # 128 KiB, sent as it is produced
    response = requests.post(f"{node.url}schedule.json?project=example&spider=sleeper", data=iter(chunks),
                             timeout=30, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    refused_for_size(response, "/schedule.json", MAX_REQUEST_BYTES, "max_request_bytes")
    assert rows(database) == before


def test_a_client_expecting_100_continue_gets_the_json_error_after_the_interim_answer(node):
    connection = http.client.HTTPConnection(node.url.split("//")[1].rstrip("/"), timeout=30)
    connection.putrequest("POST", "/schedule.json")
    connection.putheader("Content-Type", "application/x-www-form-urlencoded")
    connection.putheader("Content-Length", str(10 * MAX_REQUEST_BYTES))
    connection.putheader("Expect", "100-continue")
    connection.endheaders()
    connection.send(b"x" * 10 * MAX_REQUEST_BYTES)
    response = connection.getresponse()
    assert response.status == 200
    assert "takes at most 65536 (max_request_bytes)" in json.loads(response.read())["message"]
    connection.close()


def test_addversion_takes_an_egg_up_to_max_egg_bytes(node, egg, tmp_path):
    padded = tmp_path / "padded.egg"  # the example egg, with a file that makes it larger than max_request_bytes
    shutil.copy(egg, padded)
    with zipfile.ZipFile(padded, "a") as archive:
        archive.writestr("padding.bin", b"\0" * 2 * MAX_REQUEST_BYTES, compress_type=zipfile.ZIP_STORED)
    assert MAX_REQUEST_BYTES < padded.stat().st_size < MAX_EGG_BYTES
    answer = requests.post(f"{node.url}addversion.json", data={"project": "padded", "version": "1"},
                           files={"egg": ("project.egg", padded.read_bytes())}, timeout=60).json()
    assert answer["status"] == "ok" and answer["project"] == "padded" and answer["spiders"] == 5, answer
    assert "padded" in node.get("listprojects.json")["projects"]


def test_addversion_refuses_an_egg_over_max_egg_bytes(node):
    before = node.get("listprojects.json")["projects"]
    files = {"egg": ("project.egg", b"\0" * MAX_EGG_BYTES)}
    response = requests.post(f"{node.url}addversion.json", data={"project": "huge", "version": "1"}, files=files,
                             timeout=60)
    refused_for_size(response, "/addversion.json", MAX_EGG_BYTES, "max_egg_bytes")
    assert node.get("listprojects.json")["projects"] == before


def test_basic_auth_comes_before_the_size_check(database, tmp_path):
    url, _ = database
    config = {"max_request_bytes": str(MAX_REQUEST_BYTES), "username": "alice", "password": "s3cret",
              "poll_interval": "3600"}
    with LocalCluster(url, 1, directory=tmp_path / "auth", config=config, name_prefix="guarded") as cluster:
        target = f"{cluster.nodes[0].url}schedule.json"
        big = form(*SPIDER, ("big", "x" * MAX_REQUEST_BYTES))
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        assert requests.post(target, data=big, headers=headers, timeout=30).status_code == 401
        assert requests.post(target, data=big, headers=headers, auth=("alice", "wrong"), timeout=30).status_code == 401
        refused_for_size(requests.post(target, data=big, headers=headers, auth=("alice", "s3cret"), timeout=30),
                         "/schedule.json", MAX_REQUEST_BYTES, "max_request_bytes", node_name="guarded1")


@pytest.mark.parametrize("target, headers", [
    ("listjobs.json?project=" + "x" * 17000, {}),  # a request line over Twisted's 16 KiB
    ("listjobs.json", {f"X-Padding-{index}": "x" * 1000 for index in range(17)}),  # headers over 16 KiB in all
    ("listjobs.json", {"X-Padding": "x" * 17000}),  # one header line over 16 KiB
])
def test_a_request_line_or_headers_over_16_kib_get_scrapyds_json_error(node, target, headers):
    response = requests.get(f"{node.url}{target}", headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.headers["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["status"] == "error" and answer["node_name"] == "node1", answer
    assert "over 16384 bytes" in answer["message"], answer
    assert node.get("daemonstatus.json")["status"] == "ok"  # the node serves the next request


@pytest.mark.parametrize("option, value", [("max_request_bytes", "0"), ("max_egg_bytes", "-1"),
                                           ("max_request_bytes", "8M")])
def test_a_limit_that_is_not_a_positive_number_of_bytes_stops_the_node_at_start_up(option, value):
    with pytest.raises(ConfigurationError, match=f"'{option}' must be"):
        settings(Config(values={"database_url": "postgresql://db/scrapyd", option: value}))


def test_the_limits_default_to_8_mib_and_100_mib():
    configured = settings(Config(values={"database_url": "postgresql://db/scrapyd"}))
    assert (configured.max_request_bytes, configured.max_egg_bytes) == (8 * 1024 * 1024, 100 * 1024 * 1024)
