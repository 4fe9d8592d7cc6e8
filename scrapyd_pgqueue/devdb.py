"""A throwaway Postgres server for the local cluster, the tests and the benchmark.

A container (testcontainers) where a Docker engine answers; otherwise a private cluster made with the
machine's ``initdb``/``pg_ctl`` on a free loopback port, run as the ``postgres`` user when we are root
(Postgres refuses to run as root). Either can be stopped and started again on the same port, for fault tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "400",
    "fsync": "off",  # throwaway data: durability buys nothing here
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def docker_engine_answers(timeout: float = 2.0) -> bool:
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=timeout)
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - any failure means "no engine"
        return False


def _postgres_bin_dir() -> Path:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    raise RuntimeError(
        "no Docker engine and no Postgres server binaries (initdb): install Postgres "
        "(Debian: apt-get install postgresql) or give a database URL"
    )


class LocalPostgres:
    """A Postgres cluster in a temporary directory, owned by this object."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.bin = _postgres_bin_dir()
        self.base = Path(tempfile.mkdtemp(prefix="scrapyd-pgqueue-db-"))
        self.data = self.base / "data"
        self.logfile = self.base / "postgres.log"
        self.user = "postgres"
        self.url = f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        # pg_ctl keeps the caller's stdout open unless given -l; never capture its output through a pipe.
        return subprocess.run(command, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def create(self) -> None:
        if self._as_postgres:
            shutil.chown(self.base, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.data}'\n")
            for key, value in SERVER_SETTINGS.items():
                conf.write(f"{key} = '{value}'\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


class ContainerPostgres:
    """Postgres in a Docker container bound to a fixed loopback port, so a restart keeps the URL."""

    def __init__(self, image: str = "postgres:16-alpine"):
        from testcontainers.postgres import PostgresContainer

        self.port = free_port()
        self.container = PostgresContainer(image, username="postgres", password="postgres", dbname="postgres")
        self.container.with_bind_ports(5432, self.port)
        self.url = f"postgresql://postgres:postgres@127.0.0.1:{self.port}/postgres"

    def create(self) -> None:
        self.container.start()

    def start(self) -> None:
        self.container.get_wrapped_container().start()
        _wait_until_accepting(self.port)

    def stop(self, mode: str = "fast") -> None:
        self.container.get_wrapped_container().stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.container.stop()


def _wait_until_accepting(port: int, timeout: float = 60.0) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user="postgres", password="postgres", connect_timeout=2).close()
            return
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def throwaway_postgres() -> LocalPostgres | ContainerPostgres:
    """A started throwaway server: a container where Docker answers, else a local one. Call ``remove()`` after."""
    server = ContainerPostgres() if docker_engine_answers() else LocalPostgres()
    server.create()
    if isinstance(server, LocalPostgres):
        server.start()
    return server
