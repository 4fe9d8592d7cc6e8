"""Shared test helpers: waiting on real processes, looking at the database, the crawls' own records."""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import multiprocessing
import os
import random
import select
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import psycopg2
from sqlalchemy import make_url

# The system's interpreter of this version (readable by every user, where the tests' own may sit in a private home).
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
SECRET = "fault-s3cret-pw"  # the nodes' database password in fault tests: no log line may show it
# A node's configuration for claiming only at start-up (a poll an hour, no NOTIFY): jobs scheduled through it later wait
# for another node.
CLAIM_AT_START_ONLY = {"poll_interval": "3600", "listen_notify": "off"}


def scrape(node) -> dict:
    """{(sample name, frozenset of labels): value} of one scrape of a node's /metrics, read with Prometheus's own
    parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{node.url}metrics", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        families = text_string_to_metric_families(response.read().decode())
    return {(sample.name, frozenset(sample.labels.items())): sample.value for family in families
            for sample in family.samples}


def value(samples, name, **labels):
    """One sample of a scrape (``scrape``); None when absent."""
    return samples.get((name, frozenset(labels.items())))


def skewed_clock(offset: str) -> dict[str, str]:
    """The environment of a process whose clock is ``offset`` ("-2h", "+1d") off, through Debian's libfaketime (its
    monotonic clock left true, so that timeouts keep their length). Never skipped: without the library it fails."""
    libraries = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert libraries, "libfaketime is missing: apt-get install faketime (.ci/run installs it)"
    return {"LD_PRELOAD": libraries[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def image_pinned(reference: str) -> bool:
    """Whether an image reference (``registry:5000/name:tag@sha256:...``) names one version: a digest, or a tag other
    than ``latest`` (untagged is latest)."""
    name, at, _digest = reference.partition("@")
    last = name.rsplit("/", 1)[-1]
    return bool(at) or (":" in last and last.split(":", 1)[1] != "latest")


def wait_for(condition, timeout: float, what: str, interval: float = 0.1):
    """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --- database ---------------------------------------------------------------------------------------------------


def connect(url, **kwargs):
    parsed = make_url(url)
    connection = psycopg2.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, password=parsed.password,
        dbname=parsed.database or "postgres", connect_timeout=5, **kwargs,
    )
    connection.autocommit = True
    return connection


def query(url, sql, params=()):
    """Run one statement on a connection of its own (the server restarts under these tests)."""
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else None


def claim_until_empty(url, worker, start_at, results, largest_batch, tags=()):
    """A claimer process (a node with ``tags``): from ``start_at`` on, claim batches of 1 to ``largest_batch`` jobs
    (sizes drawn from a generator seeded by ``worker``) until none is left; put (worker, its (job, attempt) pairs) on
    ``results``."""
    from scrapyd_pgqueue.store import JobStore

    store = JobStore.for_url(url)
    chooser = random.Random(worker)
    time.sleep(max(0.0, start_at - time.time()))  # start all together
    claimed = []
    while batch := store.claim_next_jobs(None, chooser.randint(1, largest_batch), node=f"node-{worker}",
                                         worker=f"w{worker}", tags=tags).jobs:
        claimed.extend((job.job, job.attempt) for job in batch)
    results.put((worker, claimed))


def claim_in_processes(url, claimers: int, start_method: str, largest_batch: int = 1, tags_of=lambda worker: ()):
    """``claimers`` OS processes (each a node with ``tags_of(its index)``) claiming together until the queue is
    empty: each one's (job, attempt) pairs, in their index order, and the seconds they took."""
    context = multiprocessing.get_context(start_method)
    results = context.Queue()
    start_at = time.time() + 3
    processes = [
        context.Process(target=claim_until_empty,
                        args=(url, worker, start_at, results, largest_batch, tags_of(worker)))
        for worker in range(claimers)
    ]
    for process in processes:
        process.start()
    per_worker = [claimed for _, claimed in sorted(results.get(timeout=300) for _ in processes)]
    elapsed = time.time() - start_at
    for process in processes:
        process.join(30)
    return per_worker, elapsed


def node_role(admin_connection, database_url, role, attributes=""):
    """A new login role (``attributes``: CONNECTION LIMIT ...) with the node role's rights (``scrapyd-pgqueue
    grant``) on the test's database, whose schema is created as its owner first; its URL."""
    from scrapyd_pgqueue.database import db, roles

    with admin_connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN {attributes}")
    assert roles.grant_node_role(db.get_engine(database_url), role) == roles.Granted()  # no risk, no warning
    return make_url(database_url).set(username=role).render_as_string(hide_password=False)


