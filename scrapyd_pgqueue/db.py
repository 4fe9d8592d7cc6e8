"""The connector: the only module that knows the driver.

Scrapyd creates queue and storage objects often (per project, on every deploy, in every crawl
subprocess), so engines are shared per process and URL, and the schema is migrated once per engine.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from importlib.resources import files

from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5  # seconds before an unreachable database is an error
STATEMENT_TIMEOUT_MS = 15_000  # no queue statement legitimately runs longer
# Key of the session advisory lock that serialises migrations between nodes starting together.
MIGRATION_LOCK_KEY = 0x5C4A_9D0B

_engines: dict[tuple[int, str], Engine] = {}
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


def get_engine(url: str, application_name: str = "scrapyd-pgqueue") -> Engine:
    """The process's engine for ``url``, created (and the schema migrated) on first use."""
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _engines_lock:
        if key not in _engines:
            engine = create_engine(
                normalise_url(url),
                pool_size=5,
                max_overflow=10,
                pool_pre_ping=True,  # a restarted Postgres leaves dead connections in the pool
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
            with translate_errors(engine.url):
                migrate(engine)
            _engines[key] = engine
        return _engines[key]


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


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest version; safe when many nodes start at the same instant."""
    from alembic import command

    with engine.connect() as connection:
        # A session lock (held across the migration's own transaction): the other nodes wait, then find
        # the schema current and do nothing.
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        connection.commit()
        try:
            config = _alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
