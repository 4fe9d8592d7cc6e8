"""The connector: a process's engines, the store's operations on them, and the schema's migration (the database's
clock is ``clock.py``'s).

The store reaches psycopg2 through this module and the two below it: ``connection_pool.py`` (a fixed pool of
connections) and ``sql.py`` (statements, results, errors). SQLAlchemy and Alembic are imported only when the schema
must change.

Scrapyd creates queue and storage objects often (per project, on every deploy, in every crawl subprocess), so
engines are shared per process and URL, and the schema is migrated once per engine.

A node's budget of server connections is fixed: with ``listen_notify`` on, a pool of ``database_pool_size``
(default 2, no overflow) for every statement of the process's work, and one session connection that LISTENs and
carries the lease thread's statements (``session_engine``): 3 by default. With it off, the lease keeps a connection of
its own and the pool has one fewer: 2 by default. With ``listen_url`` (``database_url`` is PgBouncer) the lease keeps
a PgBouncer connection of its own, and Postgres sees one connection per node, the listener's.

Nothing here relies on session state across transactions, so ``database_url`` may point at PgBouncer in transaction
pooling mode: timeouts ride on each statement (``SET LOCAL`` in the same query string), the migration lock is a
transaction-level advisory lock, and psycopg2 prepares nothing on the server.

Every wait is bounded on the client side too, and a server that refuses for now is waited for: see ``waits.py``,
whose names this module offers as its own (``db.deadline``, ``db.when_served``...).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from importlib.resources import files

import psycopg2

from scrapyd_pgqueue.database.connection_pool import (  # noqa: F401 - offered here too: the connector's callers know one module
    STATEMENT_PREFIX,
    TCP_SETTINGS,
    TRANSACTION_CONTROL,
    Connection,
    Engine,
    PoolTimeout,
)
from scrapyd_pgqueue.database.sql import DriverError, IntegrityError, Statement, driver_dsn, reads_only, text  # noqa: F401
from scrapyd_pgqueue.database.waits import (  # noqa: F401 - offered here too: the connector's callers know one module
    BUSY_SERVER_MESSAGES,
    CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    DatabaseTimeout,
    busy_server_log,
    connect_when_served,
    count_statement,
    deadline,
    describe,
    first_line,
    remaining_time,
    when_served,
)

log = logging.getLogger(__name__)

DEFAULT_POOL_SIZE = 2  # connections of a node's pool (database_pool_size)
# Key of the transaction-level advisory lock that serialises migrations between nodes starting together.
MIGRATION_LOCK_KEY = 0x5C4A_9D0B
MIGRATION_TIMEOUT = 120.0  # waiting for another node's migration included
# Alembic's table recording the schema's revision.
VERSION_TABLE = "scrapyd_pgqueue_version"

_engines: dict[tuple[int, str, str], Engine] = {}
_migrated: set[tuple[int, str, str]] = set()  # engines whose schema this process has brought to the newest version
_engines_lock = threading.Lock()


class DatabaseError(RuntimeError):
    """The database could not do what was asked; the message never holds the password."""


# --- operations ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def operation(engine: Engine, seconds: float | None = None):
    """One store operation: bounded by the engine's timeout (or ``seconds``), driver errors as DatabaseError."""
    seconds = engine.timeout if seconds is None else seconds
    left = remaining_time()
    seconds = seconds if left is None else max(0.0, min(seconds, left))
    with translate_errors(engine.url, seconds), deadline(seconds):
        yield


def engine_for_settings(settings) -> Engine:
    """The engine of a node: its pool size and operations' timeout come from its configuration. Without a listener
    the lease's own connection counts in ``database_pool_size`` (a node then holds that many in all)."""
    pool_size = settings.database_pool_size if settings.listen_notify else max(1, settings.database_pool_size - 1)
    return get_engine(
        settings.database_url, pool_size=pool_size, timeout=settings.database_timeout,
        application_name=application_name(settings.node_name),
    )


def lease_engine_for_settings(settings) -> Engine:
    """The engine of a node's lease thread: one connection that the node's work (pages, web services, finishes,
    maintenance) never holds, so a busy pool cannot make the node miss its heartbeat. The listener's session (idle
    between notifications) when it goes where the work goes; else a connection of its own on ``database_url``.

    A lease renewed straight to Postgres (``listen_url``) while the node's work goes through PgBouncer would outlive
    PgBouncer's refusals (``server_login_retry`` after a restart) that the leases of poll-only nodes behind it do
    not: nodes that kept theirs would take over the others' running jobs, and run them twice."""
    if settings.listen_notify and settings.listen_url in ("", settings.database_url):
        return session_engine(settings.database_url, settings.node_name, settings.database_timeout)
    return get_engine(
        settings.database_url, pool_size=1, timeout=settings.database_timeout, migrate_schema=False,
        application_name=application_name(settings.node_name, "-lease"), purpose="lease",
    )


