"""The connector: the only module that knows the driver.

Scrapyd creates queue and storage objects often (per project, on every deploy, in every crawl
subprocess), so engines are shared per process and URL, and the schema is migrated once per engine.
"""

from __future__ import annotations

import functools
import logging
import os
import select
import threading
import time
from importlib.resources import files

import psycopg2
from psycopg2 import sql
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, DisconnectionError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5  # seconds before an unreachable database is an error
STATEMENT_TIMEOUT_MS = 15_000  # no queue statement legitimately runs longer
PING_AFTER_IDLE_SECONDS = 1.0  # a pooled connection unused this long is checked before use
# Key of the session advisory lock that serialises migrations between nodes starting together.
MIGRATION_LOCK_KEY = 0x5C4A_9D0B
# Alembic's table recording the schema's revision.
VERSION_TABLE = "scrapyd_pgqueue_version"

_engines: dict[tuple[int, str], Engine] = {}
_migrated: set[tuple[int, str]] = set()  # engines whose schema this process has brought to the newest version
_engines_lock = threading.Lock()


class DatabaseError(RuntimeError):
    """The database could not do what was asked; the message never holds the password."""


def normalise_url(url: str) -> URL:
    parsed = make_url(url)
    if parsed.drivername in ("postgres", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def describe(url: str | URL) -> str:
    """Where the database is, for messages: host, port and name, no password."""
    parsed = make_url(url) if isinstance(url, str) else url
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"


def get_engine(url: str, application_name: str = "scrapyd-pgqueue", migrate_schema: bool = True) -> Engine:
    """The process's engine for ``url``, created (and the schema migrated) on first use.

    ``migrate_schema=False`` is for the crawl subprocess, which only reads eggs from a schema its node has
    migrated: the migration check costs about 0.4 s of Alembic start-up in every crawl. A later call without it
    still migrates the same engine once.
    """
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is not None and (key in _migrated or not migrate_schema):
        return engine
    with _engines_lock:
        if key not in _engines:
            engine = create_engine(
                normalise_url(url),
                pool_size=5,
                max_overflow=10,
                pool_timeout=CONNECT_TIMEOUT,
                connect_args={
                    "connect_timeout": CONNECT_TIMEOUT,
                    "application_name": application_name,
                    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={STATEMENT_TIMEOUT_MS}",
                    # Notice a silently dead server (a pulled cable, a frozen VM) within seconds.
                    "keepalives": 1,
                    "keepalives_idle": 5,
                    "keepalives_interval": 2,
                    "keepalives_count": 3,
                },
            )
            _ping_connections_after_idle(engine)
            _engines[key] = engine
        if migrate_schema and key not in _migrated:
            with translate_errors(_engines[key].url):
                migrate(_engines[key])
            _migrated.add(key)
        return _engines[key]


def _ping_connections_after_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only when it sat idle: a restarted Postgres leaves dead connections in
    the pool, but pinging every checkout (``pool_pre_ping``) doubles the round trips of a busy claim loop."""

    @event.listens_for(engine, "checkin")
    def checked_in(dbapi_connection, record):
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checked_out(dbapi_connection, record, proxy):
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            dbapi_connection.rollback()
        except psycopg2.Error:
            raise DisconnectionError() from None  # the pool replaces it with a fresh connection


class translate_errors:
    """Turn driver errors into ``DatabaseError`` naming host and port (SQLAlchemy hides the password)."""

    def __init__(self, url: URL):
        self.url = url

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and isinstance(exc, DBAPIError):
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
            raise DatabaseError(f"database at {describe(self.url)}: {reason}") from exc
        return False


@functools.cache
def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("scrapyd_pgqueue") / "migrations"))
    return config


def _schema_revisions(connection) -> set[str]:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    revisions = set(context.get_current_heads())
    connection.rollback()
    return revisions


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest version; safe when many nodes start at the same instant.

    A current schema is only read: no lock and no DDL, so nodes may use a role without the right to change
    the schema once ``scrapyd-pgqueue migrate`` has run as its owner.
    """
    from alembic import command
    from alembic.script import ScriptDirectory

    config = _alembic_config()
    newest = set(ScriptDirectory.from_config(config).get_heads())
    with engine.connect() as connection:
        current = _schema_revisions(connection)
        if current == newest:
            return
        # A session lock (held across the migration's own transaction): the other nodes wait, then find
        # the schema current and do nothing.
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        connection.commit()
        try:
            config.attributes["connection"] = connection
            try:
                command.upgrade(config, "head")
            except DBAPIError as e:
                if getattr(e.orig, "pgcode", None) != "42501":  # insufficient_privilege
                    raise
                connection.rollback()
                raise DatabaseError(
                    f"database at {describe(engine.url)}: the schema is at revision {sorted(current) or 'none'}, "
                    f"this version of scrapyd_pgqueue needs {sorted(newest)}, and this database role may not "
                    "change it: run `scrapyd-pgqueue migrate` once as the schema's owner"
                ) from None
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()


class NotificationListener(threading.Thread):
    """LISTEN on channels in a thread of its own and hand each notification to ``on_notify(channel, payload)``.

    A thread with a blocking ``select`` rather than a socket watched by Twisted's reactor: libpq closes the
    socket itself when the server goes away, and an epoll reactor then keeps a stale descriptor registered.
    Reconnects for ever with a capped backoff and calls ``on_reconnect()`` after each reconnect, since
    notifications sent while it was away are lost (NOTIFY is a hint; the caller's polling is the floor).
    """

    def __init__(self, url: str, channels, on_notify, on_reconnect=None, name: str = "pgqueue-listener"):
        super().__init__(name=name, daemon=True)
        self.url = url
        self.channels = list(channels)
        self.on_notify = on_notify
        self.on_reconnect = on_reconnect
        self.stopping = threading.Event()
        self.connected = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        backoff = 0.2
        first = True
        while not self.stopping.is_set():
            connection = None
            try:
                connection = self._connect()
                self.connected.set()
                backoff = 0.2
                if not first and self.on_reconnect is not None:
                    self.on_reconnect()
                first = False
                while not self.stopping.is_set():
                    if select.select([connection], [], [], 1.0)[0]:
                        connection.poll()
                        while connection.notifies:
                            notify = connection.notifies.pop(0)
                            self.on_notify(notify.channel, notify.payload)
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                self.connected.clear()
                log.warning("notification listener on %s lost its connection (%s); reconnecting",
                            describe(self.url), str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if connection is not None:
                    connection.close()

    def _connect(self):
        url = normalise_url(self.url)
        connection = psycopg2.connect(
            host=url.host, port=url.port or 5432, user=url.username, password=url.password, dbname=url.database,
            connect_timeout=CONNECT_TIMEOUT, application_name="scrapyd-pgqueue-listener",
            keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
            **url.query,
        )
        connection.autocommit = True
        with connection.cursor() as cursor:
            for channel in self.channels:
                cursor.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        return connection
