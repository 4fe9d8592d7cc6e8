"""Real Scrapyd nodes on loopback ports, sharing one database: the local cluster and the tests' harness.

Each node gets a directory of its own as working directory and ``HOME`` (Scrapyd reads ``./scrapyd.conf``,
``~/.scrapyd.conf`` and the nearest ``scrapy.cfg``), the repository's ``scrapyd.cfg`` as ``./scrapyd.conf``
(and as ``~/.scrapy.cfg`` for Scrapy), and a clean environment, so nodes never read each other's or the
user's configuration.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from scrapyd_pgqueue.config import DATABASE_URL_VARIABLE, NODE_NAME_VARIABLE
from scrapyd_pgqueue.local.devdb import free_port
from scrapyd_pgqueue.node.spawner import crawl_code_paths, unreachable_by_others

REPOSITORY = Path(__file__).resolve().parents[2]
NODE_CONFIG = REPOSITORY / "scrapyd.cfg"
EXAMPLE_PROJECT = REPOSITORY / "example_project"
# What a node inherits from the caller's environment; everything else (SCRAPYD_*, HOME, ...) is set here.
INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT", "TMPDIR")


class ScrapydNode:
    """One ``scrapyd`` process."""

    def __init__(self, name: str, directory: Path, database_url: str, config: Mapping[str, str], env: Mapping,
                 base_config: str | None = None, user: int | None = None, python: str = sys.executable):
        self.name = name
        self.user = user  # a uid (and gid) to run as, in no other group, with no capability (not root's powers)
        self.python = python  # the interpreter it runs on (and so its crawls)
        self.base_config = NODE_CONFIG.read_text() if base_config is None else base_config  # ./scrapyd.conf
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.database_url = database_url
        self.config = {"node_name": name, **config}  # Scrapyd's own answers read node_name from its config
        self.extra_env = dict(env)
        self.process: subprocess.Popen | None = None
        self.logfile = directory / "scrapyd.log"

    def environment(self) -> dict[str, str]:
        env = {key: os.environ[key] for key in INHERITED if key in os.environ}
        pythonpath = [str(EXAMPLE_PROJECT)] if EXAMPLE_PROJECT.is_dir() else []
        env.update(
            HOME=str(self.directory),
            PYTHONPATH=os.pathsep.join(pythonpath + [p for p in [os.environ.get("PYTHONPATH")] if p]),
            PYTHONUNBUFFERED="1",
            SCRAPYD_HTTP_PORT=str(self.port),
            SCRAPYD_BIND_ADDRESS="127.0.0.1",
            SCRAPYD_NODE_URL=self.url,
        )
        env[DATABASE_URL_VARIABLE] = self.database_url
        env[NODE_NAME_VARIABLE] = self.name
        env.update(self.extra_env)
        return env

    def write_config(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "scrapyd.conf").write_text(self.base_config)
        # Scrapy (``scrapy list`` for schedule.json) finds baked-in projects only in a scrapy.cfg [settings].
        # ~/.scrapy.cfg, which Scrapyd does not read (as /etc/scrapy.cfg in the image): a ./scrapy.cfg would be
        # Scrapyd's "nearest scrapy.cfg", read last, and its [scrapyd] section would undo the overrides below.
        (self.directory / "scrapy.cfg").unlink(missing_ok=True)
        (self.directory / ".scrapy.cfg").unlink(missing_ok=True)
        (self.directory / ".scrapy.cfg").symlink_to("scrapyd.conf")
        # Per-node overrides in ~/.scrapyd.conf, which Scrapyd reads after ./scrapyd.conf.
        config = dict(self.config)
        if "EXAMPLE_RECORD_DIR" in self.extra_env and "crawl_paths" not in config:
            config["crawl_paths"] = self.extra_env["EXAMPLE_RECORD_DIR"]  # the example spiders' records (Landlock)
            records = Path(config["crawl_paths"])
            records.mkdir(parents=True, exist_ok=True)  # a path Landlock is given must exist
            if os.geteuid() == 0:
                records.chmod(0o1777)  # crawls under their project's users append to it, as to /tmp
        overrides = "".join(f"{key} = {value}\n" for key, value in config.items())
        (self.directory / ".scrapyd.conf").write_text(f"[scrapyd]\n{overrides}")

    def start(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # A second process could not bind the port, and the first would be forgotten and never stopped.
            raise RuntimeError(f"node {self.name} is already running (pid {self.process.pid})")
        self.write_config()
        with open(self.logfile, "ab") as log:
            # No capability kept, none to gain (root's uid included): no reading or tracing past the kernel's checks.
            as_user = [] if self.user is None else [
                "setpriv", f"--reuid={self.user}", f"--regid={self.user}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all"]
            self.process = subprocess.Popen(
                [*as_user, self.python, "-m", "scrapyd", "--pidfile="],
                cwd=self.directory,
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches the cluster command, which stops nodes
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"node {self.name} exited at start-up; see {self.logfile}:\n{self.log_tail()}")
            try:
                self.get("daemonstatus.json", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # it answers: a node with basic authentication (username, password) asks for credentials
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {self.name} not ready after {timeout}s:\n{self.log_tail()}") from None
                time.sleep(0.1)

    def wait_serving(self, timeout: float = 120.0) -> None:
        """Until daemonstatus.json says ok: the node reaches the database (a readiness probe's check)."""
        deadline = time.monotonic() + timeout
        while (answer := self.get("daemonstatus.json", timeout=5))["status"] != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name} not serving after {timeout}s: {answer.get('message')}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        """Stop the node (SIGTERM: graceful) and wait for it; SIGKILL if it does not stop in time."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(sig)
        return self.wait_stopped(timeout)

    def wait_stopped(self, timeout: float = 30.0) -> int | None:
        """Wait for the node process to exit; SIGKILL it if it has not within ``timeout``."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL the node process alone, as a crash would (its crawls are left orphaned)."""
        self.stop(signal.SIGKILL)

    def end_crawls(self, timeout: float = 3.0) -> None:
        """End the crawls a stopped node left running: Scrapyd does not stop its crawls when it stops.

        The node leads a process group of its own (``start_new_session``), which its crawls inherit.
        SIGTERM first (Scrapy closes the spider), SIGKILL for what is still there after ``timeout``.
        """
        if self.process is None or self.process.poll() is None:
            return  # never started, or still running: its crawls are its own business
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return  # the group is empty
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.process.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)

    # --- HTTP API ----------------------------------------------------------------------------------------------

    def get(self, endpoint: str, timeout: float = 30, **params) -> dict:
        query = urllib.parse.urlencode(params, doseq=True)
        return self._request(f"{self.url}{endpoint}?{query}", None, timeout)

    def post(self, endpoint: str, timeout: float = 30, **params) -> dict:
        return self._request(f"{self.url}{endpoint}", urllib.parse.urlencode(params, doseq=True).encode(), timeout)

    def post_json(self, endpoint: str, body, timeout: float = 30) -> dict:
        """A JSON body (``schedule_batch.json``)."""
        return self._request(f"{self.url}{endpoint}", json.dumps(body).encode(), timeout,
                             {"Content-Type": "application/json"})

    def _request(self, url: str, data: bytes | None, timeout: float, headers: dict | None = None) -> dict:
        request = urllib.request.Request(url, data=data, headers=headers or {})
        # The node's own credentials (Scrapyd then asks every request for them: basic authentication), from its
        # environment as Scrapyd reads them first, else from its configuration.
        username = self.extra_env.get("SCRAPYD_USERNAME") or self.config.get("username")
        password = self.extra_env.get("SCRAPYD_PASSWORD") or self.config.get("password")
        if username and password:
            token = base64.b64encode(f"{username}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)


class LocalCluster:
    """N Scrapyd nodes on loopback sharing ``database_url``; a context manager that stops them all."""

    def __init__(
        self,
        database_url: str,
        nodes: int = 3,
        *,
        directory: str | Path | None = None,
        config: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        name_prefix: str = "node",
        base_config: str | None = None,
        node_config: Mapping[str, Mapping[str, str]] | None = None,
    ):
        """``base_config``: the nodes' ./scrapyd.conf (default: the repository's scrapyd.cfg); ``node_config``:
        options of single nodes by name, over ``config``."""
        self.directory = Path(directory or tempfile.mkdtemp(prefix="scrapyd-pgqueue-cluster-"))
        config = dict(config or {})
        self.crawls_as_root = self._crawl_users(config)
        self.nodes = [
            ScrapydNode(
                name, self.directory / name, database_url, {**(config or {}), **(node_config or {}).get(name, {})},
                env or {}, base_config,
            )
            for name in (f"{name_prefix}{i}" for i in range(1, nodes + 1))
        ]

    def _crawl_users(self, config: dict) -> str:
        """Nodes started by root run each project's crawls under a uid of its own (crawl_users), which needs the
        nodes' directory and this Python readable by other users. Where Python is not (a private home's), a local
        cluster still runs, its crawls as root: the warning that says so, '' when none."""
        if os.geteuid() != 0 or config.get("crawl_users", "") == "off":  # unset: the option's default, on
            return ""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o711)  # the nodes, run as another user, pass through; nobody lists it
        unreachable = unreachable_by_others(crawl_code_paths())
        if not unreachable:
            return ""
        config["crawl_users"] = "off"
        return (f"crawls run as root, in one trust domain: the users crawls would run as cannot reach "
                f"{', '.join(unreachable)} (crawl_users = off). Install Python where every user may read it for a "
                "user per project.")

    def start(self, timeout: float = 60.0) -> LocalCluster:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_ready(timeout)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGTERM)  # all at once; a second SIGTERM makes twistd complain
        for node in self.nodes:
            node.wait_stopped()
        for node in self.nodes:
            node.end_crawls()

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
