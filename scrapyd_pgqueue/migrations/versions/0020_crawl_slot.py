"""The frontier's pace per download slot: DOWNLOAD_DELAY held for the whole crawl, not per worker.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# When a crawl's next request to a download slot may be leased: the last lease's time plus the crawl's DOWNLOAD_DELAY.
# A row per slot a crawl ever paced; the rows go with their crawl's first row.
SLOT_TABLE = """
    CREATE TABLE crawl_slot (
        crawl bigint NOT NULL REFERENCES spider_job (id) ON DELETE CASCADE,
        slot text NOT NULL,
        next_lease_time timestamptz NOT NULL,
        PRIMARY KEY (crawl, slot)
    )
"""


def upgrade() -> None:
    op.execute(SLOT_TABLE)


def downgrade() -> None:
    op.execute("DROP TABLE crawl_slot")
