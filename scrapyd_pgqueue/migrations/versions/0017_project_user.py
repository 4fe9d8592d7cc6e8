"""Each project's own uid for its crawls (``crawl_users = on``): the same on every node, and no two projects share one.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


# A row is written by the first node that starts a crawl of the project and never changes: the uid owns the project's
# files on every node's disks. Unique, so two nodes assigning at once cannot give two projects one user.
def upgrade() -> None:
    op.execute("""
        CREATE TABLE project_user (
            project text PRIMARY KEY,
            uid integer NOT NULL UNIQUE CHECK (uid > 0),
            created_time timestamptz NOT NULL DEFAULT now()
        )
    """)


def downgrade() -> None:
    op.execute("DROP TABLE project_user")
