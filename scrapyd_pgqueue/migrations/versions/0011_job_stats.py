"""Each job's Scrapy stats, reported by its crawl to its node: ``spider_job.stats``.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


# Not indexed: the node's tick rewrites it on running rows every stats_interval, and an update that changes no
# indexed column is HOT (no index entry written). Adding a nullable column without a default rewrites no row.
def upgrade() -> None:
    op.execute("ALTER TABLE spider_job ADD COLUMN stats jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE spider_job DROP COLUMN stats")
