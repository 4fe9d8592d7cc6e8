"""Bounded waits for the database: every wait of a thread ends at its deadline, and a server that refuses for now
(full, starting, PgBouncer's retry window) is waited for, never answered as an error at once.

A server that is stopped (SIGSTOP, a VM pause) or a path that went silent still ACKs or drops packets without an
error, and neither TCP keepalives nor ``statement_timeout`` fire while a statement waits for an answer. So psycopg2
runs in its non-blocking ("green") mode with a wait callback that gives up at the calling thread's deadline
(``deadline()``), closing the connection.
"""

from __future__ import annotations

import contextlib
import logging
import random
import select
import threading
import time

import psycopg2
import psycopg2.extensions

from scrapyd_pgqueue.database.sql import DatabaseAddress, DriverError, address_of
from scrapyd_pgqueue.database.throttled_log import ThrottledLog

log = logging.getLogger("scrapyd_pgqueue.database.db")

CONNECT_TIMEOUT = 5  # seconds before an unreachable database is an error
DEFAULT_TIMEOUT = 30.0  # seconds an operation may wait for the database (database_timeout)
# What a server (or PgBouncer) says when it has no connection to spare, or cannot serve one yet: worth waiting for.
# Each is said at login (ours, or PgBouncer's to the server for our statement) or before PgBouncer sent our statement
# on, never after a server ran it; so a statement refused with one certainly did not run, and may be sent again.
BUSY_SERVER_MESSAGES = (
    "too many clients",
    "too many connections",  # for a role's or a database's CONNECTION LIMIT
    "remaining connection slots are reserved",
    "no more connections allowed",  # PgBouncer: max_client_conn
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "pgbouncer cannot connect to server",  # PgBouncer: the server is down or restarting
    "server login has been failing",  # PgBouncer: server_login_retry seconds after a failed server login
    "query_wait_timeout",  # PgBouncer: no server connection came within query_wait_timeout
    # PgBouncer: the server failed the SET that PgBouncer sends ahead of our statement on a server connection it
    # just linked (a server shutting down), so it held our statement back and closed.
    "invalid server parameter",
)
# What a server says as it ends the statement a connection runs (a restart's fast shutdown, pg_terminate_backend),
# before the statement's transaction could commit; PgBouncer passes it on. A statement that got it did not commit.
ENDED_BY_THE_SERVER = "terminating connection due to administrator command"
_deadlines = threading.local()
_statements = threading.local()  # how many statements this thread sent, and how many of them may write (when_served)


class DatabaseTimeout(psycopg2.OperationalError):
    """The database did not answer before the caller's deadline; the connection was closed."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Bound every database wait of this thread inside the block to ``seconds`` from now (nested: the earliest)."""
    outer = getattr(_deadlines, "at", None)
    at = time.monotonic() + seconds
    _deadlines.at = at if outer is None else min(outer, at)
    try:
        yield
    finally:
        _deadlines.at = outer


def remaining_time() -> float | None:
    """Seconds left before this thread's deadline, None without one."""
    at = getattr(_deadlines, "at", None)
    return None if at is None else at - time.monotonic()


def _wait_for_socket(connection) -> None:
    """psycopg2's wait callback: poll the non-blocking connection until done, or give up at the deadline."""
    while True:
        state = connection.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        left = remaining_time()
        if left is not None and left <= 0:
            # psycopg2 closes a connection whose wait failed: a statement still on its way is abandoned with it.
            raise DatabaseTimeout("no answer in the time allowed")
        fileno = connection.fileno()
        if state == psycopg2.extensions.POLL_READ:
            select.select([fileno], [], [], left)
        elif state == psycopg2.extensions.POLL_WRITE:
            select.select([], [fileno], [], left)
        else:
            raise psycopg2.OperationalError(f"unexpected state from the connection: {state}")


psycopg2.extensions.set_wait_callback(_wait_for_socket)


def copy_allowed() -> bool:
    """Whether this process's connections can COPY: psycopg2 refuses COPY while a wait callback is set."""
    return psycopg2.extensions.get_wait_callback() is None


