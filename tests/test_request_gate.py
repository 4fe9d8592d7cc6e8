"""Who may send what, judged on a request's headers by a real node over real HTTP: an anonymous 95 MB upload is
answered 401 at its headers and never read into memory; the read-only credential reads and writes nothing; a
browser's cross-site POST is refused and stores nothing; every response carries the framing and content policies.
The rules themselves (``web/request_gate.py``) are pure functions, tested alone at the end."""

from __future__ import annotations

import base64
import socket
import threading
import time

import pytest
import requests
from scrapyd.config import Config
from scrapyd_api import ScrapydAPI
from scrapyd_client.pyclient import ScrapydClient
from twisted.web.http_headers import Headers

from helpers import database_with_secret_owner, query
from scrapyd_pgqueue.config import ConfigurationError
from scrapyd_pgqueue.local.cluster import LocalCluster
from scrapyd_pgqueue.web.page import POLICY
from scrapyd_pgqueue.web.request_gate import Credentials, basic_pair, is_own_origin, refusal

FULL = ("operator", "full-s3cret")
READ_ONLY = ("viewer", "read-s3cret")
UPLOAD_BYTES = 95 * 1000 * 1000
CHUNK = b"\0" * (1024 * 1024)


@pytest.fixture(scope="module")
def database(postgres_server):
    return database_with_secret_owner(postgres_server[0])


@pytest.fixture(scope="module")
def node(database, tmp_path_factory, egg):
    """A node asking for credentials, with a read-only pair from the environment, that runs nothing (jobs stay
    pending), with the example project deployed. Limits at their defaults: a 95 MB egg is within max_egg_bytes."""
    config = {"username": FULL[0], "password": FULL[1], "poll_interval": "3600", "listen_notify": "off"}
    env = {"SCRAPYD_READONLY_USERNAME": READ_ONLY[0], "SCRAPYD_READONLY_PASSWORD": READ_ONLY[1]}
    with LocalCluster(database[0], 1, directory=tmp_path_factory.mktemp("gate"), config=config, env=env,
                      name_prefix="gate") as cluster:
        [node] = cluster.nodes
        answer = requests.post(f"{node.url}addversion.json", data={"project": "deployed", "version": "1"},
                               files={"egg": ("project.egg", egg.read_bytes())}, auth=FULL, timeout=60).json()
        assert answer["status"] == "ok", answer
        log = node.directory / "logs" / "deployed" / "quotes" / "done.log"  # as a finished crawl leaves it
        log.parent.mkdir(parents=True)
        log.write_text("a crawl's log\n")
        yield node


def stored(database) -> tuple[list, list]:
    """The queue's jobs and eggs, as the database holds them."""
    return (query(database[1], "SELECT project, spider, job, status FROM spider_job ORDER BY id"),
            query(database[1], "SELECT project, version FROM project_egg ORDER BY project, version"))


def json_refusal(response: requests.Response, code: int, words: str) -> None:
    assert response.status_code == code, response.text
    assert response.headers["Content-Type"] == "application/json"
    answer = response.json()
    assert answer["status"] == "error" and answer["node_name"] == "gate1" and words in answer["message"], answer


# --- an anonymous upload ---------------------------------------------------------------------------------------


