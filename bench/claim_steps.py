"""Where a claim's server time goes: ``pgbench -c 16`` of the lean claim on its lean table, the same statement on
``spider_job`` and on copies of it with other indexes, a split design, the store's claim function, the same function
planned for each call, and migration 0007's claim function (before the hot path), side by side in one run.

    python -m bench.claim_steps [--url postgresql://postgres@127.0.0.1:5432/scratch] [rounds]

Without --url it runs on a throwaway server with the throughput suite's settings (the package's local Postgres:
fsync and synchronous_commit off, so the claims compare on CPU, not on WAL flushes). A database given must be empty.
It is migrated, filled and refilled; autovacuum is off for its tables, so that a run never pays for the run before
it (each fill ends with VACUUM ANALYZE). The variants are created beside the store's function and table from their
own definitions, again on each run:
- ``claim_planned_per_call`` is the store's function without its ``plan_cache_mode``; ``claim_0007`` is migration
  0007's (with 0006's ``spider_job_next_due``, which it reads first);
- the copies of ``spider_job`` (``TABLE_DESIGNS``) keep its columns and change only its indexes;
- the split keeps waiting jobs in a narrow queue table and running ones in a running table, and the claim's update of
  the job row is HOT (no index of the job table reads a column the claim changes).
Prints claims per second per case and round, the median of each case against the lean claim's, then EXPLAIN
(ANALYZE, BUFFERS, WAL) of one lean claim on each table.
"""

from __future__ import annotations

import argparse
import runpy
import statistics
import sys
from pathlib import Path

from bench import database, pgbench
from bench.claimers import lean_claim_statement
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.store import CLAIM_NEXT_JOBS, NOTIFY_CHANNEL

JOBS = 200_000
CLAIMERS = 16
SECONDS = 5
VERSIONS = Path(__file__).parent.parent / "scrapyd_pgqueue" / "migrations" / "versions"
LIVE = "('delayed', 'pending', 'ongoing')"

# Copies of spider_job that differ only in the indexes that a claimed ('ongoing') row gets an entry in: the queue
# has five (primary key, spider_job_live_job_key, spider_job_job_idx and the two ongoing indexes), the lean table one.
# The copied indexes carry the names Postgres gives them (table, columns, "idx").
TABLE_DESIGNS = {
    # Every feature kept, in the fewest entries: the live job key doubles as the job index of live jobs (job first),
    # finished jobs have their own job index, and one ongoing index serves leases (by worker) and limits (a scan of
    # the running jobs, not of one spider's): three entries.
    "claim_design_fewest": [
        "DROP INDEX claim_design_fewest_job_idx", "DROP INDEX claim_design_fewest_project_job_idx",
        "DROP INDEX claim_design_fewest_project_spider_idx", "DROP INDEX claim_design_fewest_worker_idx",
        f"CREATE UNIQUE INDEX ON claim_design_fewest (job, project) WHERE status IN {LIVE}",
        "CREATE INDEX ON claim_design_fewest (job) WHERE status = 'terminated'",
        "CREATE INDEX ON claim_design_fewest (worker, project, spider) WHERE status = 'ongoing'",
    ],
    # Without the four (unique live job ids, running jobs by job id, leases, limits all lost): one entry.
    "claim_design_no_ongoing_indexes": [
        "DROP INDEX claim_design_no_ongoing_indexes_job_idx",
        "DROP INDEX claim_design_no_ongoing_indexes_project_job_idx",
        "DROP INDEX claim_design_no_ongoing_indexes_project_spider_idx",
        "DROP INDEX claim_design_no_ongoing_indexes_worker_idx",
    ],
}

# The split: waiting jobs in a queue table (the claim deletes its row: no index entry), running ones in a running
# table (leases by worker, limits by spider), the job table without an index on any column the claim changes.
CREATE_SPLIT = """
    CREATE TABLE claim_split_job (LIKE spider_job INCLUDING DEFAULTS INCLUDING IDENTITY, PRIMARY KEY (id))
        WITH (fillfactor = 90, autovacuum_enabled = false);
    CREATE INDEX ON claim_split_job (job);
    CREATE TABLE claim_split_waiting (id bigint PRIMARY KEY, project text NOT NULL, spider text NOT NULL,
                                      priority double precision NOT NULL) WITH (autovacuum_enabled = false);
    CREATE INDEX ON claim_split_waiting (project, priority DESC, id);
    CREATE TABLE claim_split_running (id bigint PRIMARY KEY, project text NOT NULL, spider text NOT NULL,
                                      worker text NOT NULL) WITH (autovacuum_enabled = false);
    CREATE INDEX ON claim_split_running (worker);
    CREATE INDEX ON claim_split_running (project, spider)
"""
SPLIT_TABLES = ("claim_split_job", "claim_split_waiting", "claim_split_running")
FILL_SPLIT = """
    TRUNCATE claim_split_waiting, claim_split_running;
    INSERT INTO claim_split_waiting SELECT id, project, spider, priority FROM claim_split_job;
    VACUUM ANALYZE claim_split_waiting;
    VACUUM ANALYZE claim_split_running
"""
SPLIT_CLAIM = """
    WITH claimed AS (
        DELETE FROM claim_split_waiting WHERE id = ANY(ARRAY(
            SELECT id FROM claim_split_waiting WHERE project = 'p' ORDER BY priority DESC, id LIMIT 1
            FOR UPDATE SKIP LOCKED))
        RETURNING id
    ), job AS (
        UPDATE claim_split_job AS j
        SET status = 'ongoing', node = 'pgbench', worker = 'pgbench', start_time = now(), attempts = j.attempts + 1
        FROM claimed WHERE j.id = claimed.id
        RETURNING j.id, j.project, j.spider, j.job, j.attempts, j.message
    ), running AS (
        INSERT INTO claim_split_running (id, project, spider, worker)
        SELECT id, project, spider, 'pgbench' FROM job
    )
    SELECT id, project, job, attempts, message FROM job
"""


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


