"""Scheduling: delayed, unique, retried and periodic jobs, per-spider limits.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

WAITING = "status IN ('delayed', 'pending')"

# How many jobs of one spider run in the cluster now. VOLATILE on purpose: a volatile function takes a fresh
# snapshot for each query it runs, so the claim, which calls it just after locking the spider's limit row, counts
# the claims other nodes committed while it waited for that lock (its own snapshot, taken before, would miss them).
RUNNING_JOBS_OF_SPIDER = """
    CREATE FUNCTION spider_job_running(p_project text, p_spider text) RETURNS integer
    LANGUAGE sql VOLATILE AS $$
        SELECT count(*)::integer FROM spider_job
        WHERE status = 'ongoing' AND project = p_project AND spider = p_spider
    $$
"""


def upgrade() -> None:
    # Delayed jobs wait in their own state until run_at (database clock); retries wait there too.
    op.add_column("spider_job", sa.Column("run_at", sa.DateTime(timezone=True)))
    op.add_column("spider_job", sa.Column("unique_key", sa.Text))
    op.add_column("spider_job", sa.Column("retries", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("spider_job", sa.Column("retry_delay", sa.Float, nullable=False, server_default=sa.text("0")))
    op.add_column("spider_job", sa.Column("failures", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("spider_job", sa.Column("periodic", sa.Text))
    op.drop_constraint("spider_job_status_check", "spider_job")
    op.create_check_constraint(
        "spider_job_status_check", "spider_job", "status IN ('delayed', 'pending', 'ongoing', 'terminated')"
    )
    op.drop_constraint("spider_job_outcome_check", "spider_job")
    op.create_check_constraint(
        "spider_job_outcome_check",
        "spider_job",
        "outcome IN ('finished', 'failed', 'cancelled', 'lost', 'interrupted', 'dead')",
    )
    # A waiting (delayed) job id is live too: built under a new name, then swapped, so a populated table keeps the
    # guarantee throughout the migration.
    op.create_index(
        "spider_job_live_job_key_new",
        "spider_job",
        ["project", "job"],
        unique=True,
        postgresql_where=sa.text("status IN ('delayed', 'pending', 'ongoing')"),
    )
    op.drop_index("spider_job_live_job_key", "spider_job")
    op.execute("ALTER INDEX spider_job_live_job_key_new RENAME TO spider_job_live_job_key")
    # The claim reads due delayed jobs from the head of this index: its cost does not grow with those still waiting.
    op.create_index(
        "spider_job_delayed_idx", "spider_job", ["run_at"], postgresql_where=sa.text("status = 'delayed'")
    )
    # Past-due counts: pending jobs by the time they became due, read up to a cap from this index's head. A pending
    # job's run_at is its due time (its enqueue, or the end of its delay); the waiting ones get theirs now.
    op.execute("UPDATE spider_job SET run_at = CAST(created_time AS timestamptz) WHERE status = 'pending'")
    op.create_index(
        "spider_job_pending_due_idx", "spider_job", ["run_at"], postgresql_where=sa.text("status = 'pending'")
    )
    # _unique_key: one waiting job per key and project, enforced by the database for concurrent schedules.
    op.create_index(
        "spider_job_waiting_unique_key",
        "spider_job",
        ["project", "unique_key"],
        unique=True,
        postgresql_where=sa.text(f"{WAITING} AND unique_key IS NOT NULL"),
    )
    # Per-spider limits: the next pending jobs of one spider, and how many of it run.
    op.create_index(
        "spider_job_pending_spider_idx",
        "spider_job",
        ["project", "spider", sa.text("priority DESC"), "id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "spider_job_ongoing_spider_idx",
        "spider_job",
        ["project", "spider"],
        postgresql_where=sa.text("status = 'ongoing'"),
    )
    op.execute(RUNNING_JOBS_OF_SPIDER)

    op.create_table(
        "spider_limit",
        sa.Column("project", sa.Text, primary_key=True),
        sa.Column("spider", sa.Text, primary_key=True),
        sa.Column("max_running", sa.Integer, nullable=False),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("max_running > 0", name="spider_limit_max_running_check"),
    )
    op.create_table(
        "periodic_job",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("project", sa.Text, nullable=False),
        sa.Column("spider", sa.Text, nullable=False),
        sa.Column("cron", sa.Text),
        sa.Column("timezone", sa.Text, nullable=False, server_default=sa.text("'UTC'")),
        sa.Column("every_seconds", sa.Float),
        sa.Column("priority", sa.Float, nullable=False, server_default=sa.text("0")),
        sa.Column("args", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("settings", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("overlap", sa.Text, nullable=False, server_default=sa.text("'skip'")),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("next_fire_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_fire_time", sa.DateTime(timezone=True)),
        sa.Column("last_job_id", sa.BigInteger),
        sa.Column("last_job", sa.Text),
        sa.Column("fired", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("skipped", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="periodic_job_cron_or_every_check"),
        sa.CheckConstraint("every_seconds IS NULL OR every_seconds > 0", name="periodic_job_every_check"),
        sa.CheckConstraint("overlap IN ('skip', 'queue')", name="periodic_job_overlap_check"),
    )


def downgrade() -> None:
    op.drop_table("periodic_job")
    op.drop_table("spider_limit")
    op.execute("DROP FUNCTION spider_job_running(text, text)")
    op.drop_index("spider_job_ongoing_spider_idx", "spider_job")
    op.drop_index("spider_job_pending_spider_idx", "spider_job")
    op.drop_index("spider_job_waiting_unique_key", "spider_job")
    op.drop_index("spider_job_pending_due_idx", "spider_job")
    op.drop_index("spider_job_delayed_idx", "spider_job")
    op.execute("DELETE FROM spider_job WHERE status = 'delayed' OR outcome = 'dead'")
    op.drop_index("spider_job_live_job_key", "spider_job")
    op.create_index(
        "spider_job_live_job_key",
        "spider_job",
        ["project", "job"],
        unique=True,
        postgresql_where=sa.text("status IN ('pending', 'ongoing')"),
    )
    op.drop_constraint("spider_job_outcome_check", "spider_job")
    op.create_check_constraint(
        "spider_job_outcome_check", "spider_job", "outcome IN ('finished', 'failed', 'cancelled', 'lost', 'interrupted')"
    )
    op.drop_constraint("spider_job_status_check", "spider_job")
    op.create_check_constraint("spider_job_status_check", "spider_job", "status IN ('pending', 'ongoing', 'terminated')")
    for column in ("periodic", "failures", "retry_delay", "retries", "unique_key", "run_at"):
        op.drop_column("spider_job", column)
