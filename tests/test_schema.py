"""store/schema.sql, the whole current schema with its reasons, is what the migrations leave: on a real Postgres, a
database migrated from zero to the newest revision and an empty database where the file ran have the same catalog
in schema public (tables, columns, constraints, indexes, sequences, triggers, functions, types, comments, grants,
and the rows the migrations write). Alembic's version table, which the file leaves out, is left out here too."""

from __future__ import annotations

import contextlib
import re
import uuid
from pathlib import Path

from psycopg2 import sql
from sqlalchemy import make_url

import scrapyd_pgqueue
from helpers import connect
from scrapyd_pgqueue.database import db

SCHEMA_FILE = Path(scrapyd_pgqueue.__file__).parent / "store" / "schema.sql"

# What the catalog of schema public holds, by kind of object: each query's first column names the object, the others
# are what makes two of them the same (their labels are those of a failure's message). %(version)s: Alembic's table,
# left out with everything that belongs to it.
CATALOG = {
    "table": """
        SELECT c.relname AS name, c.relkind AS kind, c.relpersistence AS persistence,
               c.relrowsecurity AS row_security,
               ARRAY(SELECT option FROM unnest(c.reloptions) AS option ORDER BY option) AS storage_parameters,
               c.relacl::text AS grants,
               ARRAY(SELECT a.attname FROM pg_attribute AS a
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum) AS columns
        FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname <> %(version)s
    """,
    "column": """
        SELECT c.relname || '.' || a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,
               a.attnotnull AS not_null, pg_get_expr(d.adbin, d.adrelid) AS default, a.attidentity AS identity,
               a.attgenerated AS generated, CASE WHEN a.attcollation <> t.typcollation THEN co.collname END AS collation,
               a.attacl::text AS grants
        FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace JOIN pg_type AS t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation AS co ON co.oid = a.attcollation
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname <> %(version)s
          AND a.attnum > 0 AND NOT a.attisdropped
    """,
    # Named as the migrations name them: a check, key or reference with another name is another constraint.
    "constraint": """
        SELECT c.relname || '.' || con.conname AS name, con.contype AS kind,
               pg_get_constraintdef(con.oid) AS definition, con.condeferrable AS deferrable,
               con.condeferred AS deferred, con.convalidated AS validated
        FROM pg_constraint AS con JOIN pg_class AS c ON c.oid = con.conrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relname <> %(version)s
    """,
    # Those of the keys and unique constraints too (their names are the constraints').
    "index": """
        SELECT i.relname AS name, pg_get_indexdef(i.oid) AS definition
        FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid JOIN pg_class AS c ON c.oid = x.indrelid
        JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relname <> %(version)s
    """,
    # Identity columns' and serial columns' sequences included: the column that owns each one.
    "sequence": """
        SELECT s.relname AS name, format_type(q.seqtypid, NULL) AS type, q.seqstart AS start,
               q.seqincrement AS increment, q.seqmin AS min, q.seqmax AS max, q.seqcache AS cache,
               q.seqcycle AS cycle, s.relacl::text AS grants,
               (SELECT t.relname || '.' || a.attname || ' (' || d.deptype::text || ')'
                FROM pg_depend AS d JOIN pg_class AS t ON t.oid = d.refobjid
                JOIN pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.refclassid = 'pg_class'::regclass
                  AND d.deptype IN ('a', 'i')) AS owned_by
        FROM pg_sequence AS q JOIN pg_class AS s ON s.oid = q.seqrelid
        JOIN pg_namespace AS n ON n.oid = s.relnamespace
        WHERE n.nspname = 'public'
    """,
    # The triggers written by hand: a foreign key's are internal, and part of its constraint.
    "trigger": """
        SELECT c.relname || '.' || t.tgname AS name, pg_get_triggerdef(t.oid) AS definition, t.tgenabled AS enabled
        FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid JOIN pg_namespace AS n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND NOT t.tgisinternal AND c.relname <> %(version)s
    """,
    # The body is compared with its comments and spacing aside (the file explains each step in comments the
    # migrations do not have); settings (SET) as they are: the file pins the search path to public, as the
    # migrations pin it to the schema they ran in.
    "function": """
        SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS name,
               pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result,
               p.prokind AS kind, p.provolatile AS volatility, p.proisstrict AS strict,
               p.prosecdef AS security_definer, p.proleakproof AS leakproof, p.proparallel AS parallel,
               l.lanname AS language, coalesce(p.proconfig, '{}') AS settings, p.proacl::text AS grants,
               p.prosrc AS body
        FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace JOIN pg_language AS l ON l.oid = p.prolang
        WHERE n.nspname = 'public'
    """,
    # Types of their own (domains, enums, ranges, composite types): not the row types of tables nor array types.
    "type": """
        SELECT t.typname AS name, t.typtype AS kind, format_type(t.typbasetype, t.typtypmod) AS base,
               t.typnotnull AS not_null,
               ARRAY(SELECT e.enumlabel FROM pg_enum AS e WHERE e.enumtypid = t.oid ORDER BY e.enumsortorder) AS labels,
               t.typacl::text AS grants
        FROM pg_type AS t JOIN pg_namespace AS n ON n.oid = t.typnamespace
        LEFT JOIN pg_class AS c ON c.oid = t.typrelid
        WHERE n.nspname = 'public' AND (c.relkind IS NULL OR c.relkind = 'c')
          AND NOT (t.typcategory = 'A' AND t.typelem <> 0)
    """,
    # COMMENT ON: the file's reasons are SQL comments, so there is none unless a migration writes one.
    "comment": """
        SELECT pg_describe_object(d.classoid, d.objoid, d.objsubid) AS name, d.description AS text
        FROM pg_description AS d
        WHERE (pg_identify_object(d.classoid, d.objoid, d.objsubid)).schema = 'public'
    """,
}


