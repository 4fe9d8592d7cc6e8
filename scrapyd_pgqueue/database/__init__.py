"""The connection layer: the only code that knows the driver (psycopg2), and nothing of the queue.

Each module imports only its neighbours here (and ``config``), never the store or the job rules above it:

- ``db``: the connector: a process's engines, the store's operations on them (bounded, errors as ``DatabaseError``),
  and the schema's migration (SQLAlchemy and Alembic imported only then).
- ``clock``: the database's clock as this process knows it, and the deadline a write must meet on it.
- ``connection_pool``: a process's connections to one database, a fixed pool of psycopg2 connections in autocommit.
- ``sql``: statements (``text()``), their results and the driver's errors.
- ``waits``: bounded waits: every wait of a thread ends at its deadline; a server that refuses for now is waited for.
- ``roles``: the node role's rights (``scrapyd-pgqueue grant``) and the start-up check of a node's own role.
- ``throttled_log``: a recurring problem said once, then at most once a minute with a count.
"""
