"""The reference: the same crawl on scrapy-redis, N ``scrapy runspider`` workers sharing a redis-server.

The redis-server is started here, on 127.0.0.1 on a free port, without persistence, and emptied before each crawl.
The workers run ``redis_site_spider.py`` with the example project's settings and scrapy-redis's scheduler and
dupefilter, as its documentation sets them for a distributed crawl: ``SCHEDULER_PERSIST`` on (otherwise the first
worker to close empties the shared queue and dupefilter under the others), and ``MAX_IDLE_TIME_BEFORE_CLOSE`` so
that idle workers end (scrapy-redis has no other end: a worker closes once idle that long).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench.site import Site
from bench.suites.frontier import records
from scrapyd_pgqueue.local.devdb import free_port

SPIDER = Path(__file__).with_name("redis_site_spider.py")
START_KEY = "site_redis:start_urls"
# Seconds a worker stays idle before it closes. Long enough to outlast the workers' start-up on 2 busy cores: the
# idle clock of scrapy-redis 0.9 starts when the spider class is imported, not when the worker last worked.
MAX_IDLE_SECONDS = 15
DEADLINE = 600.0


def missing() -> str | None:
    """Why the reference cannot run here, None when it can."""
    if shutil.which("redis-server") is None:
        return "redis-server not found (Debian: apt-get install redis-server): scrapy-redis series not measured"
    if importlib.util.find_spec("scrapy_redis") is None:
        return "scrapy_redis not installed (pip install scrapy-redis, in the bench extra): scrapy-redis series " \
               "not measured"
    return None


class RedisServer:
    """A private redis-server: no RDB snapshots, no append-only file."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.command("PING")
                return self
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"frontier: redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def command(self, *words: str) -> bytes:
        """One command in RESP, its raw answer (this suite needs no client library of its own)."""
        request = f"*{len(words)}\r\n".encode() + b"".join(
            f"${len(word.encode())}\r\n{word}\r\n".encode() for word in words)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
            connection.sendall(request)
            return connection.recv(65536)


def crawl(redis: RedisServer, site: Site, workers: int, directory: Path, settings: dict[str, str],
          kill_at: int | None = None) -> dict:
    """One crawl of ``site`` by ``workers`` workers; ``kill_at``: SIGKILL one worker once the site has answered that
    many pages. The start URL is pushed and the gate opened once every worker's spider exists."""
    redis.command("FLUSHALL")
    directory.mkdir(parents=True, exist_ok=True)
    record_dir = directory / "records"
    jobs = [f"redis-{index}" for index in range(1, workers + 1)]
    processes = {job: _start_worker(redis, site, job, record_dir, directory, settings) for job in jobs}
    try:
        records.wait_created(record_dir, jobs, lambda: _dead(processes), DEADLINE)
        redis.command("LPUSH", START_KEY, json.dumps({"url": site.url(0)}))
        opened = time.time()
        site.open_gate()
        victim = None
        if kill_at is not None:
            victim = records.wait_and_pick_victim(site, kill_at, record_dir, jobs, DEADLINE)
            processes[victim].send_signal(signal.SIGKILL)
        _wait_ended(processes, directory)
        ended = time.time()
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
    return records.summary(site, record_dir, jobs, opened, ended, victim)


def _start_worker(redis: RedisServer, site: Site, job: str, record_dir: Path, directory: Path,
                  settings: dict[str, str]) -> subprocess.Popen:
    # Imported here, as the other suites do: the cluster module pulls in the node's code.
    from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT

    options = {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_PERSIST": "True",
        "MAX_IDLE_TIME_BEFORE_CLOSE": str(MAX_IDLE_SECONDS),
        "REDIS_URL": redis.url,
        **settings,
    }
    command = [sys.executable, "-m", "scrapy", "runspider", str(SPIDER), "-a", f"site={site.home}",
               "-a", f"_job={job}"]
    for name, value in options.items():
        command += ["-s", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE_PROJECT), "SCRAPY_SETTINGS_MODULE": "example.settings",
           "EXAMPLE_RECORD_DIR": str(record_dir)}
    with open(directory / f"{job}.log", "ab") as log:
        return subprocess.Popen(command, cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)


def _dead(processes: dict[str, subprocess.Popen]) -> str | None:
    for job, process in processes.items():
        if process.poll() is not None:
            return f"scrapy-redis worker {job} exited with {process.returncode} before the crawl began"
    return None


def _wait_ended(processes: dict[str, subprocess.Popen], directory: Path) -> None:
    deadline = time.monotonic() + DEADLINE
    for job, process in processes.items():
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            tail = (directory / f"{job}.log").read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(f"frontier: scrapy-redis worker {job} did not end:\n" + "\n".join(tail)) from None

