"""Keeping the queue table small: a VACUUM of ``spider_job`` by whichever node is finishing crawls when it is due
(``QueueMaintenance``).

Every job is inserted, updated twice and deleted, so the table's space is only reused once VACUUM has run. Autovacuum
looks at the table once per ``autovacuum_naptime`` (a server setting, one minute by default): a busy cluster churns
tens of thousands of jobs between two passes, and the table and its indexes grow to hold them (measured: 11.8x the
fresh size after a million jobs). The nodes that finish crawls make the dead rows, so they vacuum: at most once per
``vacuum_interval`` seconds in the cluster, when the dead rows are at least ``MIN_DEAD_ROWS`` and a tenth of the
live ones (a vacuum reads the whole table and every index: a big backlog is vacuumed less often).
"""

from __future__ import annotations

import functools
import logging
import threading
import time

from sqlalchemy import Engine, text

from scrapyd_pgqueue import db

log = logging.getLogger(__name__)

MIN_DEAD_ROWS = 1000

# --- queries ---------------------------------------------------------------------------------------------------

# Whether spider_job is due a vacuum: enough dead rows (the statistics' count, a few seconds behind), none of ours
# or autovacuum's within :interval seconds, and a role that may vacuum it (the owner's; VACUUM would only warn).
VACUUM_DUE = text("""
    SELECT s.n_dead_tup >= greatest(:min_dead, s.n_live_tup / 10)
           AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity') < now() - make_interval(secs => :interval)
           AND pg_has_role(c.relowner, 'USAGE')
    FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
    WHERE s.relid = 'spider_job'::regclass
""")

# SKIP_LOCKED: a node that finds another's vacuum running goes on instead of waiting for it. INDEX_CLEANUP ON: the
# indexes are what grows (a small number of dead rows would otherwise let VACUUM leave them alone).
VACUUM_QUEUE = "VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) spider_job"


# --- operations ------------------------------------------------------------------------------------------------


class QueueMaintenance:
    """``vacuum_when_due()`` after each finish: a stats query at most once per interval in this process, a VACUUM
    when the cluster's table is due one."""

    def __init__(self, engine: Engine, interval: float):
        self.engine = engine
        self.interval = interval
        self.next_check = 0.0  # monotonic
        self.lock = threading.Lock()  # one check at a time in this process
        self.failures = db.ThrottledLog(log.warning)

    @classmethod
    def for_settings(cls, settings) -> QueueMaintenance:
        """The node's maintenance (one per process and database: the interval is counted per process)."""
        return _maintenance(db.engine_for_settings(settings), settings.vacuum_interval)

    def vacuum_when_due(self) -> bool:
        """VACUUM spider_job if it is due; say whether this call did. Never raises: the finish it follows is
        recorded already, and autovacuum remains."""
        if self.interval <= 0 or time.monotonic() < self.next_check or not self.lock.acquire(blocking=False):
            return False
        try:
            self.next_check = time.monotonic() + self.interval
            with db.operation(self.engine):
                with db.autocommit(self.engine) as connection:
                    due = connection.execute(VACUUM_DUE, {"min_dead": MIN_DEAD_ROWS, "interval": self.interval})
                    if not due.scalar():
                        return False
                db.run_outside_transaction(self.engine, VACUUM_QUEUE)
            return True
        except db.DatabaseError as e:
            self.failures.report(f"vacuum of spider_job failed (autovacuum remains): {e}", key="vacuum")
            return False
        finally:
            self.lock.release()


@functools.cache
def _maintenance(engine: Engine, interval: float) -> QueueMaintenance:
    return QueueMaintenance(engine, interval)