def database_with_secret_owner(server_url: str) -> tuple[str, str]:
    """A new database owned by a new role with a password: (the nodes' URL, a superuser URL to the same database)."""
    name = f"fault_{uuid.uuid4().hex[:10]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} LOGIN PASSWORD %s", (SECRET,))
        cursor.execute(f"CREATE DATABASE {name} OWNER {name}")
    superuser_url = make_url(server_url).set(database=name)
    nodes_url = superuser_url.set(username=name, password=SECRET)
    return nodes_url.render_as_string(hide_password=False), superuser_url.render_as_string(hide_password=False)


def accepting(server_url):
    try:
        connect(server_url).close()
        return True
    except psycopg2.OperationalError:
        return False


# --- the operator command -----------------------------------------------------------------------------------------

COMMAND = os.path.join(os.path.dirname(sys.executable), "scrapyd-pgqueue")


def run(database_url, *args, expect=0, env=None):
    """Run the console script with the database URL from the environment (none: empty), as an operator's shell would
    pass it."""
    env = {**{key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}, **(env or {})}
    if database_url:
        env["SCRAPYD_DATABASE_URL"] = database_url
    result = subprocess.run([COMMAND, *args], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def run_json(database_url, *args, expect=0):
    return json.loads(run(database_url, *args, "--json", expect=expect).stdout)


def finish(store, claimed, *, outcome="finished", reason=None, worker="w1", ended_minutes_ago=0):
    """End a job claimed through the store, as its node would (``JobStore.finish_job``)."""
    end = datetime.datetime.now() - datetime.timedelta(minutes=ended_minutes_ago)
    store.finish_job(project=claimed.project, spider=claimed.message["name"], job=claimed.job,
                     start_time=end - datetime.timedelta(seconds=5), end_time=end, outcome=outcome, reason=reason,
                     claimed=claimed, worker=worker)


# --- crawls -----------------------------------------------------------------------------------------------------


def runs(tmp_path) -> list[dict]:
    path = tmp_path / "records" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def runs_of(tmp_path, job) -> list[dict]:
    return [run for run in runs(tmp_path) if run["job"] == job]


def ends(tmp_path) -> list[dict]:
    """The crawls that closed, one record each (``ended``: when the spider closed), as ``runs`` has their starts."""
    path = tmp_path / "records" / "ends.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def jobs(url, *names):
    """{job id: (status, outcome, node, attempts)}, every row of the given job ids (all jobs when none given)."""
    rows = query(
        url,
        "SELECT job, status, outcome, node, attempts FROM spider_job WHERE %s OR job = ANY(%s) ORDER BY id",
        (not names, list(names)),
    )
    table = {}
    for job, *state in rows:
        assert job not in table, f"job {job} has two rows"
        table[job] = tuple(state)
    return table


def schedule(node, job, spider="sleeper", **args):
    answer = node.post("schedule.json", project="example", spider=spider, jobid=job, **args)
    assert answer["status"] == "ok", answer
    return answer


def timed(node, method, endpoint, timeout: float = 30, **params):
    """(seconds, answer) of one request; an HTTP error or no answer within ``timeout`` seconds fails the test."""
    started = time.monotonic()
    answer = getattr(node, method)(endpoint, timeout=timeout, **params)
    return time.monotonic() - started, answer


def health(node, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``scrapyd-pgqueue health ARGS`` on the node's host, as a Docker or Kubernetes probe runs it there: in the
    node's directory and home (its configuration files), with its port from the environment, plus ``env``."""
    command = os.path.join(os.path.dirname(sys.executable), "scrapyd-pgqueue")
    environment = {key: os.environ[key] for key in ("PATH", "LANG") if key in os.environ}
    environment.update({"HOME": str(node.directory), "SCRAPYD_HTTP_PORT": str(node.port), **env})
    return subprocess.run([command, "health", *args], cwd=node.directory, env=environment, capture_output=True,
                          text=True, timeout=60)


# --- browser ----------------------------------------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium(width: int = 1280, height: int = 1400):
    """A headless Chromium driven by Selenium: Debian's browser and driver, so nothing is downloaded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for csp_violations
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def csp_violations(driver) -> list[str]:
    """What the browser refused under the pages' Content-Security-Policy since the last call (its console)."""
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]


def screenshot(driver, directory, name: str):
    """Save the page as directory/name.png and print where (a test artifact for people to look at)."""
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def table_rows(driver, table_id: str) -> list[list[str]]:
    """The text of every cell of every row of the table with this id (header rows have no <td>)."""
    from selenium.webdriver.common.by import By

    rows = driver.find_element(By.ID, table_id).find_elements(By.TAG_NAME, "tr")
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]


