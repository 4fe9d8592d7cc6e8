"""One clock: a job's created, start and end times are the database's, with time zone (timestamptz).

Revision ID: 0007
Revises: 0006
"""

import runpy
from pathlib import Path

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

JOB_TIMES = ("created_time", "start_time", "end_time")

# The earlier migrations' functions, whose SQL is rewritten here rather than copied (a migration never changes).
_VERSIONS = Path(__file__).parent
CLAIM_FUNCTION = runpy.run_path(str(_VERSIONS / "0006_claim_function.py"))["CLAIM_FUNCTION"]
COUNT_TREE_JOBS = runpy.run_path(str(_VERSIONS / "0005_trees.py"))["COUNT_TREE_JOBS"]
OLD_CLAIM_SIGNATURE = "claim_spider_jobs(text[], integer, text, text, timestamp, text)"


def _rewritten(sql: str, *changes: tuple[str, str]) -> str:
    for old, new in changes:
        assert old in sql, f"{old!r} not found"
        sql = sql.replace(old, new)
    return sql


# A claim stamps start_time with the database's clock, instead of the node's p_start.
CLAIM_ON_DATABASE_CLOCK = _rewritten(
    CLAIM_FUNCTION,
    ("p_worker text, p_start timestamp, p_channel text", "p_worker text, p_channel text"),
    ("start_time = $5", "start_time = now()"),
    ("USING p_projects, p_limit, p_node, p_worker, p_start", "USING p_projects, p_limit, p_node, p_worker"),
    ("start_time = p_start", "start_time = now()"),
)
# The _on_complete job a tree's last ending enqueues is created at now(), not at the session's localtimestamp.
COUNT_TREE_JOBS_ON_DATABASE_CLOCK = _rewritten(
    COUNT_TREE_JOBS, ("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"), ("localtimestamp", "now()")
)


def _alter_job_times(type_name: str) -> str:
    return "ALTER TABLE spider_job " + ", ".join(f"ALTER COLUMN {column} TYPE {type_name}" for column in JOB_TIMES)


def upgrade() -> None:
    # The stored times were each node's naive local time, and which node wrote which zone is not recorded: they are
    # read in this session's TimeZone (the database server's setting, unless the migrating role or PGTZ sets
    # another), the zone the nodes shared in the usual deployment (all in UTC, like the server). In UTC, Postgres
    # changes the type without rewriting the table or its end_time index (constant time, whatever the backlog);
    # in another zone, one rewrite of the table for the three columns at once (a million rows: 0.2 s in UTC, 4.7 s
    # in America/Adak, on two busy cores).
    op.execute(_alter_job_times("timestamptz"))
    op.execute(f"DROP FUNCTION {OLD_CLAIM_SIGNATURE}")
    op.execute(CLAIM_ON_DATABASE_CLOCK)
    op.execute(COUNT_TREE_JOBS_ON_DATABASE_CLOCK)


def downgrade() -> None:
    op.execute("DROP FUNCTION claim_spider_jobs(text[], integer, text, text, text)")
    op.execute(CLAIM_FUNCTION)
    op.execute(_rewritten(COUNT_TREE_JOBS, ("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")))
    op.execute(_alter_job_times("timestamp"))  # naive, in this session's TimeZone
