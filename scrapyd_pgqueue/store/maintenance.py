"""Keeping the queue's tables small: a VACUUM of ``spider_job`` and the other tables the nodes churn
(``CHURNED_TABLES``) by whichever node is finishing crawls when one is due, and a rebuild of the indexes of
``spider_job`` that VACUUM cannot shrink (``QueueMaintenance``).

Every job is inserted, updated twice and deleted, so the table's space is only reused once VACUUM has run. Autovacuum
looks at the table once per ``autovacuum_naptime`` (a server setting, one minute by default): a busy cluster churns
tens of thousands of jobs between two passes, and the table and its indexes grow to hold them (measured: 11.8x the
fresh size after a million jobs). The nodes that finish crawls make the dead rows, so they vacuum: at most once per
``vacuum_interval`` seconds in the cluster (one node's turn at a time: ``spider_job_maintenance``), when the dead
rows are a tenth of the live ones (a vacuum reads the whole table and every index: a big backlog is vacuumed less
often) and at least ``MIN_DEAD_ROWS``, or fewer that take ``MIN_DEAD_BYTES`` (a job's stored log may take a
megabyte: a thousand of them would be a gigabyte). The other tables the nodes rewrite a row of per tick or per job (the nodes'
heartbeats, stored logs, trees, the webhooks' outbox, the frontier's requests) are vacuumed in the same turn, each
when it is due by the same measure: a server with autovacuum off keeps them in bounds too. A node vacuums only the
tables its role owns; a least-privilege node leaves them all to autovacuum (``scrapyd-pgqueue status`` warns when
it is off).

VACUUM makes room in an index's pages but never merges them: a page is given back only once every entry on it is
gone, and jobs leave the queue in priority order, not in the order of their ids and job ids, so the indexes on those
thin out and grow (measured: the live job key at 15x its fresh size after 200,000 jobs, vacuumed every few
seconds). After its vacuum, the node rebuilds (REINDEX CONCURRENTLY: reads and writes go on) each index that takes
more than REBUILD_ABOVE times the room of its entries packed. River's reindexer rebuilds its job table's indexes the
same way, on a schedule.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.database.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

MIN_DEAD_ROWS = 1000
MIN_DEAD_BYTES = 1024 * 1024  # by the table's average row (heap, indexes and TOAST)
MIN_INDEX_BYTES = 256 * 1024  # smaller indexes are not worth a rebuild
REBUILD_ABOVE = 2.5  # times its entries packed (an estimate: a fresh table's indexes measure 1.1-1.8x of it)

# --- queries ---------------------------------------------------------------------------------------------------

# The tables the nodes churn: a row inserted and deleted, or rewritten, per job, per tick or per request.
CHURNED_TABLES = ("spider_job", "job_log", "scrapyd_node", "spider_tree", "webhook_event", "crawl_request",
                  "crawl_slot")

# Take the cluster's maintenance turn if one of :tables is due a vacuum, and name those that are: enough dead rows, or
# of their bytes by the table's average row (the statistics' counts, a few seconds behind), no turn ended and no
# autovacuum of it within :interval seconds, and a role that may vacuum it (the owner's; VACUUM would only warn); no
# turn running (one started an hour ago without ending died with its node). The row lock makes it one node's turn:
# another node's UPDATE waits, then finds the row changed and takes nothing.
TAKE_TURN = text("""
    WITH due AS (
        SELECT s.relname FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
        WHERE s.schemaname = current_schema() AND s.relname = ANY(CAST(:tables AS text[]))
          AND s.n_dead_tup >= s.n_live_tup / 10
          AND (s.n_dead_tup >= :min_dead
               OR CAST(s.n_dead_tup AS numeric) * pg_total_relation_size(s.relid)
                  / nullif(s.n_live_tup + s.n_dead_tup, 0) >= :min_dead_bytes)
          AND coalesce(s.last_autovacuum < now() - make_interval(secs => :interval), true)
          AND pg_has_role(c.relowner, 'USAGE')
    )
    UPDATE spider_job_maintenance AS m SET started = now()
    WHERE m.ended < now() - make_interval(secs => :interval)
      AND (m.ended >= m.started OR m.started < now() - interval '1 hour')
      AND EXISTS (SELECT 1 FROM due)
    RETURNING (SELECT array_agg(relname ORDER BY relname) FROM due) AS tables
""")

# The churned tables autovacuum leaves alone: every one when the server's autovacuum is off, else those whose storage
# parameters turn it off.
TABLES_WITHOUT_AUTOVACUUM = text("""
    SELECT c.relname FROM pg_class AS c
    WHERE c.relnamespace = CAST(current_schema() AS regnamespace) AND c.relname = ANY(CAST(:tables AS text[]))
      AND (current_setting('autovacuum') = 'off' OR 'autovacuum_enabled=false' = ANY(coalesce(c.reloptions, '{}')))
    ORDER BY c.relname
