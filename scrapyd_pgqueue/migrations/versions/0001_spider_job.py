"""The spider_job queue table and the scrapyd_node heartbeat table.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

LIVE = sa.text("status IN ('pending', 'ongoing')")
PENDING = sa.text("status = 'pending'")


def upgrade() -> None:
    op.create_table(
        "spider_job",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("project", sa.Text, nullable=False),
        sa.Column("spider", sa.Text, nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("version", sa.Text),
        sa.Column("priority", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("message", JSONB),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'")),
        sa.Column("outcome", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("reason", sa.Text),
        sa.Column("node", sa.Text),
        sa.Column("worker", sa.Text),
        sa.Column("pid", sa.Integer),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("created_time", sa.DateTime, nullable=False),
        sa.Column("start_time", sa.DateTime),
        sa.Column("end_time", sa.DateTime),
        sa.CheckConstraint("status IN ('pending', 'ongoing', 'terminated')", name="spider_job_status_check"),
        sa.CheckConstraint(
            "outcome IN ('finished', 'failed', 'cancelled', 'lost', 'interrupted')", name="spider_job_outcome_check"
        ),
    )
    op.create_index("spider_job_live_job_key", "spider_job", ["project", "job"], unique=True, postgresql_where=LIVE)
    op.create_index("spider_job_pending_idx", "spider_job", [sa.text("priority DESC"), "id"], postgresql_where=PENDING)
    op.create_index(
        "spider_job_pending_project_idx",
        "spider_job",
        ["project", sa.text("priority DESC"), "id"],
        postgresql_where=PENDING,
    )
    op.create_index(
        "spider_job_ongoing_worker_idx", "spider_job", ["worker"], postgresql_where=sa.text("status = 'ongoing'")
    )
    op.create_index(
        "spider_job_terminated_idx",
        "spider_job",
        [sa.text("end_time DESC")],
        postgresql_where=sa.text("status = 'terminated'"),
    )
    op.create_index("spider_job_job_idx", "spider_job", ["job"])

    op.create_table(
        "scrapyd_node",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("url", sa.Text),
        sa.Column("max_proc", sa.Integer),
        sa.Column("started_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("heartbeat_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("stopped_time", sa.DateTime(timezone=True)),
    )


def downgrade() -> None:
    op.drop_table("scrapyd_node")
    op.drop_table("spider_job")
