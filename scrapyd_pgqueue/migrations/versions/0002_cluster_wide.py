"""Eggs and logs shared by the cluster; cancel requests that reach whichever node runs the job.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Deploy once: addversion.json on any node makes the version runnable on every node.
    op.create_table(
        "project_egg",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("project", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("egg", sa.LargeBinary, nullable=False),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.UniqueConstraint("project", "version", name="project_egg_project_version_key"),
    )
    # A finished job's log (its tail, capped), served by every node; pruned with the job's row.
    op.create_table(
        "job_log",
        sa.Column("job_id", sa.BigInteger, sa.ForeignKey("spider_job.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("log", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),  # of the whole log file, before the cap
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    # Each cancel.json on a running job counts one request (one signal, as Scrapyd sends one per call); the
    # running node delivers the requests it has not delivered yet, whether it hears the NOTIFY or polls.
    op.add_column("spider_job", sa.Column("cancel_requests", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("spider_job", sa.Column("cancel_signal", sa.Text))


def downgrade() -> None:
    op.drop_column("spider_job", "cancel_signal")
    op.drop_column("spider_job", "cancel_requests")
    op.drop_table("job_log")
    op.drop_table("project_egg")
