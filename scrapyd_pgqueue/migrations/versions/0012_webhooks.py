"""Webhooks: the operator's hooks and an outbox of their events, written in the transaction that caused each one.

Revision ID: 0012
Revises: 0011
"""

import runpy
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_VERSIONS = Path(__file__).parent
COUNT_TREE_JOBS_ON_DATABASE_CLOCK = runpy.run_path(str(_VERSIONS / "0007_one_clock.py"))[
    "COUNT_TREE_JOBS_ON_DATABASE_CLOCK"]

# 0007's tree count, plus: the ending that completes a tree writes a tree_done event for each hook that wants one, in
# the same transaction (exactly once, as the completion job). store/schema.sql holds it with its reasons.
TREE_DONE_EVENT = """
            PERFORM pg_notify('scrapyd_pgqueue_trees', CAST(json_build_object(
                'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id) AS text));
            INSERT INTO webhook_event (webhook_id, event, fields)
            SELECT w.id, 'tree_done', jsonb_build_object(
                       'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id, 'jobs', tree.total,
                       'cancelled', tree.cancelled, 'completion_job', tree.completion_job,
                       'start_time', tree.created_time, 'end_time', tree.done_time)
            FROM webhook AS w
            WHERE 'tree_done' = ANY(w.events) AND (w.project IS NULL OR w.project = tree.project);"""
_OLD_NOTIFY = """
            PERFORM pg_notify('scrapyd_pgqueue_trees', CAST(json_build_object(
                'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id) AS text));"""
assert _OLD_NOTIFY in COUNT_TREE_JOBS_ON_DATABASE_CLOCK
# The completion job's id is read back after it is set, for the event.
_OLD_COMPLETION = "UPDATE spider_tree SET completion_job = completion WHERE root_id = tree.root_id;"
assert _OLD_COMPLETION in COUNT_TREE_JOBS_ON_DATABASE_CLOCK
COUNT_TREE_JOBS_WITH_EVENTS = COUNT_TREE_JOBS_ON_DATABASE_CLOCK.replace(_OLD_NOTIFY, TREE_DONE_EVENT).replace(
    _OLD_COMPLETION, _OLD_COMPLETION + "\n                tree.completion_job := completion;")


def _pin_search_path() -> None:
    """CREATE OR REPLACE drops the function's SET clauses: pinned again as 0010 pins every function (the schema
    migrated, then pg_temp), so that a session's temporary tables are never the function's."""
    op.execute("DO $$ BEGIN EXECUTE format('ALTER FUNCTION spider_tree_count() SET search_path = %I, pg_temp', "
               "current_schema()); END $$")


def upgrade() -> None:
    # The operator's hooks: a few rows. The secret is a column of its own (the node role reads it to sign; no list,
    # log, page or metric shows it). deliveries / failures: events delivered / given up after webhook_retry_hours.
    op.create_table(
        "webhook",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("events", ARRAY(sa.Text), nullable=False),
        sa.Column("project", sa.Text),
        sa.Column("format", sa.Text, nullable=False, server_default=sa.text("'json'")),
        sa.Column("secret", sa.Text),
        sa.Column("deliveries", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("failures", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text),
        sa.Column("last_error_time", sa.DateTime(timezone=True)),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.CheckConstraint("format IN ('json', 'slack')", name="webhook_format_check"),
        sa.CheckConstraint("cardinality(events) > 0", name="webhook_events_check"),
    )
    # The outbox: one row per event and hook until it is delivered or given up. due_time: when it may be sent next
    # (a node that claims it moves it a lease ahead, so that a node killed mid-delivery loses nothing).
    op.create_table(
        "webhook_event",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("webhook_id", sa.BigInteger, sa.ForeignKey("webhook.id", ondelete="CASCADE"), nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("fields", JSONB, nullable=False),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("due_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("claimed_by", sa.Text),
        sa.Column("last_error", sa.Text),
    )
    op.create_index("webhook_event_due_idx", "webhook_event", ["due_time"])
    op.create_index("webhook_event_webhook_idx", "webhook_event", ["webhook_id"])
    op.execute(COUNT_TREE_JOBS_WITH_EVENTS)
    _pin_search_path()


def downgrade() -> None:
    op.execute(COUNT_TREE_JOBS_ON_DATABASE_CLOCK)
    _pin_search_path()
    op.drop_table("webhook_event")
    op.drop_table("webhook")