def wait_without_deadlines() -> None:
    """Let this process COPY, for a process whose only database thread is a command's writer (``enqueue``): its
    waits are then bounded by the connections' TCP timeouts (``connection_pool.TCP_SETTINGS``) instead of thread
    deadlines."""
    psycopg2.extensions.set_wait_callback(None)

def describe(url: str | DatabaseAddress) -> str:
    """Where the database is, for messages: host, port and name, no password."""
    try:
        parsed = address_of(url) if isinstance(url, str) else url
    except ValueError:  # not a URL, or an ambiguous one whose "host" may be the end of its password
        return "(a database URL that is not valid)"
    return f"{parsed.host or 'localhost'}:{parsed.port or 5432}/{parsed.database or ''}"



def connect_when_served(connect, url: DatabaseAddress | str):
    """``connect()``, retried with a growing, jittered pause while the server says it is full or starting up, until
    this thread's deadline. Logged once a minute with a count, not once per attempt."""
    pause = 0.05
    while True:
        try:
            with deadline(CONNECT_TIMEOUT):
                return connect()
        except psycopg2.OperationalError as e:
            if not _waited_for_refusal(e, url, pause, "refused a connection"):
                raise
        pause = min(pause * 2, 2.0)


def when_served(call, url: DatabaseAddress | str):
    """``call()`` (one operation), called again until this thread's deadline while

    - the database or PgBouncer refuses its first statement, which certainly did not run: PgBouncer takes a server
      connection only when a transaction starts, so an open client connection gets its refusals (a server
      restarting, ``server_login_retry``) there. One refused after another statement of the call is an error: the
      call is half done;
    - or the server ended the only statement of the call (``ENDED_BY_THE_SERVER``: a restart's fast shutdown,
      ``pg_terminate_backend``): its transaction was aborted, not committed;
    - or the connection is lost (a server restart ended it) during a call that only read: reading again is
      harmless. A write that lost its connection without a word (a cut path, a killed server) is an error: it
      may have committed.
    """
    pause = 0.05
    while True:
        sent_before, writes_before = _statements_sent(), _writes_sent()
        try:
            return call()
        except DriverError as e:
            sent, wrote = _statements_sent() - sent_before, _writes_sent() - writes_before
            waited = sent <= 1 and _waited_for_refusal(e.orig, url, pause, "refused a statement (it did not run)")
            if not waited and sent == 1 and ENDED_BY_THE_SERVER in first_line(e.orig or e):
                waited = _waited_for_refusal(e.orig, url, pause, "ended a statement (it did not commit)", lost=True)
            if not waited and sent and not wrote and e.connection_invalidated:  # not a failed connect: a lost one
                waited = _waited_for_refusal(e.orig, url, pause, "lost a read's connection", lost=True)
            if not waited:
                raise
        pause = min(pause * 2, 2.0)


def _waited_for_refusal(
    error: BaseException | None, url: DatabaseAddress | str, pause: float, what: str, lost: bool = False
) -> bool:
    """If ``error`` is a refusal worth waiting for (or ``lost``: any lost connection) and this thread's deadline
    allows: log it, pause, say True."""
    if not isinstance(error, psycopg2.OperationalError) or isinstance(error, DatabaseTimeout):
        return False
    reason = first_line(error)
    left = remaining_time()
    if not (lost or any(busy in reason for busy in BUSY_SERVER_MESSAGES)) or left is None or left < pause:
        return False
    where = describe(url)
    busy_server_log.report(f"database at {where} {what}, waiting: {reason}", key=f"refused {where}")
    time.sleep(pause * random.uniform(0.5, 1.0))
    return True


def count_statement(writes: bool) -> None:
    _statements.sent = _statements_sent() + 1
    _statements.writes = _writes_sent() + writes


def _statements_sent() -> int:
    return getattr(_statements, "sent", 0)


def _writes_sent() -> int:
    return getattr(_statements, "writes", 0)


def first_line(error: BaseException) -> str:
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


busy_server_log = ThrottledLog(log.warning)