def session_engine(url: str, node_name: str = "", timeout: float = DEFAULT_TIMEOUT) -> Engine:
    """The node's one session connection on ``url``: it LISTENs (``node/notifications.py``) and, between
    notifications, carries the lease thread's statements, which need no session state (a transaction pooler may
    serve them when LISTEN cannot work there)."""
    return get_engine(url, pool_size=1, timeout=timeout, migrate_schema=False, listening=True,
                      application_name=application_name(node_name, "-listener"), purpose="session")


def application_name(node_name: str, role: str = "") -> str:
    """How a node's connections show in pg_stat_activity (Postgres keeps 63 bytes)."""
    return f"scrapyd-pgqueue{role} {node_name}"[:63]


def too_late(engine: Engine, what: str) -> DatabaseError:
    """The error of a write that reached the database after its caller's deadline (see ``answer_by``)."""
    return DatabaseError(f"database at {describe(engine.url)}: answered too late; {what}")


def autocommit(engine: Engine):
    """A connection for one statement: no BEGIN and COMMIT around it (it is atomic alone), one round trip. The
    pool's connections are in autocommit for good: switching a psycopg2 connection to it and back costs round
    trips of its own."""
    return engine.connect()


def fetch_all(engine: Engine, statement: str, params: dict, timeouts: bool = True) -> list[tuple]:
    """One statement (psycopg2 placeholders) straight on a pooled connection's cursor, with the timeouts every
    statement carries (``timeouts=False``: a function call that sets its own), rows as plain tuples: for the claim,
    the node's hottest call, where every microsecond of client CPU shows in claims per second."""
    return _on_pooled_cursor(engine, STATEMENT_PREFIX + statement if timeouts else statement, params, fetch=True)


def run_outside_transaction(engine: Engine, statement: str) -> None:
    """A statement that may not run in a transaction block (VACUUM), so without the SET LOCAL timeouts: bounded by
    the thread's deadline (``operation``) alone."""
    _on_pooled_cursor(engine, statement, None, fetch=False)


def _on_pooled_cursor(engine: Engine, statement: str, params: dict | None, fetch: bool) -> list[tuple] | None:
    """Errors leave as any statement's (DriverError); a connection the driver closed is not pooled again."""
    connection = engine.checkout()
    try:
        with connection.cursor() as cursor:
            count_statement(writes=True)  # the claim, VACUUM
            for listener in engine.statement_listeners:
                listener(statement)
            cursor.execute(statement, params)
            return cursor.fetchall() if fetch else None
    except psycopg2.Error as e:
        raise DriverError.wrapping(e, statement, invalidated=bool(connection.closed)) from e
    finally:
        engine.checkin(connection)


@contextlib.contextmanager
def transaction(engine: Engine):
    """A connection for several statements, all or none: an explicit BEGIN ... COMMIT (ROLLBACK on error)."""
    with engine.connect() as connection, _all_or_none(connection.control, DriverError):
        yield connection


@contextlib.contextmanager
def _all_or_none(send: Callable[[str], object], broken: type[Exception]):
    """BEGIN, then COMMIT, or ROLLBACK when the block raises, each sent with ``send``. A ``broken`` error of the
    ROLLBACK is not the one to report: a broken connection has rolled back already."""
    send("BEGIN")
    try:
        yield
    except BaseException:
        with contextlib.suppress(broken):
            send("ROLLBACK")
        raise
    send("COMMIT")


# --- engines -------------------------------------------------------------------------------------------------


# The driver's error for a server that cannot be reached, or refused the login: what local tooling waits out.
OperationalError = psycopg2.OperationalError


def direct_connection(**params) -> psycopg2.extensions.connection:
    """A plain driver connection (libpq's keywords), outside every pool and bounded wait: for local tooling (a
    throwaway server's start, PgBouncer's admin console), never for a node's work."""
    return psycopg2.connect(**params)


def normalise_url(url: str) -> str:
    """The URL as SQLAlchemy takes it, for Alembic (``postgresql+psycopg2://``)."""
    return "postgresql+psycopg2://" + driver_dsn(url).split("://", 1)[1]


def get_engine(
    url: str,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    timeout: float = DEFAULT_TIMEOUT,
    migrate_schema: bool = True,
    application_name: str = "scrapyd-pgqueue",
    purpose: str = "",
    listening: bool = False,
) -> Engine:
    """The process's engine for ``url`` (and ``purpose``: a pool of its own), created (and the schema migrated) on
    first use.

    The first call in a process sets the pool's size and the operations' timeout. ``migrate_schema=False`` only
    reads a schema someone else migrated (the migration check costs about 0.4 s of Alembic start-up); a later
    call without it still migrates the same engine once.
    """
    key = (os.getpid(), url, purpose)
    engine = _engines.get(key)
    if engine is not None and (key in _migrated or not migrate_schema):
        return engine
    with _engines_lock:
        if key not in _engines:
            _engines[key] = _create_engine(url, pool_size, timeout, application_name, listening)
        if migrate_schema and key not in _migrated:
            with operation(_engines[key], MIGRATION_TIMEOUT):
                migrate(_engines[key])
            _migrated.add(key)
        return _engines[key]


