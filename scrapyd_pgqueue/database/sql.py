"""Statements, their results and their errors, over psycopg2 alone.

A node's every statement goes through these few classes instead of SQLAlchemy's execution layer: importing
SQLAlchemy costs a process about 12 MB, most of an idle node's memory over stock Scrapyd's, for a layer that only
passed our text statements on to the driver. The statements keep SQLAlchemy's ``text()`` spelling (``:name``
parameters, ``\\:`` for a colon), so a query reads the same in the store, in the migrations and in a psql session;
the results offer the part of SQLAlchemy's ``Result`` that the store uses. SQLAlchemy and Alembic stay for the
migrations (the schema they leave is ``schema.sql``), imported only when the schema needs a migration.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import psycopg2
import psycopg2.sql

from scrapyd_pgqueue.config import url_ambiguity

# A parameter (``:name``, and ``:name::type``, which SQLAlchemy's text() misreads): not a cast (``::type``), not an
# escaped colon (``\:``), not a colon inside a word (``'12:30'``).
_PARAMETER = re.compile(r"(?<![:\w\\]):(\w+)(?!\w)")
# A statement that only reads: repeated after a lost connection (waits.when_served). Deliberately narrow: a SELECT
# with no row locks, no NOTIFY, no sequence, no advisory lock and no INTO; the claim's function is called through
# db.fetch_all, which counts as a write.
_WRITES_IN_A_SELECT = re.compile(r"\b(FOR\s+(NO\s+KEY\s+)?(UPDATE|SHARE|KEY\s+SHARE)|INTO|pg_notify|nextval|setval|"
                                 r"pg_advisory\w*)\b", re.IGNORECASE)


@dataclass(frozen=True)
class DatabaseAddress:
    """Where a database is, without its password: what messages and logs may say."""

    host: str | None
    port: int | None
    database: str | None
    username: str | None


def driver_dsn(url: str) -> str:
    """A database URL as libpq takes it: SQLAlchemy's ``postgresql+psycopg2://`` and ``postgres://`` spellings too."""
    return re.sub(r"^postgres(ql)?(\+psycopg2)?://", "postgresql://", url.strip())


@functools.lru_cache(maxsize=256)
def address_of(url: str) -> DatabaseAddress:
    """Host, port, database and user of a URL or a libpq connection string (libpq's own parser); ValueError for
    one that is not, or is ambiguous (``url_ambiguity``)."""
    ambiguity = url_ambiguity(url)
    if ambiguity:
        raise ValueError(f"ambiguous database URL: {ambiguity}")
    try:
        parts = psycopg2.extensions.parse_dsn(driver_dsn(url))
    except psycopg2.ProgrammingError:
        raise ValueError("not a PostgreSQL database URL (postgresql://user:password@host:5432/database)") from None
    port = parts.get("port")
    return DatabaseAddress(parts.get("host"), int(port) if port and port.isdigit() else None,
                           parts.get("dbname"), parts.get("user"))


def reads_only(statement: str) -> bool:
    return statement.lstrip().upper().startswith("SELECT") and not _WRITES_IN_A_SELECT.search(statement)


class Statement:
    """A statement as written (``text``, with ``:name`` parameters) and as psycopg2 takes it (``driver_text``,
    ``%(name)s``, a literal ``%`` doubled), converted once."""

    __slots__ = ("driver_text", "text", "writes")

    def __init__(self, statement: str):
        self.text = statement
        escaped = statement.replace("%", "%%")
        self.driver_text = _PARAMETER.sub(r"%(\1)s", escaped).replace("\\:", ":")
        self.writes = not reads_only(statement)

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"text({self.text!r})"


def listen_statement(channel: str) -> psycopg2.sql.Composed:
    """``LISTEN`` on a channel, its name quoted as an identifier (a channel's name is any text a subscriber gives)."""
    return psycopg2.sql.SQL("LISTEN {}").format(psycopg2.sql.Identifier(channel))


@functools.lru_cache(maxsize=1024)
def text(statement: str) -> Statement:
    """A statement of the store (module constants, built once; a statement built per call is cached here)."""
    return Statement(statement)


class DriverError(Exception):
    """A statement or connect that psycopg2 refused (``orig``); ``connection_invalidated``: its connection is gone
    (closed by the server, a cut path, or our deadline), so the pool does not keep it."""

    def __init__(self, orig: psycopg2.Error, statement: str | None = None, connection_invalidated: bool = False):
        super().__init__(f"({type(orig).__module__}.{type(orig).__name__}) {orig}".rstrip())
        self.orig, self.statement, self.connection_invalidated = orig, statement, connection_invalidated

    @classmethod
    def wrapping(cls, orig: psycopg2.Error, statement: str | None = None, invalidated: bool = False) -> DriverError:
        kind = IntegrityError if isinstance(orig, psycopg2.IntegrityError) else cls
        return kind(orig, statement, invalidated)


class IntegrityError(DriverError):
    """A constraint refused the statement (a unique, foreign key or check violation)."""


class Result:
    """The rows of one statement, read at once (every statement of the store reads a bounded set), and its count."""

    __slots__ = ("_keys", "_next", "_rows", "rowcount")

    def __init__(self, rows: list, rowcount: int, keys: tuple[str, ...]):
        self._rows, self._next, self.rowcount, self._keys = rows, 0, rowcount, keys

    def __iter__(self):
        rows, self._next = self._rows[self._next:], len(self._rows)
        return iter(rows)

    def keys(self) -> tuple[str, ...]:
        return self._keys

    def fetchone(self):
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def all(self) -> list:
        return list(self)

    fetchall = all

    def first(self):
        row = self.fetchone()
        self._next = len(self._rows)
        return row

    def one(self):
        rows = self.all()
        if len(rows) != 1:
            raise LookupError(f"one row expected, {len(rows)} found")
        return rows[0]

    def scalar(self):
        row = self.first()
        return None if row is None else row[0]

    def scalar_one(self):
        return self.one()[0]

    def scalars(self) -> Result:
        return Result([row[0] for row in self], self.rowcount, self._keys[:1])