def _without_comments(body: str) -> str:
    return " ".join(re.sub(r"--[^\n]*", "", body).split())


def _catalog(url: str, exclude: str) -> dict[str, dict[str, dict]]:
    """{kind: {object's name: {field: value}}} of schema public, and each table's rows ("rows")."""
    catalog = {}
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        for kind, query in CATALOG.items():
            cursor.execute(query, {"version": exclude})
            fields = [column.name for column in cursor.description[1:]]
            catalog[kind] = {name: dict(zip(fields, values)) for name, *values in cursor.fetchall()}
        for function in catalog["function"].values():
            function["body"] = _without_comments(function["body"])
        catalog["rows"] = {}
        for table, details in catalog["table"].items():
            if details["kind"] in ("r", "p"):
                cursor.execute(sql.SQL("SELECT coalesce(array_agg(to_jsonb(t)::text ORDER BY to_jsonb(t)::text), "
                                       "'{{}}') FROM {} AS t").format(sql.Identifier(table)))
                catalog["rows"][table] = {"rows": cursor.fetchone()[0]}
    return catalog


def _excerpt(value, other) -> str:
    """``value``, or for a long text the part around where it first differs from ``other``."""
    if not (isinstance(value, str) and isinstance(other, str) and len(value) > 200):
        return repr(value)
    start = next((i for i, (a, b) in enumerate(zip(value, other)) if a != b), min(len(value), len(other)))
    return f"...{value[max(0, start - 100):start + 100]!r}... (differs at character {start})"


def _differences(migrated: dict, from_file: dict) -> list[str]:
    differences = []
    for kind, objects in migrated.items():
        others = from_file[kind]
        for name in sorted(objects.keys() - others.keys()):
            differences.append(f"{kind} {name}: made by the migrations, missing from schema.sql: {objects[name]}")
        for name in sorted(others.keys() - objects.keys()):
            differences.append(f"{kind} {name}: in schema.sql, not made by the migrations: {others[name]}")
        for name in sorted(objects.keys() & others.keys()):
            for field, value in objects[name].items():
                other = others[name][field]
                if value != other:
                    differences.append(f"{kind} {name}, {field}:\n    migrations: {_excerpt(value, other)}\n"
                                       f"    schema.sql: {_excerpt(other, value)}")
    return differences


def _new_database(server_url: str) -> str:
    name = f"test_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def test_the_schema_file_is_exactly_what_the_migrations_leave(database_url, postgres_server):
    db.get_engine(database_url).dispose()  # migrated from zero to the newest revision
    file_url = _new_database(postgres_server[0])
    with contextlib.closing(connect(file_url)) as connection, connection.cursor() as cursor:
        cursor.execute("SET search_path TO public")
        cursor.execute(SCHEMA_FILE.read_text())
    migrated, from_file = _catalog(database_url, db.VERSION_TABLE), _catalog(file_url, db.VERSION_TABLE)
    # Something was compared: the migrations' objects are there (the names of every function, a count of the rest).
    assert sorted(name.split("(")[0] for name in migrated["function"]) == [
        "claim_spider_jobs", "crawl_request_release", "scrapyd_nodes_want_work", "scrapyd_pgqueue_wanted_nodes", "scrapyd_pgqueue_wanted_nodes",
        "spider_job_ended_events", "spider_job_key_unless_taken", "spider_job_pending_pools", "spider_job_running",
        "spider_job_stats_summary", "spider_job_unroutable_pools", "spider_tree_count"]
    assert {kind: len(objects) for kind, objects in migrated.items()} == {
        "table": 17, "column": 160, "constraint": 36, "index": 39, "sequence": 6, "trigger": 6, "function": 12,
        "type": 0, "comment": 0, "rows": 17}
    differences = _differences(migrated, from_file)
    assert not differences, "store/schema.sql differs from the migrated database:\n" + "\n".join(differences)
