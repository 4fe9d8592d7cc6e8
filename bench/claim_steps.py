"""Where a claim's server time goes: ``pgbench -c 16`` of the lean claim on a lean table, the same statement on
``spider_job``, and the store's claim function with and without its steps before the claim.

    python -m bench.claim_steps postgresql://postgres@127.0.0.1:5432/scratch [rounds]

The database must be empty (it is migrated, filled and refilled). Variants of ``claim_spider_jobs`` are created
beside it from its own definition (``claim_v1``: neither the next due time nor the limits check, ``v2``: no next due
time, ``v3``: no limits check, ``v4``: both checks in one statement); the table ``lean`` has the queue's columns and
one partial index on pending rows. Prints claims per second per case and round, then EXPLAIN (ANALYZE, BUFFERS, WAL)
of one lean claim on each table.
"""

from __future__ import annotations

import re
import sys

import psycopg2

from bench import pgbench
from scrapyd_pgqueue import db
from scrapyd_pgqueue.store import CLAIM_NEXT_JOBS, NOTIFY_CHANNEL

JOBS = 200_000
CLAIMERS = 16
SECONDS = 5
FILL = """
    INSERT INTO {table} (project, spider, job, priority, message, status, created_time)
    SELECT 'p', 'spider' || (i %% 13), 'j' || i, floor(random() * 10),
           jsonb_build_object('name', 'spider' || (i %% 13), '_job', 'j' || i, 'settings', '{{}}'::jsonb), 'pending',
           now()
    FROM generate_series(1, %s) AS i
"""
LEAN_TABLE = """
    CREATE TABLE IF NOT EXISTS lean (id bigserial PRIMARY KEY, project text, spider text, job text, priority float8,
        message jsonb, status text, node text, worker text, start_time timestamptz, attempts int DEFAULT 0,
        created_time timestamptz);
    CREATE INDEX IF NOT EXISTS lean_pending ON lean (priority DESC, id) WHERE status = 'pending'
"""
LIMITS_CHECK = re.compile(r"IF p_limit > 0 AND EXISTS \(SELECT FROM spider_limit AS l\s+WHERE p_projects IS NULL "
                          r"OR l\.project = ANY\(p_projects\)\) THEN")
NEXT_DUE = "v_next_due timestamptz := spider_job_next_due(p_projects);"


def lean_claim(table: str) -> str:
    return (f"UPDATE {table} SET status = 'ongoing', node = 'pgbench', worker = 'pgbench', start_time = now(), "
            f"attempts = attempts + 1 WHERE id = (SELECT id FROM {table} WHERE status = 'pending' "
            f"ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING message;\n")


def variants(definition: str) -> dict[str, str]:
    """The claim function's variants, each a CREATE FUNCTION of its own name."""
    def named(name: str, sql: str) -> str:
        return sql.replace("public.claim_spider_jobs(", f"public.{name}(")

    no_limits = LIMITS_CHECK.sub("IF false THEN", definition)
    merged = LIMITS_CHECK.sub("IF p_limit > 0 AND v_limited THEN", definition).replace(
        NEXT_DUE, "v_next_due timestamptz;\n        v_limited boolean;").replace(
        "    BEGIN\n", "    BEGIN\n        SELECT spider_job_next_due(p_projects), EXISTS (SELECT FROM spider_limit "
        "AS l WHERE p_projects IS NULL OR l.project = ANY(p_projects)) INTO v_next_due, v_limited;\n", 1)
    return {
        "claim_v1": named("claim_v1", no_limits.replace(NEXT_DUE, "v_next_due timestamptz := NULL;")),
        "claim_v2": named("claim_v2", definition.replace(NEXT_DUE, "v_next_due timestamptz := NULL;")),
        "claim_v3": named("claim_v3", no_limits),
        "claim_v4": named("claim_v4", merged),
    }


def main(url: str, rounds: int) -> None:
    db.get_engine(url).dispose()  # the schema
    connection = psycopg2.connect(url)
    connection.autocommit = True
    cursor = connection.cursor()
    cursor.execute(LEAN_TABLE)
    cursor.execute("SELECT pg_get_functiondef('claim_spider_jobs'::regproc)")
    for sql in variants(cursor.fetchone()[0]).values():
        cursor.execute(sql)
    params = {"projects": ["p"], "limit": 1, "node": "pgbench", "worker": "pgbench", "channel": NOTIFY_CHANNEL}
    claim = " ".join(cursor.mogrify(CLAIM_NEXT_JOBS, params).decode().split()) + ";\n"
    cases = {
        "lean statement, lean table": ("lean", lean_claim("lean")),
        "lean statement, spider_job": ("spider_job", lean_claim("spider_job")),
        "claim_spider_jobs (pop)": ("spider_job", claim),
        "v1: no next due, no limits check": ("spider_job", claim.replace("claim_spider_jobs(", "claim_v1(")),
        "v2: no next due": ("spider_job", claim.replace("claim_spider_jobs(", "claim_v2(")),
        "v3: no limits check": ("spider_job", claim.replace("claim_spider_jobs(", "claim_v3(")),
        "v4: both checks in one statement": ("spider_job", claim.replace("claim_spider_jobs(", "claim_v4(")),
    }
    for _ in range(rounds):
        for name, (table, script) in cases.items():
            refill(cursor, table)
            rate = pgbench.transactions_per_second(url, script, CLAIMERS, SECONDS)
            print(f"{name:40} x{CLAIMERS} {rate:8,.0f}/s", flush=True)
    for table in ("lean", "spider_job"):
        refill(cursor, table)
        print(table, explain(cursor, lean_claim(table)))


def refill(cursor, table: str) -> None:
    cursor.execute(f"TRUNCATE {table} RESTART IDENTITY CASCADE")
    cursor.execute(FILL.format(table=table), (JOBS,))
    cursor.execute(f"VACUUM ANALYZE {table}")
    cursor.execute("CHECKPOINT")


def explain(cursor, statement: str) -> dict:
    cursor.execute("BEGIN")
    cursor.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + statement.rstrip(";\n"))
    plan = cursor.fetchone()[0][0]
    cursor.execute("ROLLBACK")
    top = plan["Plan"]
    return {"buffers hit": top.get("Shared Hit Blocks"), "dirtied": top.get("Shared Dirtied Blocks"),
            "WAL records": top.get("WAL Records"), "planning ms": plan["Planning Time"],
            "execution ms": plan["Execution Time"]}


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
