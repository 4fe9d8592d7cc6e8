"""The server's side of the claim alone: Postgres's own pgbench (C, next to initdb) sends (d) the store's claim and
(b) the seed's LOCK TABLE transaction from N connections, so the claimers' Python costs nothing and the two designs
compare on what the server does for them. On a machine where clients and server share the cores, this is the
ceiling of any client's ratio.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import tempfile
from pathlib import Path

from sqlalchemy import make_url

from bench import database
from bench.claimers import lean_claim_statement
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.store import CLAIM_NEXT_JOBS, NOTIFY_CHANNEL

# The seed's pop as SeedLockTable sends it (bench/claimers.py), as one pgbench transaction.
SEED_TRANSACTION = f"""
BEGIN;
LOCK TABLE {database.SEED_TABLE} IN SHARE ROW EXCLUSIVE MODE;
SELECT id, priority, message, status, project, spider, job, start_time, end_time FROM {database.SEED_TABLE}
  WHERE status = 'pending' ORDER BY priority DESC LIMIT 1 \\gset
UPDATE {database.SEED_TABLE} SET status = 'ongoing' WHERE id = :id;
COMMIT;
"""


def claim_script(url: str, project: str, statement: str = CLAIM_NEXT_JOBS) -> str:
    """The store's claim (or ``statement``, with the same placeholders) with (a)'s values, as the driver sends it
    (psycopg2 renders the parameters): a node without tags."""
    params = {"projects": [project], "limit": 1, "node": "pgbench", "worker": "pgbench",
              "now": datetime.datetime.now(), "channel": NOTIFY_CHANNEL}
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        statement = cursor.mogrify(statement, params).decode()
    return " ".join(statement.split()) + ";\n"


def lean_claim_script(url: str) -> str:
    """(e) The lean claim statement, as psycopg2 sends it for one claimer."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        statement = cursor.mogrify(lean_claim_statement(), {"node": "pgbench", "worker": "pgbench"}).decode()
    return " ".join(statement.split()) + ";\n"


def transactions_per_second(url: str, script: str, clients: int, seconds: float) -> float:
    """pgbench -c clients for ``seconds``: transactions per second, without connection time."""
    parsed = make_url(url)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "script.sql"
        path.write_text(script)
        completed = subprocess.run(
            [str(devdb.postgres_bin_dir() / "pgbench"), "-n", "-M", "simple", "-f", str(path), "-c", str(clients),
             "-j", str(min(clients, 2)), "-T", str(max(1, round(seconds))), "-h", parsed.host or "127.0.0.1",
             "-p", str(parsed.port or 5432), "-U", parsed.username or "postgres", parsed.database or "postgres"],
            capture_output=True, text=True, check=True,
            env={"PGPASSWORD": parsed.password or "", "PATH": "/usr/bin:/bin"},
        )
    found = re.search(r"tps = ([0-9.]+)", completed.stdout)
    if found is None:
        raise RuntimeError(f"pgbench printed no rate: {completed.stdout[-500:]} {completed.stderr[-500:]}")
    return float(found.group(1))