# --- a generated site of unknown size (crawl trees) ---------------------------------------------------------------


def generate_site(seed: int, depth: int, fanout: int) -> dict[str, list[str]]:
    """{section id: the sections its page links to}, the same for the same arguments. Section "0" is the home page;
    each section of a level links to 1..fanout new sections of the next level, and one more of that level (so some
    are linked from two parents); the last level links back to the home page and to a section crawled before."""
    import random

    rng = random.Random(seed)
    links: dict[str, list[str]] = {"0": []}
    level, earlier = ["0"], []
    for d in range(1, depth + 1):
        new: list[str] = []
        for parent in level:
            for _ in range(rng.randint(1, fanout)):
                child = f"{d}.{len(new)}"
                new.append(child)
                links[child] = []
                links[parent].append(child)
        for parent in level:
            links[parent].append(rng.choice(new))
        earlier += level
        level = new
    for leaf in level:
        links[leaf] += ["0", rng.choice(earlier)]
    return links


class SiteServer:
    """The generated site on loopback (a thread of this process): ``/section/<id>`` is a page linking to its
    sections with ``<a class="section">``, answered after ``delay`` seconds; ``requests`` counts them by section,
    ``arrivals`` has the time (monotonic) each came, ``most_at_once`` is the most it ever answered at the same time."""

    def __init__(self, links: dict[str, list[str]], delay: float = 0.0, host: str = "127.0.0.1",
                 locate=lambda section: f"/section/{section}"):
        """``host``: the loopback address it answers on (127.0.0.2 is another host to a crawler); ``locate``: a
        section's URL in a page's links (relative by default; absolute for a site spread over several hosts)."""
        import collections
        import http.server
        import threading

        self.links, self.delay = links, delay
        self.requests: collections.Counter = collections.Counter()
        self.arrivals: list[float] = []
        self.at_once = self.most_at_once = 0
        counting = threading.Lock()
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                section = self.path.rsplit("/", 1)[-1]
                if not self.path.startswith("/section/") or section not in site.links:
                    self.send_error(404)
                    return
                with counting:
                    site.requests[section] += 1
                    site.arrivals.append(time.monotonic())
                    site.at_once += 1
                    site.most_at_once = max(site.most_at_once, site.at_once)
                time.sleep(site.delay)
                with counting:  # before the answer leaves: its client's next request can never overlap it
                    site.at_once -= 1
                anchors = "".join(f'<a class="section" href="{locate(s)}">{s}</a>' for s in site.links[section])
                body = f"<html><body><h1>Section {section}</h1>{anchors}</body></html>".encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a crawl killed (or cancelled) while it waited for the page

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "SiteServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


# The node's crawl endpoint (node/crawl_api.py) alone, on its own reactor, for the crawl API's tests: it admits one
# crawl (project, job, its row) and prints that crawl's environment, then serves until killed.
CRAWL_API_SERVER = """
import json, sys, threading
from twisted.internet import reactor
from scrapyd_pgqueue.config import settings as read_settings
from scrapyd_pgqueue.node.crawl_api import CrawlApi
from scrapyd_pgqueue.store import ClaimedJob, JobStore

url, project, job, row_id, directory, tree_max_jobs, database_timeout = sys.argv[1:]
settings = read_settings({"database_url": url, "node_name": "n", "default_retries": "2", "tree_max_jobs": tree_max_jobs,
                          "database_timeout": database_timeout, "max_request_bytes": str(1024 * 1024)})
api = CrawlApi(settings, JobStore.for_settings(settings), "n")
api.listen(directory)
claimed = ClaimedJob(int(row_id), project, job, 1, {})
token = api.admit(project, job, claimed)
print(json.dumps({"node": api.address, "token": token}), flush=True)

def crawl_pids():  # each line: the pid of the process that is the crawl from now on (as a node learns it)
    for line in sys.stdin:
        done = threading.Event()
        reactor.callFromThread(lambda pid=int(line): (api.started(token, pid), done.set()))
        done.wait()
        print("ok", flush=True)

threading.Thread(target=crawl_pids, daemon=True).start()
reactor.run()
"""


