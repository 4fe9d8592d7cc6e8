"""store/schema.sql, the database functions with their reasons, is what the migrations leave: on a real Postgres,
migrated to the newest revision, the file's functions (created in a schema of their own) are the migrated ones."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import scrapyd_pgqueue
from scrapyd_pgqueue.store import db
from helpers import connect

SCHEMA_FILE = Path(scrapyd_pgqueue.__file__).parent / "store" / "schema.sql"

# What makes two functions the same: name, arguments, result, volatility, language, settings (SET), the body with
# its comments and spacing aside (the file explains each step in comments the migrations do not have).
FUNCTIONS = """
    SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid), p.provolatile,
           l.lanname, coalesce(p.proconfig, '{}'), p.prosrc
    FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace JOIN pg_language AS l ON l.oid = p.prolang
    WHERE n.nspname = %s
    ORDER BY p.proname
"""


def _without_comments(body: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", body).split())


def _functions(cursor, schema: str) -> dict[str, tuple]:
    cursor.execute(FUNCTIONS, (schema,))
    return {f"{name}({arguments})": (result, volatility, language, _settings(settings), _without_comments(body))
            for name, arguments, result, volatility, language, settings, body in cursor.fetchall()}


def _settings(settings: list[str]) -> list[str]:
    """A function's SET clauses, the schema its search path names aside (the migrations pin the one they ran in):
    a search path that is not that schema then pg_temp, last, stays as it is and fails the comparison."""
    return [re.sub(r"^search_path=[^,]+, pg_temp$", "search_path=<schema>, pg_temp", setting) for setting in settings]


def test_the_schema_file_holds_every_function_as_the_migrations_leave_it(database_url):
    db.get_engine(database_url).dispose()  # migrated to the newest revision
    with contextlib.closing(connect(database_url)) as connection, connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA from_file")
        cursor.execute("SET search_path TO from_file, public")  # the file's functions land in from_file
        cursor.execute(SCHEMA_FILE.read_text())
        migrated, from_file = _functions(cursor, "public"), _functions(cursor, "from_file")
    assert sorted(name.split("(")[0] for name in migrated) == [
        "claim_spider_jobs", "scrapyd_pgqueue_wanted_nodes", "scrapyd_pgqueue_wanted_nodes",
        "spider_job_pending_pools", "spider_job_running", "spider_tree_count"]
    assert sorted(from_file) == sorted(migrated)
    for name in migrated:
        assert from_file[name] == migrated[name], f"{name} in store/schema.sql differs from the migrated database"