class RssSampler(threading.Thread):
    """The peak VmRSS of a process, read from /proc every 5 ms until stopped."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self):
        while self.running:
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.005)

    def stop(self) -> int:
        self.running = False
        self.join()
        return max(self.peak, rss(self.pid))


def rss(pid: int) -> int:
    """Resident set size in bytes (/proc/<pid>/status, VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def anonymous_upload(node, endpoint: str, size: int) -> dict:
    """A multipart POST of a ``size``-byte file, no credentials, on a raw socket: the headers first, then the body
    from another thread while this one waits for the answer. Returns the seconds from the end of the headers to the
    answer's first bytes, the body bytes sent by then, and the whole answer (read until the node closes)."""
    boundary = b"gate-boundary"
    head = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="project"\r\n\r\nanonymous\r\n--' +
            boundary + b'\r\nContent-Disposition: form-data; name="egg"; filename="x.egg"\r\n\r\n')
    tail = b"\r\n--" + boundary + b"--\r\n"
    headers = (f"POST /{endpoint} HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary.decode()}\r\n"
               f"Content-Length: {len(head) + size + len(tail)}\r\n\r\n").encode()
    sent = {"bytes": 0, "error": None}

    def send_body():
        try:
            connection.sendall(head)
            for offset in range(0, size, len(CHUNK)):
                connection.sendall(CHUNK[: size - offset])
                sent["bytes"] += min(len(CHUNK), size - offset)
            connection.sendall(tail)
        except OSError as e:
            sent["error"] = e

    with socket.create_connection(("127.0.0.1", node.port), timeout=60) as connection:
        connection.sendall(headers)
        headers_sent = time.monotonic()
        sender = threading.Thread(target=send_body, daemon=True)
        sender.start()
        answer = connection.recv(65536)
        answered = time.monotonic()
        sent_by_then = sent["bytes"]
        while chunk := connection.recv(65536):  # the node closes once the body has been read (and dropped)
            answer += chunk
        sender.join(60)
    return {"seconds": answered - headers_sent, "sent_by_then": sent_by_then, "answer": answer,
            "send_error": sent["error"]}


@pytest.mark.parametrize("endpoint", ["addversion.json", "schedule.json"])
def test_an_anonymous_95_mb_upload_is_answered_401_at_its_headers_and_never_read_into_memory(node, database,
                                                                                          endpoint):
    before = stored(database)
    anonymous_upload(node, endpoint, 2 * len(CHUNK))  # the first refusal's code paths, before idle is measured
    idle = max(rss(node.process.pid) for _ in range(5))
    sampler = RssSampler(node.process.pid)
    sampler.start()
    upload = anonymous_upload(node, endpoint, UPLOAD_BYTES)
    peak = sampler.stop()

    status_line, _, rest = upload["answer"].partition(b"\r\n")
    assert status_line == b"HTTP/1.1 401 Unauthorized", upload["answer"][:300]
    assert b'\r\nWWW-Authenticate: basic realm="Scrapyd"\r\n' in b"\r\n" + rest
    assert upload["answer"].endswith(b"\r\n\r\nUnauthorized")
    assert upload["send_error"] is None  # the whole body went out: read and dropped, the answer not lost to a reset
    print(f"\n{endpoint}: 401 {upload['seconds'] * 1000:.1f} ms after the headers, with "
          f"{upload['sent_by_then'] / 1e6:.1f} of {UPLOAD_BYTES / 1e6:.0f} MB sent; node RSS idle "
          f"{idle / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB (+{(peak - idle) / 2**20:.1f} MiB)")
    assert upload["seconds"] < 0.1
    assert upload["sent_by_then"] < UPLOAD_BYTES  # answered while the body was still coming
    assert peak - idle < 20 * 2**20
    assert stored(database) == before


def test_the_401_is_scrapyds_and_the_right_credentials_are_served(node):
    for auth in (None, ("operator", "wrong"), ("nobody", FULL[1]), (FULL[0], READ_ONLY[1])):
        response = requests.get(f"{node.url}daemonstatus.json", auth=auth, timeout=30)
        assert response.status_code == 401, auth
        assert response.headers["WWW-Authenticate"] == 'basic realm="Scrapyd"'
        assert response.text == "Unauthorized"
    assert requests.get(f"{node.url}daemonstatus.json", auth=FULL, timeout=30).json()["status"] == "ok"
    with requests.Session() as session:  # a refused request without a body keeps its connection usable
        assert session.get(f"{node.url}jobs", timeout=30).status_code == 401
        answer = session.get(f"{node.url}listprojects.json", auth=FULL, timeout=30).json()
        assert "deployed" in answer["projects"], answer


def test_a_client_expecting_100_continue_gets_the_401_instead_and_need_not_send_its_body(node):
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as connection:
        connection.sendall(f"POST /addversion.json HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n"
                           f"Content-Length: {UPLOAD_BYTES}\r\nExpect: 100-continue\r\n\r\n".encode())
        answer = connection.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401 Unauthorized\r\n"), answer  # no "100 Continue" before it
    assert b"\r\nConnection: close\r\n" in answer


