"""A process's connections to one database: a fixed pool of psycopg2 connections in autocommit, with no overflow.

What the node needs of a pool, and nothing else:
- a wait for a free connection ends at the calling thread's deadline (``waits.deadline``) or after the pool's
  timeout, whichever comes first: an operation given a second (daemonstatus.json's) must not wait a whole
  ``database_timeout`` behind connections held by operations stuck on a stalled database;
- a pooled connection is checked before use without a round trip: an idle connection has nothing to read, unless
  the server closed it (a restart, pg_terminate_backend, PgBouncer's idle timeout sent a message and EOF);
- a connect is patient (``waits.connect_when_served``): a server with no connection to spare is waited for;
- every statement carries the server-side timeouts in its own query string (``SET LOCAL``): one round trip, no
  session state, so PgBouncer's transaction pooling keeps them, and psycopg2 prepares nothing on the server;
- a connection that a statement left closed, or inside a transaction, is never handed out again.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import select
import threading
import time
from collections.abc import Callable

import psycopg2
import psycopg2.extensions

from scrapyd_pgqueue.database.sql import (
    DriverError,
    Result,
    Statement,
    address_of,
    driver_dsn,
    text,
)
from scrapyd_pgqueue.database.waits import connect_when_served, count_statement, remaining_time

STATEMENT_TIMEOUT_MS = 15_000  # no queue statement legitimately runs longer
# Timeouts for the server, sent with every statement in the same query string: one round trip, no session state
# (so PgBouncer's transaction pooling keeps them), and an autocommit statement stays one implicit transaction.
STATEMENT_PREFIX = "SET LOCAL statement_timeout = 15000; SET LOCAL lock_timeout = 15000; "  # STATEMENT_TIMEOUT_MS
TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK"}  # sent as they are (see Connection.control)
# TCP settings of every connection: a dead peer is noticed within seconds when idle (keepalives), and data sent
# but never acknowledged (a cut path) fails the connection after tcp_user_timeout milliseconds.
TCP_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}


class PoolTimeout(Exception):
    """Every connection of the pool stayed busy until the caller's deadline or the pool's timeout."""


class Engine:
    """The pool of one database URL: ``connect()`` lends a ``Connection``; ``dispose()`` closes the idle ones."""

    def __init__(self, url: str, pool_size: int, timeout: float, connect_args: dict, listening: bool = False):
        self._dsn = driver_dsn(url)
        # A LISTENing connection is readable whenever a notification arrives: that is no sign of a closed one.
        self.listening = listening
        self.url = address_of(url)  # never holds the password
        self.pool_size, self.timeout = pool_size, timeout
        self._connect_args = {**TCP_SETTINGS, **connect_args}
        self._idle: collections.deque = collections.deque()  # oldest returned first out, as SQLAlchemy's QueuePool
        self._lent = 0  # connections out of the pool, or being opened
        self._changed = threading.Condition()
        # Called with each statement (its text as sent) and each new connection: for the benchmark's counters.
        self.statement_listeners: list[Callable[[str], None]] = []
        self.connect_listeners: list[Callable[[object], None]] = []
        # Called with each connection given back: the listener learns of notifications a statement read.
        self.checkin_listeners: list[Callable[[object], None]] = []

    def __repr__(self) -> str:
        return f"Engine({self.url.host or 'localhost'}:{self.url.port or 5432}/{self.url.database or ''})"

    def connect(self) -> Connection:
        return Connection(self, self.checkout())

    def checkout(self):
        """A psycopg2 connection of the pool's, or a new one while the pool is not full; else wait for one."""
        pooled = self._take_slot()
        if pooled is not None and not _closed_by_the_server(pooled, self.listening):
            return pooled
        if pooled is not None:
            pooled.close()
        try:
            return self._open()
        except BaseException:
            self._release_slot()
            raise

    @contextlib.contextmanager
    def slot_lent_out(self):
        """One of the pool's slots for the block, without a connection (an idle one is closed): a helper process
        connects in its place (``node/copy_writer.py``), so a node holds no more connections than its pool's."""
        pooled = self._take_slot()
        if pooled is not None:
            pooled.close()
        try:
            yield
        finally:
            self._release_slot()

    def _take_slot(self):
        """Wait for a slot (up to the timeout, or this thread's deadline); the idle connection that held it, if any."""
        seconds = self.timeout if remaining_time() is None else max(0.0, min(self.timeout, remaining_time()))
        give_up = time.monotonic() + seconds
        with self._changed:
            while not self._idle and self._lent >= self.pool_size:
                left = give_up - time.monotonic()
                if left <= 0:
                    raise PoolTimeout(f"pool of {self.pool_size} busy for {seconds:.3g} s")
                self._changed.wait(left)
            self._lent += 1
            return self._idle.popleft() if self._idle else None

    def checkin(self, connection) -> None:
        """Back to the pool, unless closed or left inside a transaction (then closed: its slot opens again)."""
        reusable = not connection.closed and (
            connection.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE)
        if not reusable:
            connection.close()
        with self._changed:
            self._lent -= 1
            if reusable:
                self._idle.append(connection)
            self._changed.notify()
        for listener in self.checkin_listeners:
            listener(connection)

    def dispose(self) -> None:
        """Close the idle connections (those lent are closed when given back only if they broke)."""
        with self._changed:
            idle, self._idle = list(self._idle), collections.deque()
        for connection in idle:
            connection.close()

    def _open(self):
        def connect():
            return psycopg2.connect(self._dsn, **self._connect_args)

        try:
            connection = connect_when_served(connect, self.url)
        except psycopg2.Error as e:
            raise DriverError.wrapping(e) from e
        connection.autocommit = True  # see db.autocommit() and db.transaction(); sends nothing
        for listener in self.connect_listeners:
            listener(connection)
        return connection

    def _release_slot(self) -> None:
        with self._changed:
            self._lent -= 1
            self._changed.notify()


