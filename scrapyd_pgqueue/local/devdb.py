"""A throwaway Postgres server for the local cluster, the tests and the benchmark.

A container (testcontainers) where a Docker engine answers; otherwise a private cluster made with the
machine's ``initdb``/``pg_ctl`` on a free loopback port, run as the ``postgres`` user when we are root
(Postgres refuses to run as root). Either can be stopped and started again on the same port, for fault tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "400",
    "fsync": "off",  # throwaway data: durability buys nothing here
    "synchronous_commit": "off",
    "full_page_writes": "off",
}

# What PgBouncer runs on a server connection after every transaction (server_reset_query_always = 1): DISCARD ALL but
# its DISCARD PLANS, so a session's SET, temporary table, LISTEN, advisory lock or prepared statement never reaches
# another client while the claim function keeps its plan (a one-job claim: 0.33 ms median against 0.80 ms with
# DISCARD ALL and 0.30 ms with no reset, 3,000 claims each through PgBouncer in one run). A node's own sessions leave
# nothing that matters, but anyone on the node role's URL through PgBouncer (an operator's psql) shares the nodes'
# server connections. The price, one server transaction per statement (3 against 2: bench/pgbouncer_reset.py), is
# kept; docs/how-to/pgbouncer.md weighs it.
SERVER_RESET_QUERY = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
    "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES"
)
# The pooling policy of the suite's PgBouncer, as docker-compose.yml and the chart ship it (tests check they agree).
PGBOUNCER_SETTINGS = {
    "pool_mode": "transaction",
    "ignore_startup_parameters": "extra_float_digits",
    "server_reset_query": SERVER_RESET_QUERY,
    "server_reset_query_always": "1",
}


def free_port() -> int:
    """A free loopback port outside the kernel's ephemeral range, never the same one twice in this process.

    A port found by binding port 0 comes from the ephemeral range, and one of a hundred local nodes' outgoing
    connections can take it before the node listens; and a hundred random picks among ~25,000 ports would give
    two nodes the same port about one time in six.
    """
    ranges = _listening_ports()
    for _ in range(100):
        [chosen] = random.choices(ranges, weights=[len(ports) for ports in ranges])
        port = random.choice(chosen)
        with _handed_out_lock:
            if port in _handed_out:
                continue
            with contextlib.closing(socket.socket()) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise RuntimeError("no free loopback port outside the ephemeral range after 100 tries")


_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _listening_ports() -> list[range]:
    """Ports from 10000 up outside /proc's ephemeral range; 20000-29999 where there is no /proc (below Linux's
    usual 32768 and the 49152 of other systems)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return [range(20000, 30000)]
    ranges = [ports for ports in (range(10000, low), range(max(high + 1, 10000), 65536)) if ports]
    if not ranges:
        raise RuntimeError(f"the ephemeral port range {low}-{high} leaves no port from 10000 up to listen on")
    return ranges


def docker_engine_answers(timeout: float = 2.0) -> bool:
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=timeout)
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - any failure means "no engine"
        return False


def postgres_bin_dir() -> Path:
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
    """A Postgres cluster in a temporary directory, owned by this object.

    ``settings`` are written into ``postgresql.conf`` after (so over) ``SERVER_SETTINGS``, e.g.
    ``{"max_connections": "50"}``.
    """

    def __init__(self, port: int | None = None, settings: dict[str, str] | None = None):
        self.port = port or free_port()
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self.bin = postgres_bin_dir()
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
            for key, value in self.settings.items():
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

    @contextlib.contextmanager
    def paused(self):
        """Every process of the server stopped (SIGSTOP) inside the block: a storage stall or a VM pause, as
        clients see it (connections stay open, the kernel still acknowledges what they send, nothing answers)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True).stdout.split()
        processes = [postmaster, *map(int, children)]
        for pid in processes:
            _signal_if_alive(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            # Children first: the postmaster, once resumed, reaps a child that was already exiting when paused.
            for pid in reversed(processes):
                _signal_if_alive(pid, signal.SIGCONT)


def _signal_if_alive(pid: int, signum: int) -> None:
    """A backend may end between pgrep and the signal (a client that disconnected): nothing to pause then."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


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

    @contextlib.contextmanager
    def paused(self):
        """The container frozen (docker pause) inside the block: see LocalPostgres.paused."""
        self.container.get_wrapped_container().pause()
        try:
            yield
        finally:
            self.container.get_wrapped_container().unpause()


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")  # not on a user's PATH
    if found is None:
        raise RuntimeError("no pgbouncer: install it (Debian: apt-get install pgbouncer)")
    return found


