"""Bulk staging: the jobs with a unique key of a big batch are streamed in with COPY, then moved into spider_job by
one statement with the key's rules (the id of each reserved beforehand, in the batch's order).

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# UNLOGGED: a staged row lives only inside the transaction that stages and moves it, so a crash loses nothing worth
# a WAL record. A transaction sees only its own staged rows (every committed one was deleted by its transaction):
# batch (the transaction's id) and n (the job's place in all the transaction stages) let one that stages many
# batches read each from the index, past the dead rows of its earlier batches (which no pruning removes before it
# ends). Rows are dead at commit: vacuumed at every round.
CREATE_STAGING = """
    CREATE UNLOGGED TABLE spider_job_staging (
        batch bigint NOT NULL DEFAULT txid_current(),
        id bigint NOT NULL,
        n bigint NOT NULL,
        spider text NOT NULL,
        job text NOT NULL,
        version text,
        priority double precision NOT NULL,
        message jsonb,
        run_at_epoch double precision,
        delay double precision,
        unique_key text,
        retries integer NOT NULL,
        retry_delay double precision NOT NULL,
        periodic text,
        parent text,
        parent_id bigint,
        tree_id bigint,
        max_runtime double precision,
        stall_timeout double precision,
        pool text
    ) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
            autovacuum_vacuum_cost_delay = 0)
"""


def upgrade() -> None:
    op.execute(CREATE_STAGING)
    op.execute("CREATE INDEX spider_job_staging_batch_idx ON spider_job_staging (batch, n)")


def downgrade() -> None:
    op.execute("DROP TABLE spider_job_staging")
