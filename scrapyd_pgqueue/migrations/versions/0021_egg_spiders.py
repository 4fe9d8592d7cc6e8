"""The spiders of each deployed egg, as `scrapy list` answered once on one node: every node checks a schedule against
them without running `scrapy list` itself (a node that just started answers at once).

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

SPIDERS_TABLE = """
    CREATE TABLE project_egg_spiders (
        egg_id bigint PRIMARY KEY REFERENCES project_egg (id) ON DELETE CASCADE,
        spiders text[] NOT NULL,
        listed_time timestamptz NOT NULL DEFAULT now()
    )
"""


def upgrade() -> None:
    op.execute(SPIDERS_TABLE)


def downgrade() -> None:
    op.execute("DROP TABLE project_egg_spiders")