def test_scrapyds_clients_deploy_schedule_and_read_with_the_credentials(node, database, egg):
    api = ScrapydAPI(node.url.rstrip("/"), auth=FULL)
    assert api.add_version("clients", "1", egg.read_bytes()) == 5  # spiders in the egg
    job = api.schedule("clients", "quotes", jobid="by-client")
    assert job == "by-client"
    assert query(database[1], "SELECT project FROM spider_job WHERE job = 'by-client'") == [("clients",)]
    # (ScrapydClient appends "/listjobs.json" to the URL itself: give it none of its own.)
    viewer = ScrapydClient(node.url.rstrip("/"), *READ_ONLY)
    assert "by-client" in [pending["id"] for pending in viewer.jobs("clients")["pending"]]
    assert "clients" in viewer.projects()


# --- the read-only credential ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    "", "jobs", "dashboard", "metrics", "logs/", "logs/deployed/quotes/done.log", "daemonstatus.json", "alive.json",
    "listjobs.json",
    "listjobs.json?project=deployed", "status.json?job=nothing", "listprojects.json",
    "listversions.json?project=deployed", "listperiodic.json",
])
def test_the_read_only_credential_reads_pages_logs_and_lists(node, path):
    response = requests.get(f"{node.url}{path}", auth=READ_ONLY, timeout=60)
    assert response.status_code == 200, response.text
    if path.endswith(".json") or ".json?" in path:
        assert response.json()["status"] == "ok", response.text


@pytest.mark.parametrize("endpoint, fields", [
    ("schedule.json", {"data": {"project": "deployed", "spider": "quotes", "jobid": "by-viewer"}}),
    ("cancel.json", {"data": {"project": "deployed", "job": "by-operator"}}),
    ("addversion.json", {"data": {"project": "viewer-egg", "version": "1"},
                         "files": {"egg": ("project.egg", b"PK\x05\x06" + b"\0" * 18)}}),
    ("delproject.json", {"data": {"project": "deployed"}}),
    ("addperiodic.json", {"data": {"project": "deployed", "spider": "quotes", "every": "60"}}),
])
def test_the_read_only_credential_is_refused_every_write_and_nothing_is_stored(node, database, endpoint, fields):
    requests.post(f"{node.url}schedule.json", auth=FULL, timeout=30,
                  data={"project": "deployed", "spider": "quotes", "jobid": "by-operator"})
    before = stored(database)
    response = requests.post(f"{node.url}{endpoint}", auth=READ_ONLY, timeout=30, **fields)
    json_refusal(response, 403, f"the read-only credential may not POST /{endpoint}")
    assert stored(database) == before
    assert ("deployed", "quotes", "by-operator", "pending") in before[0]


# --- browsers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site", "Origin": "http://other.127.0.0.1.nip.io"},
    {"Origin": "null"},  # a sandboxed frame, a page from a file
])
def test_a_cross_site_post_is_refused_and_stores_nothing(node, database, headers):
    before = stored(database)
    response = requests.post(f"{node.url}schedule.json", auth=FULL, headers=headers, timeout=30,
                             data={"project": "deployed", "spider": "quotes", "jobid": "cross-site"})
    json_refusal(response, 403, "from a page of another site is refused")
    assert stored(database) == before
    assert query(database[1], "SELECT job FROM spider_job WHERE job = 'cross-site'") == []


def test_a_post_from_the_node_s_own_page_is_served(node, database):
    headers = {"Origin": node.url.rstrip("/"), "Sec-Fetch-Site": "same-origin"}  # as the Cancel buttons of /jobs
    answer = requests.post(f"{node.url}schedule.json", auth=FULL, headers=headers, timeout=30,
                           data={"project": "deployed", "spider": "quotes", "jobid": "same-origin"}).json()
    assert answer["status"] == "ok", answer
    assert query(database[1], "SELECT job FROM spider_job WHERE job = 'same-origin'") == [("same-origin",)]


