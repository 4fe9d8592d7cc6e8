"""Which nodes want work: ``scrapyd_node.wants_work``, so that a new job sends a NOTIFY only while one does.

Revision ID: 0016
Revises: 0013
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


# Nullable, no default: adding it rewrites no row, and NULL (a node of an older version, which never says) counts
# as wanting work, so such a node is still woken. The partial index holds only the nodes that may want work: the
# enqueue's test is one probe, and heartbeats (which change no column of it) stay HOT updates.
def upgrade() -> None:
    op.execute("ALTER TABLE scrapyd_node ADD COLUMN wants_work boolean")
    op.execute("CREATE INDEX scrapyd_node_wanting_idx ON scrapyd_node (id) "
               "WHERE wants_work IS NOT FALSE AND stopped_time IS NULL")


def downgrade() -> None:
    op.execute("DROP INDEX scrapyd_node_wanting_idx")
    op.execute("ALTER TABLE scrapyd_node DROP COLUMN wants_work")
