"""The watchdog's limits per job and periodic job (max_runtime, stall_timeout), and its outcomes timeout and stalled.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

OLD_OUTCOMES = "('finished', 'failed', 'cancelled', 'lost', 'interrupted', 'dead')"
NEW_OUTCOMES = "('finished', 'failed', 'cancelled', 'lost', 'interrupted', 'dead', 'timeout', 'stalled')"


def upgrade() -> None:
    # Nullable columns without a default: adding them rewrites no row of a populated table.
    for table in ("spider_job", "periodic_job"):
        op.add_column(table, sa.Column("max_runtime", sa.Float))
        op.add_column(table, sa.Column("stall_timeout", sa.Float))
    # NOT VALID, then VALIDATE: the table is scanned without blocking writes (the old rows all pass).
    op.drop_constraint("spider_job_outcome_check", "spider_job")
    op.execute(f"ALTER TABLE spider_job ADD CONSTRAINT spider_job_outcome_check CHECK (outcome IN {NEW_OUTCOMES}) "
               "NOT VALID")
    op.execute("ALTER TABLE spider_job VALIDATE CONSTRAINT spider_job_outcome_check")


def downgrade() -> None:
    # The new outcomes read as what they were before: a crawl that failed.
    op.execute("UPDATE spider_job SET outcome = 'failed' WHERE outcome IN ('timeout', 'stalled')")
    op.drop_constraint("spider_job_outcome_check", "spider_job")
    op.create_check_constraint("spider_job_outcome_check", "spider_job", f"outcome IN {OLD_OUTCOMES}")
    for table in ("spider_job", "periodic_job"):
        op.drop_column(table, "stall_timeout")
        op.drop_column(table, "max_runtime")
