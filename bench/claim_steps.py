"""Where a claim's server time goes: ``pgbench -c 16`` of the lean claim on its lean table, the same statement on
``spider_job``, the store's claim function, the same function planned for each call, and migration 0007's claim
function (before the hot path), side by side in one run.

    python -m bench.claim_steps postgresql://postgres@127.0.0.1:5432/scratch [rounds]

The database must be empty (it is migrated, filled and refilled). The variants are created beside the store's
function from their own definitions: ``claim_planned_per_call`` is the store's function without its
``plan_cache_mode``, ``claim_0007`` is migration 0007's (with 0006's ``spider_job_next_due``, which it reads first).
Prints claims per second per case and round, then EXPLAIN (ANALYZE, BUFFERS, WAL) of one lean claim on each table.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from bench import database, pgbench
from bench.claimers import lean_claim_statement
from scrapyd_pgqueue.store import CLAIM_NEXT_JOBS, NOTIFY_CHANNEL

JOBS = 200_000
CLAIMERS = 16
SECONDS = 5
VERSIONS = Path(__file__).parent.parent / "scrapyd_pgqueue" / "migrations" / "versions"


def variants(cursor) -> list[str]:
    """The CREATE FUNCTIONs of the variants (claim_planned_per_call, claim_0007 and what it calls)."""
    cursor.execute("SELECT pg_get_functiondef('claim_spider_jobs'::regproc)")
    planned_per_call = cursor.fetchone()[0].replace("public.claim_spider_jobs(", "public.claim_planned_per_call(")
    planned_per_call = planned_per_call.replace(" SET plan_cache_mode TO 'force_generic_plan'\n", "")
    before = runpy.run_path(str(VERSIONS / "0009_claim_hot_path.py"))
    claim_0007 = before["CLAIM_ON_DATABASE_CLOCK"].replace("CREATE FUNCTION claim_spider_jobs(",
                                                            "CREATE OR REPLACE FUNCTION claim_0007(")
    next_due = before["NEXT_DUE_FUNCTION"].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    return [planned_per_call, next_due, claim_0007]


def main(url: str, rounds: int) -> None:
    database.prepare_schema(url)  # the queue's schema and the lean table
    connection = database.connect(url, autocommit=True)
    cursor = connection.cursor()
    for sql in variants(cursor):
        cursor.execute(sql)
    params = {"projects": ["p"], "limit": 1, "node": "pgbench", "worker": "pgbench", "channel": NOTIFY_CHANNEL}
    claim = " ".join(cursor.mogrify(CLAIM_NEXT_JOBS, params).decode().split()) + ";\n"

    def lean(table: str) -> str:
        return cursor.mogrify(lean_claim_statement(table), {"node": "pgbench", "worker": "pgbench"}).decode() + ";\n"

    cases = {
        "lean statement, lean table": (database.LEAN_TABLE, lean(database.LEAN_TABLE)),
        "lean statement, spider_job": ("spider_job", lean("spider_job")),
        "claim_spider_jobs (pop)": ("spider_job", claim),
        "the same, planned for each call": (
            "spider_job", claim.replace("claim_spider_jobs(", "claim_planned_per_call(")),
        "migration 0007's claim_spider_jobs": ("spider_job", claim.replace("claim_spider_jobs(", "claim_0007(")),
    }
    for _ in range(rounds):
        for name, (table, script) in cases.items():
            database.fill_spider_job(url, JOBS, ["p"], prefix="j", table=table)
            cursor.execute("CHECKPOINT")
            rate = pgbench.transactions_per_second(url, script, CLAIMERS, SECONDS)
            print(f"{name:40} x{CLAIMERS} {rate:8,.0f}/s", flush=True)
    for table in (database.LEAN_TABLE, "spider_job"):
        database.fill_spider_job(url, JOBS, ["p"], prefix="j", table=table)
        print(table, explain(cursor, lean(table)))


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
