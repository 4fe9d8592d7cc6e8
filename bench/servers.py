"""A private Postgres (role and database ``scrapyd``) with a PgBouncer in front of it, for the suites that run
servers of their own (scale, notify), and plain connections to them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from bench.processes import child_pids

ROLE = DATABASE = "scrapyd"
PGBOUNCER_POOL = 20


class Servers:
    """A private Postgres (role and database ``scrapyd``) and PgBouncer in front of it; ``remove()`` ends both."""

    def __init__(self, max_connections: int, max_client_conn: int, log):
        self.max_connections = max_connections
        self.max_client_conn = max_client_conn
        self.log = log
        self.postgres = None
        self.bouncer = None
        self.fd_limit = None

    def start(self) -> Servers:
        from scrapyd_pgqueue.database import db
        from scrapyd_pgqueue.local import devdb

        self.postgres = devdb.LocalPostgres(settings={"max_connections": str(self.max_connections)})
        self.postgres.create()
        self.postgres.start()
        self.admin_url = self.postgres.url  # superuser, database postgres: the bench's reads, never the nodes'
        with contextlib.closing(connect(self.admin_url)) as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {ROLE} LOGIN")
            cursor.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        self.direct_url = f"postgresql://{ROLE}@127.0.0.1:{self.postgres.port}/{DATABASE}"
        # The schema, once, before any node: 100 nodes would otherwise queue on the migration lock.
        db.get_engine(self.direct_url, application_name="scrapyd-pgqueue-bench").dispose()
        self.bouncer = devdb.LocalPgBouncer(self.direct_url, pool_size=PGBOUNCER_POOL,
                                            max_client_conn=self.max_client_conn)
        self.bouncer.start()
        self.fd_limit = self._raise_fd_limit()
        self.url = self.bouncer.url
        return self

    def _raise_fd_limit(self) -> dict:
        """A guard: PgBouncer needs about max_client_conn open files, and only logs "kernel file descriptor limit:
        1024 ... max expected fd use: ..." when it has fewer (2,000 clients then fail to connect). devdb starts it
        with this process's limit (20,000 here); started through runuser it got 1,024. A service manager sets it
        with LimitNOFILE. Raised here (soft limit up to the hard one, as PgBouncer's user) only if too low."""
        pid = self.bouncer_pid()
        needed = self.max_client_conn + 2 * PGBOUNCER_POOL + 64
        before = _open_files_limit(pid)
        if before is not None and before[0] < needed:
            soft = min(needed, before[1])
            command = ["prlimit", f"--pid={pid}", f"--nofile={soft}:{before[1]}"]
            if os.geteuid() == 0:
                command = ["runuser", "-u", "postgres", "--", *command]
            completed = subprocess.run(command, capture_output=True, text=True, timeout=10)
            if completed.returncode != 0:
                self.log(f"scale: could not raise PgBouncer's open files limit: {completed.stderr.strip()}")
        return {"before": before, "after": _open_files_limit(pid), "needed": needed}

    def bouncer_pid(self) -> int | None:
        if self.bouncer is None or self.bouncer.process is None:
            return None
        children = child_pids().get(self.bouncer.process.pid, [])  # started through runuser: its child
        return children[0] if children else self.bouncer.process.pid

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.postgres.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def remove(self) -> None:
        for server in (self.bouncer, self.postgres):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.remove()


def connect(url: str):
    import psycopg2
    from sqlalchemy import make_url

    parsed = make_url(url)
    connection = psycopg2.connect(host=parsed.host, port=parsed.port, user=parsed.username,
                                  dbname=parsed.database, application_name="scrapyd-pgqueue-bench")
    connection.autocommit = True
    return connection


def connect_bouncer(servers: Servers):
    """PgBouncer's admin console (SHOW ...)."""
    import psycopg2

    connection = psycopg2.connect(host="127.0.0.1", port=servers.bouncer.port, user="postgres", dbname="pgbouncer")
    connection.autocommit = True
    return connection


def _open_files_limit(pid) -> tuple[int, int] | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    except (OSError, ValueError):
        pass
    return None