def _closed_by_the_server(connection, listening: bool = False) -> bool:
    """An idle connection has nothing to read unless the server closed it; a listening one reads what came (the
    notifications stay in ``connection.notifies``) and is closed only if that fails."""
    if connection.closed:
        return True
    if not select.select([connection.fileno()], [], [], 0)[0]:
        return False
    if not listening:
        return True
    try:
        connection.poll()
    except psycopg2.Error:
        return True
    return bool(connection.closed)


class Connection:
    """A connection lent by the pool, for the ``with`` block (given back at its end). ``execute`` sends one statement
    with the timeouts every statement carries; driver errors leave as ``DriverError``."""

    __slots__ = ("driver_connection", "engine")

    def __init__(self, engine: Engine, driver_connection):
        self.engine, self.driver_connection = engine, driver_connection

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.driver_connection is not None:
            self.engine.checkin(self.driver_connection)
            self.driver_connection = None

    def execute(self, statement: Statement | str, params: dict | None = None) -> Result:
        statement = text(statement) if isinstance(statement, str) else statement
        count_statement(writes=statement.writes)
        return self._send(STATEMENT_PREFIX + statement.driver_text, params or {}, statement.text, named=True)

    def control(self, command: str) -> None:
        """BEGIN, COMMIT or ROLLBACK, sent as it is."""
        if command != "ROLLBACK":  # undoes, never does: a call that sent nothing else did nothing
            count_statement(writes=False)
        self._send(command, None, command)

    def exec_driver_sql(self, statement: str, params=None) -> Result:
        """A statement as psycopg2 takes it (``%s`` parameters), with the timeouts: for composed SQL (roles)."""
        count_statement(writes=True)
        return self._send(STATEMENT_PREFIX + statement, params, statement)

    def copy_in(self, statement: str, data) -> None:
        """``COPY ... FROM STDIN`` streaming the file object ``data``, after the timeouts for the rest of the
        transaction this must be in (COPY takes no other statement in its query string)."""
        self.exec_driver_sql("SELECT 1")
        count_statement(writes=True)
        self._send(statement, None, statement, copied=data)

    def _send(self, sent: str, params, shown: str, named: bool = False, copied=None) -> Result:
        for listener in self.engine.statement_listeners:
            listener(sent)
        connection = self.driver_connection
        try:
            with connection.cursor() as cursor:
                if copied is not None:
                    cursor.copy_expert(sent, copied)
                    return Result([], cursor.rowcount, ())
                cursor.execute(sent, params)
                if cursor.description is None:
                    return Result([], cursor.rowcount, ())
                keys = tuple(column.name for column in cursor.description)
                rows = cursor.fetchall()
                return Result([_row_class(keys)._make(row) for row in rows] if named else rows, cursor.rowcount, keys)
        except psycopg2.Error as e:
            raise DriverError.wrapping(e, shown, invalidated=bool(connection.closed)) from e


@functools.lru_cache(maxsize=512)
def _row_class(keys: tuple[str, ...]):
    """Rows read by name (``row.status``) or position, as SQLAlchemy's; ``row._asdict()`` for a dict."""
    return collections.namedtuple("Row", keys, rename=True)