class LocalPgBouncer:
    """Debian's PgBouncer in transaction pooling mode in front of ``server_url``, on a free loopback port.

    Every database of that server, even one created later, is reachable through it under the same name (a
    wildcard entry), so a client swaps only host and port (``url``, ``url_for``). Postgres sees at most
    ``pool_size`` connections per database from it. Like production PgBouncer it refuses the ``options``
    startup parameter. ``settings`` are written into its ``[pgbouncer]`` section over ``PGBOUNCER_SETTINGS``, e.g.
    ``{"server_reset_query_always": "0"}`` (the bench compares them).
    """

    def __init__(self, server_url: str, *, pool_size: int = 20, max_client_conn: int = 2000, port: int | None = None,
                 settings: dict[str, str] | None = None):
        from sqlalchemy import make_url

        self.binary = pgbouncer_binary()
        self.server = make_url(server_url)
        self.port = port or free_port()
        self.url = self.url_for(server_url)
        self.base = Path(tempfile.mkdtemp(prefix="scrapyd-pgqueue-pgbouncer-"))
        self.config = self.base / "pgbouncer.ini"
        self.logfile = self.base / "pgbouncer.log"
        self.pidfile = self.base / "pgbouncer.pid"
        self.outfile = self.base / "stderr.log"  # what it says before its logfile is open (a bad config)
        self.process: subprocess.Popen | None = None
        self._as_postgres = os.geteuid() == 0  # PgBouncer refuses to run as root
        # PgBouncer logs in to the server with the password its auth_file gives the user.
        self.passwords = {"postgres": "", self.server.username or "postgres": self.server.password or ""}
        self._write_users()
        self.settings = {
            "listen_addr": "127.0.0.1", "listen_port": str(self.port), "unix_socket_dir": "", "auth_type": "trust",
            "auth_file": str(self.base / "users.txt"), "admin_users": "postgres", "stats_users": "postgres",
            "default_pool_size": str(pool_size), "max_db_connections": str(pool_size),
            "max_client_conn": str(max_client_conn), **PGBOUNCER_SETTINGS,
            "logfile": str(self.logfile), "pidfile": str(self.pidfile), **(settings or {}),
        }
        self.config.write_text(
            f"[databases]\n* = host={self.server.host or '127.0.0.1'} port={self.server.port or 5432}\n\n[pgbouncer]\n"
            + "".join(f"{key} = {value}\n" for key, value in self.settings.items())
        )
        if self._as_postgres:
            for path in [self.base, *self.base.iterdir()]:
                shutil.chown(path, "postgres", "postgres")

    def _write_users(self) -> None:
        # auth_type = trust still wants each user listed.
        def quoted(text: str) -> str:
            return '"' + text.replace('"', '""') + '"'

        (self.base / "users.txt").write_text(
            "".join(f"{quoted(user)} {quoted(password)}\n" for user, password in sorted(self.passwords.items()))
        )

    def allow(self, user: str) -> None:
        """Let ``user`` in too (a role created after start, which the server trusts)."""
        self.passwords.setdefault(user, "")
        self._write_users()
        if self.running():
            self.show("RELOAD")

    def url_for(self, url: str) -> str:
        """``url`` (a database on the same server) through this PgBouncer."""
        from sqlalchemy import make_url

        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        """Start it in the foreground (so ``process`` is PgBouncer itself) and wait until it accepts connections."""
        if self.running():
            raise RuntimeError(f"pgbouncer on port {self.port} is already running (pid {self.process.pid})")
        # As postgres without runuser: runuser's PAM session would also cut the open files limit to 1,024.
        user = {"user": "postgres", "group": "postgres", "extra_groups": []} if self._as_postgres else {}
        with open(self.outfile, "ab") as out:
            self.process = subprocess.Popen([self.binary, str(self.config)], stdout=out, stderr=out, **user)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start on port {self.port}:\n{self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        if not self.outfile.exists():
            return ""
        return "\n".join(self.outfile.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop at once: SIGTERM is PgBouncer's immediate shutdown (before 1.23; later ones wait for clients to
        leave, hence the SIGKILL after a few seconds)."""
        if self.running():
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.pidfile.unlink(missing_ok=True)  # left by a SIGKILL; its pid may belong to another process later

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def show(self, command: str) -> list[dict]:
        """A ``SHOW ...`` of PgBouncer's admin console (SHOW POOLS, SHOW CLIENTS, SHOW SERVERS), as dicts."""
        from scrapyd_pgqueue.database import db

        connection = db.direct_connection(
            host="127.0.0.1", port=self.port, user="postgres", dbname="pgbouncer", connect_timeout=10
        )
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(command)
                if cursor.description is None:
                    return []
                names = [column.name for column in cursor.description]
                return [dict(zip(names, row)) for row in cursor.fetchall()]
        finally:
            connection.close()


def _wait_until_accepting(port: int, timeout: float = 60.0) -> None:
    from scrapyd_pgqueue.database import db

    deadline = time.monotonic() + timeout
    while True:
        try:
            db.direct_connection(host="127.0.0.1", port=port, user="postgres", password="postgres",
                                 connect_timeout=2).close()
            return
        except db.OperationalError:
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
