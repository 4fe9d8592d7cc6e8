"""Alembic environment: migrations run on the connection that ``db.migrate`` passes in, under its lock."""

from alembic import context

from scrapyd_pgqueue.database.db import VERSION_TABLE

connection = context.config.attributes["connection"]
# No metadata to autogenerate from: the schema is store/schema.sql, and each migration is written by hand.
context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
