"""Churn: autovacuum of spider_job sized for a queue table (every row inserted, updated twice, then deleted).

Revision ID: 0003
Revises: 0002

Measured with ``python -m bench --suites churn`` (bench/README.md, churn), and kept as they were:

- fillfactor stays 100. The claim and the finish change ``status``, which the partial indexes' predicates
  read, so they are never HOT whatever room a page has; what fills the heap between two autovacuum passes is
  the inserts (new jobs), which can only reuse space that VACUUM has put in the free space map. Each new job
  then takes 1/fillfactor of its size: at 70, 500 bytes of heap per job between passes against 310 at 100.
  A full page is pruned when it is next read, so the claim's and the finish's new versions, and the HOT
  updates (mark_started, cancel requests), still find room on their page.
- ``spider_job_job_idx`` stays a btree on ``job``: job_status, the projects of a job id, logs and requeue look
  terminated rows up by job id alone, which the live key (project first, live rows only) cannot serve. As a
  hash index it grew to 7.9 MB against 4.6 MB: no deduplication of a job's versions, and no bottom-up deletion
  of the finished job's older versions when the finish adds its entry.
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Storage parameters of spider_job (constants of this file: DDL takes no bind parameters).
STORAGE = {
    "fillfactor": "100",  # see above: explicit, so that the choice is visible in \d+ spider_job
    # Dead rows of a queue count in absolute numbers, three per job: the default 20% of the table is reached at
    # every autovacuum round on a small queue, and only after 200,000 dead rows on a million-job backlog, whose
    # pending index's head the claims then read through. 1% + 1,000 vacuums it at every round of either.
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    # A bulk enqueue (schedule_batch.json, enqueue) is inserts only: vacuumed soon, its pages are all-visible.
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    # The planner's row estimates by status (which partial index, which join order) follow the queue's swings.
    "autovacuum_analyze_scale_factor": "0.02",
    # One pass must end well within autovacuum_naptime: space is reused only once it has run. Unthrottled, a
    # pass over this small, hot table takes a fraction of a second, not tens of seconds of cost-based sleeps.
    "autovacuum_vacuum_cost_delay": "0",
}


def upgrade() -> None:
    # Reloptions only: no rewrite, no index build, so this is quick on a populated table (new pages follow them).
    settings = ", ".join(f"{name} = {value}" for name, value in STORAGE.items())
    op.execute(f"ALTER TABLE spider_job SET ({settings})")


def downgrade() -> None:
    op.execute(f"ALTER TABLE spider_job RESET ({', '.join(STORAGE)})")