# --- response headers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, auth", [("", FULL), ("jobs", FULL), ("dashboard", READ_ONLY),
                                        ("daemonstatus.json", FULL), ("logs/", FULL), ("jobs", None),
                                        ("schedule.json", READ_ONLY)])
def test_every_response_forbids_framing_and_carries_the_content_policy(node, path, auth):
    method = requests.post if path == "schedule.json" else requests.get
    response = method(f"{node.url}{path}", auth=auth, timeout=60)
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Content-Security-Policy"] == POLICY


# --- the rules alone -------------------------------------------------------------------------------------------


def headers(**values: str) -> Headers:
    return Headers({name.replace("_", "-").encode(): [value.encode()] for name, value in values.items()})


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


CREDENTIALS = Credentials((b"operator", b"pw"), (b"viewer", b"ro"))


def test_without_credentials_configured_every_request_is_authenticated_but_cross_site_still_refused():
    open_node = Credentials(None)
    assert refusal(open_node, b"POST", b"/schedule.json", headers(), False) is None
    assert refusal(open_node, b"POST", b"/addversion.json", headers(Origin="https://evil.example"), False).code == 403


@pytest.mark.parametrize("value, expected", [
    (basic("a", "b:c"), (b"a", b"b:c")), ("basic " + base64.b64encode(b"a:").decode(), (b"a", b"")),
    ("Basic " + base64.b64encode(b"ab:c").decode().rstrip("="), (b"ab", b"c")),  # padding left out, as Twisted
    ("Bearer abc", None), ("Basic !!!", None), ("Basic " + base64.b64encode(b"no-colon").decode(), None), ("", None),
])
def test_basic_pairs_are_read_as_rfc_7617_says(value, expected):
    assert basic_pair(value.encode()) == expected


@pytest.mark.parametrize("origin, forwarded, secure, own", [
    ("http://node:6800", {}, False, True),
    ("http://NODE:6800", {}, False, True),
    ("https://node:6800", {}, False, False),  # another scheme is another origin
    ("https://node:6800", {}, True, True),
    ("https://public.example", {"X_Forwarded_Proto": "https", "X_Forwarded_Host": "public.example"}, False, True),
    ("https://public.example", {"X_Forwarded_Proto": "https", "X_Forwarded_Host": "public.example:443"}, False,
     True),
    ("http://node:6800.evil.example", {}, False, False),
    ("null", {}, False, False),
])
def test_the_node_s_own_origin_is_its_scheme_and_host(origin, forwarded, secure, own):
    assert is_own_origin(origin.encode(), headers(Host="node:6800", **forwarded), secure) is own


def test_the_read_only_pair_is_refused_what_is_not_a_read():
    viewer = headers(Authorization=basic("viewer", "ro"))
    assert refusal(CREDENTIALS, b"GET", b"/logs/p/s/j.log", viewer, False) is None
    assert refusal(CREDENTIALS, b"GET", b"/%6Aobs?x=1", viewer, False) is None  # /jobs, as Twisted unquotes it
    assert refusal(CREDENTIALS, b"GET", b"/schedule.json", viewer, False).code == 403
    assert refusal(CREDENTIALS, b"POST", b"/listjobs.json", viewer, False).code == 403
    assert refusal(CREDENTIALS, b"GET", b"/listjobs.json", headers(Authorization=basic("viewer", "pw")),
                   False).code == 401


@pytest.mark.parametrize("values, message", [
    ({"readonly_username": "viewer", "readonly_password": "ro"}, "need Scrapyd's username and password"),
    ({"username": "a", "password": "b", "readonly_username": "a", "readonly_password": "c"}, "must differ"),
    ({"username": "a", "password": "b", "readonly_username": "v:w", "readonly_password": "c"}, "must not contain"),
])
def test_a_read_only_pair_that_cannot_work_stops_the_node_at_start_up(values, message, monkeypatch):
    for variable in ("USERNAME", "PASSWORD", "READONLY_USERNAME", "READONLY_PASSWORD"):
        monkeypatch.delenv(f"SCRAPYD_{variable}", raising=False)
    with pytest.raises(ConfigurationError, match=message):
        Credentials.from_config(Config(values=values))