def create_tables(cursor) -> None:
    """The table designs (copies of spider_job with their own indexes) and the split; autovacuum off throughout."""
    cursor.execute(f"DROP TABLE IF EXISTS {', '.join([*TABLE_DESIGNS, *SPLIT_TABLES])}")
    for table, changes in TABLE_DESIGNS.items():
        cursor.execute(f"CREATE TABLE {table} (LIKE spider_job INCLUDING ALL)")
        for change in changes:
            cursor.execute(change)
    cursor.execute(CREATE_SPLIT)
    for table in ("spider_job", database.LEAN_TABLE, *TABLE_DESIGNS):
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def fill(url: str, cursor, table: str) -> None:
    database.fill_spider_job(url, JOBS, ["p"], prefix="j", table=table)
    if table == "claim_split_job":
        for statement in FILL_SPLIT.split(";"):  # VACUUM runs alone
            cursor.execute(statement)


def main(url: str, rounds: int) -> None:
    database.prepare_schema(url)  # the queue's schema and the lean table
    connection = database.connect(url, autocommit=True)
    cursor = connection.cursor()
    for sql in variants(cursor):
        cursor.execute(sql)
    create_tables(cursor)
    params = {"projects": ["p"], "limit": 1, "node": "pgbench", "worker": "pgbench", "channel": NOTIFY_CHANNEL}
    claim = " ".join(cursor.mogrify(CLAIM_NEXT_JOBS, params).decode().split()) + ";\n"

    def lean(table: str) -> str:
        return cursor.mogrify(lean_claim_statement(table), {"node": "pgbench", "worker": "pgbench"}).decode() + ";\n"

    cases = {
        "lean statement, lean table": (database.LEAN_TABLE, lean(database.LEAN_TABLE)),
        "lean statement, spider_job": ("spider_job", lean("spider_job")),
        "lean statement, fewest entries (3)": ("claim_design_fewest", lean("claim_design_fewest")),
        "lean statement, no ongoing indexes (1)": (
            "claim_design_no_ongoing_indexes", lean("claim_design_no_ongoing_indexes")),
        "split: queue, running, HOT job row": ("claim_split_job", " ".join(SPLIT_CLAIM.split()) + ";\n"),
        "claim_spider_jobs (pop)": ("spider_job", claim),
        "the same, planned for each call": (
            "spider_job", claim.replace("claim_spider_jobs(", "claim_planned_per_call(")),
        "migration 0007's claim_spider_jobs": ("spider_job", claim.replace("claim_spider_jobs(", "claim_0007(")),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (table, script) in cases.items():
            fill(url, cursor, table)
            cursor.execute("CHECKPOINT")
            rates[name].append(pgbench.transactions_per_second(url, script, CLAIMERS, SECONDS))
            print(f"{name:40} x{CLAIMERS} {rates[name][-1]:8,.0f}/s", flush=True)
    lean_median = statistics.median(rates["lean statement, lean table"])
    print(f"\nmedian of {rounds} round(s)                          claims/s   / lean")
    for name, values in rates.items():
        print(f"{name:40} {statistics.median(values):10,.0f}   {statistics.median(values) / lean_median:5.2f}")
    for table in (database.LEAN_TABLE, "spider_job", *TABLE_DESIGNS):
        fill(url, cursor, table)
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


def run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_steps", description="The claim's server cost.")
    parser.add_argument("rounds", type=int, nargs="?", default=2)
    parser.add_argument("--url", help="an empty database (default: a throwaway server)")
    arguments = parser.parse_args(argv)
    if arguments.url is not None:
        main(arguments.url, arguments.rounds)
        return
    server = devdb.throwaway_postgres()
    try:
        main(server.url, arguments.rounds)
    finally:
        server.remove()


if __name__ == "__main__":
    run(sys.argv[1:])