class CrawlApiServer:
    """A node's crawl endpoint (max_request_bytes 1 MB) serving one running crawl: its address (``node``) and the
    crawl's ``token``; ``crawl_is(pid)`` names the process that is that crawl, whose requests alone it takes."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        launch = json.loads(process.stdout.readline())
        self.node, self.token = launch["node"], launch["token"]

    def crawl_is(self, pid: int) -> None:
        self.process.stdin.write(f"{pid}\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "ok\n"


@contextlib.contextmanager
def crawl_api_server(url, project, job, row_id, directory, tree_max_jobs=100_000, database_timeout=30.0):
    process = subprocess.Popen([sys.executable, "-c", CRAWL_API_SERVER, url, project, job, str(row_id),
                                str(directory), str(tree_max_jobs), str(database_timeout)], stdout=subprocess.PIPE,
                               stdin=subprocess.PIPE, text=True)
    try:
        yield CrawlApiServer(process)
    finally:
        process.kill()
        process.wait()


# --- a webhook receiver -------------------------------------------------------------------------------------------


class WebhookReceiver:
    """A real HTTP receiver on loopback (threads of this process) that records each POST it answers: ``received``
    holds (headers, raw body). ``stop()`` then ``start()`` takes it down and up on the same port (connections are
    refused meanwhile). With ``hold`` set, the next request is taken in (``held``) and left unanswered until
    ``release`` is set: a delivery in progress."""

    def __init__(self, status: int = 200):
        import http.server
        import threading

        self.status = status
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.held: list[tuple[dict[str, str], bytes]] = []
        self.hold, self.release = threading.Event(), threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {name.lower(): value for name, value in self.headers.items()}
                with receiver.lock:
                    holding = receiver.hold.is_set()
                    receiver.hold.clear()
                    (receiver.held if holding else receiver.received).append((headers, body))
                if holding:
                    receiver.release.wait(300)
                    return  # never answered: the sender died meanwhile
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.handler = Handler
        self.port = 0
        self.server = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        import http.server
        import threading

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release.set()  # a request still held is let go
        self.stop()

    def bodies(self) -> list[dict]:
        with self.lock:
            return [json.loads(body) for _, body in self.received]


def connections_held(pid: int, port: int) -> int:
    """How many TCP connections to ``port`` the process ``pid`` holds open, from /proc (what ``ss -tnp`` shows): a
    connection it closed counts no more, even while the server still runs the statement it abandoned."""
    sockets = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
    held = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                established = fields[3] == "01"
                if established and int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] in sockets:
                    held += 1
    return held


class ConnectionSampler(threading.Thread):
    """The most connections the package held to one database at once, sampled every 50 ms: as Postgres counts them
    (``peak``, by application_name; the test's own queries left out) and, for the processes in ``pids`` (name ->
    pid), as the processes hold them (``held``)."""

    def __init__(self, admin_url: str, pids: dict[str, int] | None = None):
        super().__init__(daemon=True)
        self.admin_url = admin_url
        self.pids = pids or {}
        self.port = make_url(admin_url).port or 5432
        self.peak: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.peak_total = 0
        self.stopping = threading.Event()

    def run(self):
        while not self.stopping.wait(0.05):
            rows = query(self.admin_url, "SELECT application_name, count(*) FROM pg_stat_activity "
                                         "WHERE datname = current_database() AND application_name LIKE 'scrapyd%%' "
                                         "GROUP BY application_name")
            for name, count in rows:
                self.peak[name] = max(self.peak.get(name, 0), count)
            self.peak_total = max(self.peak_total, sum(count for _, count in rows))
            for name, pid in self.pids.items():
                self.held[name] = max(self.held.get(name, 0), connections_held(pid, self.port))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.join()


def heard(connection, wait: float) -> list[tuple[str, str]]:
    """What a LISTENing connection received within ``wait`` seconds (a NOTIFY arrives at its sender's commit, which
    the enqueue's return follows: the wait only covers the way over the loopback)."""
    select.select([connection], [], [], wait)
    connection.poll()
    received = [(n.channel, n.payload) for n in connection.notifies]
    connection.notifies.clear()
    return received


# --- a node's processes ------------------------------------------------------------------------------------------


def parent_pid(pid: int) -> int:
    """The parent of process ``pid``, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def children_of(pid: int, command: bytes = b"") -> list[int]:
    """The processes whose parent is ``pid`` (and whose command line holds ``command``)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and parent_pid(int(entry)) == pid and command in open(f"/proc/{entry}/cmdline",
                                                                                        "rb").read():
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def spawner_pid(node) -> int:
    """The node's spawner (node/spawner.py), which starts its cold crawls, `scrapy list` and warm processes."""
    return wait_for(lambda: children_of(node.process.pid, b"scrapyd_pgqueue.node.spawner"), 30, "the spawner")[0]


def unprivileged_path() -> str:
    """The example project, this package and the test environment's libraries, for the system's interpreter run by
    another user than root: the tests' own interpreter may sit in a directory only root can reach."""
    import site

    from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT, REPOSITORY

    return os.pathsep.join([str(EXAMPLE_PROJECT), str(REPOSITORY), *site.getsitepackages()])
