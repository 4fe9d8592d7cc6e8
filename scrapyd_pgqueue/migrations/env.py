"""Alembic environment: migrations run on the connection that ``db.migrate`` passes in, under its lock."""

from alembic import context

from scrapyd_pgqueue.store.db import VERSION_TABLE
from scrapyd_pgqueue.migrations.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
