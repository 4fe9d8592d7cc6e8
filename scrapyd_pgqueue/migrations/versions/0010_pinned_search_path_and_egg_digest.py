"""Every function with a pinned search path, and the sha256 of each egg.

Revision ID: 0010
Revises: 0009
"""

from alembic import op
from sqlalchemy import text

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The functions the earlier migrations created, as ALTER FUNCTION names them.
FUNCTIONS = (
    "claim_spider_jobs(text[], integer, text, text, text)",
    "spider_job_running(text, text)",
    "spider_tree_count()",
    "scrapyd_pgqueue_wanted_nodes(integer)",
)
# 0008 created this one with its search path pinned already; the downgrade leaves it so.
PINNED_BEFORE = "scrapyd_pgqueue_wanted_nodes(integer)"


def upgrade() -> None:
    connection = op.get_bind()
    # A function resolves the names in its body with the caller's search path, where pg_temp comes first unless
    # named: a session's TEMP TABLE spider_job would be read and written instead of the queue's. Pinned to the
    # schema the functions live in (the one being migrated), then pg_temp, last.
    path = connection.execute(text("SELECT quote_ident(current_schema()) || ', pg_temp'")).scalar()
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} SET search_path = {path}")
    # The digest a node checks an egg against before a crawl runs it; nodes compute it on deploy. Existing eggs get
    # theirs here (a handful of rows of a few hundred kilobytes: hashed in milliseconds).
    op.execute("ALTER TABLE project_egg ADD COLUMN sha256 bytea")
    op.execute("UPDATE project_egg SET sha256 = sha256(egg)")
    op.execute("ALTER TABLE project_egg ALTER COLUMN sha256 SET NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE project_egg DROP COLUMN sha256")
    for function in FUNCTIONS:
        if function != PINNED_BEFORE:
            op.execute(f"ALTER FUNCTION {function} RESET search_path")