def _create_engine(url: str, pool_size: int, timeout: float, application_name: str, listening: bool) -> Engine:
    try:
        # Fixed: busy means wait (up to ``timeout``), never one more connection.
        return Engine(url, pool_size=pool_size, timeout=timeout, connect_args={"application_name": application_name},
                      listening=listening)
    except ValueError as e:  # not a URL, or an ambiguous one: no connection is tried, nothing of it is shown
        raise DatabaseError(str(e)) from None


class translate_errors:
    """Turn driver errors into ``DatabaseError`` naming host and port, never the password."""

    def __init__(self, url, seconds: float | None = None):
        self.url = url
        self.seconds = seconds  # the operation's time allowed, for the message of a timeout

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if isinstance(exc, PoolTimeout):
            raise DatabaseError(
                f"database at {describe(self.url)}: every connection of this node's pool (database_pool_size) "
                f"stayed busy for {self.seconds or 0:.3g} s"
            ) from exc
        if isinstance(exc, DriverError):
            reason = first_line(exc.orig) if exc.orig else type(exc).__name__
            if isinstance(exc.orig, DatabaseTimeout):
                reason = f"no answer within {self.seconds or 0:.3g} s"
            raise DatabaseError(f"database at {describe(self.url)}: {reason}") from exc
        return False


# --- schema --------------------------------------------------------------------------------------------------


@functools.cache
def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("scrapyd_pgqueue") / "migrations"))
    return config


# The schema's current revisions: one cheap query, no Alembic (whose import costs a node megabytes it never uses
# once the schema is current). A database with no version table yet raises undefined_table.
SCHEMA_REVISIONS = "SELECT version_num FROM scrapyd_pgqueue_version"  # VERSION_TABLE
REVISION_LINE = re.compile(r"^(revision|down_revision)\s*=\s*(.+)$", re.MULTILINE)


def _schema_revisions(engine: Engine) -> set[str]:
    try:
        return {row[0] for row in fetch_all(engine, SCHEMA_REVISIONS, {})}
    except DriverError as e:
        if getattr(e.orig, "pgcode", None) == "42P01":  # undefined_table: a new database
            return set()
        raise


@functools.cache
def newest_revisions() -> frozenset[str]:
    """The heads of the migrations shipped with this package, read from their ``revision``/``down_revision`` lines
    (what Alembic's ScriptDirectory computes, without importing Alembic)."""
    revisions, parents = set(), set()
    for path in (files("scrapyd_pgqueue") / "migrations" / "versions").iterdir():
        if not path.name.endswith(".py"):
            continue
        for name, value in REVISION_LINE.findall(path.read_text()):
            found = set(re.findall(r"[\"']([^\"']+)[\"']", value))
            (revisions if name == "revision" else parents).update(found)
    return frozenset(revisions - parents)


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest version; safe when many nodes start at the same instant.

    A current schema is only read (one query; Alembic is imported only when there is something to migrate): no
    lock and no DDL, so nodes may use a role without the right to change the schema once ``scrapyd-pgqueue
    migrate`` has run as its owner.
    """
    current = _schema_revisions(engine)
    if current == newest_revisions():
        return
    from alembic import command
    from sqlalchemy.exc import DBAPIError

    config = _alembic_config()
    try:
        with _alembic_connection(engine) as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    except DBAPIError as e:  # Alembic's statements run on SQLAlchemy: their errors leave as any statement's
        if getattr(e.orig, "pgcode", None) != "42501":  # insufficient_privilege
            raise DriverError.wrapping(e.orig, str(e.statement), e.connection_invalidated) from e
        raise DatabaseError(
            f"database at {describe(engine.url)}: the schema is at revision {sorted(current) or 'none'}, "
            f"this version of scrapyd_pgqueue needs {sorted(newest_revisions())}, and this database role may not "
            "change it: run `scrapyd-pgqueue migrate` once as the schema's owner"
        ) from None


@contextlib.contextmanager
def _alembic_connection(engine: Engine):
    """A SQLAlchemy connection for Alembic, on a connection of the pool (SQLAlchemy is imported only to migrate),
    inside one transaction holding a transaction-level lock (PgBouncer keeps it, unlike a session lock): the other
    nodes wait for it, then find the schema current and do nothing. Its statements carry the timeouts too."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import StaticPool

    driver_connection = engine.checkout()
    try:
        # StaticPool keeps the connection open when Alembic is done with it: it goes back to the pool, so a node
        # that migrated holds no more connections, even for a moment, than its pool's size.
        alembic_engine = create_engine("postgresql+psycopg2://", creator=lambda: driver_connection,
                                       poolclass=StaticPool, pool_reset_on_return=None, isolation_level="AUTOCOMMIT")

        @event.listens_for(alembic_engine, "before_cursor_execute", retval=True)
        def with_timeouts(connection, cursor, statement, parameters, context, executemany):
            count_statement(writes=True)
            return (statement if statement in TRANSACTION_CONTROL else STATEMENT_PREFIX + statement), parameters

        with alembic_engine.connect() as connection, _all_or_none(connection.exec_driver_sql, Exception):
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(%(key)s)", {"key": MIGRATION_LOCK_KEY})
            yield connection
    finally:
        engine.checkin(driver_connection)  # closed instead if the migration left it broken