""")

# The turn is over.
END_TURN = text("UPDATE spider_job_maintenance SET ended = clock_timestamp()")

# SKIP_LOCKED: an autovacuum or a manual VACUUM running already is not waited for. INDEX_CLEANUP ON: the indexes
# are what grows (a small number of dead rows would otherwise let VACUUM leave them alone).
VACUUMS = {
    "spider_job": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) spider_job",
    "job_log": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) job_log",
    "scrapyd_node": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) scrapyd_node",
    "spider_tree": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) spider_tree",
    "webhook_event": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) webhook_event",
    "crawl_request": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) crawl_request",
    "crawl_slot": "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) crawl_slot",
}


# The indexes of spider_job to rebuild, as REINDEX statements (names from the catalog, quoted by regclass): the valid
# ones more than :above times the size of their entries packed (entries as of the last vacuum, pg_class.reltuples;
# each the width of its key columns by the statistics, pg_stats.avg_width, plus its header, aligned, and its line
# pointer; leaf pages 90% full; a meta page and a root), and at least :min_bytes. An index whose size cannot be
# estimated (no statistics yet) is left alone. An invalid index left by an interrupted rebuild (its name ends in
# _ccnew or _ccold) is dropped first: it costs every write and is never used.
INDEXES_TO_REBUILD = text("""
    WITH indexes AS (
        SELECT i.indexrelid, i.indisvalid, pg_relation_size(i.indexrelid) AS bytes,
               nullif(greatest(ic.reltuples, -1), -1) AS entries,
               (SELECT sum(s.avg_width) FROM pg_attribute AS a
                JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = t.relname AND s.attname = a.attname
                WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)) AS key_width
        FROM pg_index AS i
        JOIN pg_class AS ic ON ic.oid = i.indexrelid
        JOIN pg_class AS t ON t.oid = i.indrelid
        JOIN pg_namespace AS n ON n.oid = t.relnamespace
        WHERE i.indrelid = 'spider_job'::regclass
    )
    SELECT CASE WHEN indisvalid THEN format('REINDEX INDEX CONCURRENTLY %s', indexrelid::regclass)
                ELSE format('DROP INDEX CONCURRENTLY IF EXISTS %s', indexrelid::regclass) END
    FROM indexes
    WHERE NOT indisvalid AND indexrelid::regclass::text ~ '_cc(new|old)[0-9]*$'
       OR indisvalid
          AND bytes > greatest(:min_bytes, :above * (16384 + entries * (ceil((8 + key_width) / 8.0) * 8 + 4) / 0.9))
    ORDER BY indisvalid, bytes DESC
""")

# --- operations ------------------------------------------------------------------------------------------------


class QueueMaintenance:
    """``vacuum_when_due()`` after each finish: one statement at most once per interval in this process, a VACUUM of
    each churned table due one (and index rebuilds of spider_job) when this node took the cluster's turn."""

    def __init__(self, engine: Engine, interval: float, rebuild_above: float = REBUILD_ABOVE,
                 min_index_bytes: int = MIN_INDEX_BYTES):
        self.engine = engine
        self.interval = interval
        self.rebuild_above, self.min_index_bytes = rebuild_above, min_index_bytes
        self.next_check = 0.0  # monotonic
        self.lock = threading.Lock()  # one check at a time in this process
        self.failures = ThrottledLog(log.warning)

    @classmethod
    def for_settings(cls, settings) -> QueueMaintenance:
        """The node's maintenance (one per process and database: the interval is counted per process)."""
        return _maintenance(db.engine_for_settings(settings), settings.vacuum_interval)

    def vacuum_when_due(self) -> bool:
        """VACUUM each churned table that is due, then rebuild spider_job's thinned indexes; say whether this call
        vacuumed. Never raises: the finish it follows is recorded already, and autovacuum remains. Each statement has
        the node's database_timeout; one abandoned there runs on in the server (an interrupted rebuild is cleaned up
        later)."""
        if self.interval <= 0 or time.monotonic() < self.next_check or not self.lock.acquire(blocking=False):
            return False
        try:
            self.next_check = time.monotonic() + self.interval
            params = {"min_dead": MIN_DEAD_ROWS, "min_dead_bytes": MIN_DEAD_BYTES, "interval": self.interval,
                      "tables": list(CHURNED_TABLES)}
            with db.operation(self.engine), db.autocommit(self.engine) as connection:
                due = connection.execute(TAKE_TURN, params).scalar()
            if due is None:
                return False
            try:
                for table in due:
                    with db.operation(self.engine):
                        db.run_outside_transaction(self.engine, VACUUMS[table])
                if "spider_job" in due:
                    self.rebuild_thinned_indexes()
            finally:
                with db.operation(self.engine), db.autocommit(self.engine) as connection:
                    connection.execute(END_TURN)
            return True
        except db.DatabaseError as e:
            self.failures.report(f"maintenance of the queue's tables failed (autovacuum remains): {e}",
                                 key="maintenance")
            return False
        finally:
            self.lock.release()

    def rebuild_thinned_indexes(self) -> int:
        """Rebuild the indexes of spider_job that grew past ``rebuild_above`` of its size (and drop what an
        interrupted rebuild left); return how many statements ran."""
        params = {"min_bytes": self.min_index_bytes, "above": self.rebuild_above}
        with db.operation(self.engine), db.autocommit(self.engine) as connection:
            statements = connection.execute(INDEXES_TO_REBUILD, params).scalars().all()
        for statement in statements:
            with db.operation(self.engine):
                db.run_outside_transaction(self.engine, statement)
            log.info("spider_job maintenance: %s", statement)
        return len(statements)


def tables_without_autovacuum(engine: Engine) -> list[str]:
    """The churned tables that autovacuum leaves alone (``scrapyd-pgqueue status`` warns of them)."""
    with db.autocommit(engine) as connection:
        return connection.execute(TABLES_WITHOUT_AUTOVACUUM, {"tables": list(CHURNED_TABLES)}).scalars().all()


@functools.cache
def _maintenance(engine: Engine, interval: float) -> QueueMaintenance:
    return QueueMaintenance(engine, interval)
