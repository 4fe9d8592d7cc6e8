"""Listen slots: the few nodes that LISTEN, so that a NOTIFY signals a handful of sessions, not every node's.

Before Postgres 19 a NOTIFY signals every session listening in the database, whatever its channel: with a thousand
idle nodes listening, each schedule that wakes a node interrupts a thousand backends, and ``schedule.json`` fell to
a tenth of its rate. So at most ``listen_slots`` nodes LISTEN at any time. A node that wants work takes a free slot,
a session-level advisory lock on its listener's own session, and gives it up when it becomes busy; the server
frees it when the session ends (a node killed, a cut path), and a node that wants work takes it at its next poll.
Every other node polls. The lock only ever lives on a direct session (``node/notifications.py`` proves that it
hears itself first): through a transaction pooler it would stay on whichever server connection served it.

``pg_locks`` shows the holders: ``status`` and ``/metrics`` read them there, with each holder's node from its
session's ``application_name``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scrapyd_pgqueue.database.connection_pool import Connection
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import StorePerEngine, database_errors

# The first key of the slots' advisory locks (the two-integer form, the slot the second): the queue's other
# advisory locks take one bigint key (migrations, a crawl's leases), which never meets a two-integer one.
LISTEN_SLOT_LOCKS = 1_936_484_716


@dataclass(frozen=True)
class ListenSlot:
    slot: int
    node: str  # the holder's node name, from its listener's application_name ('' when not visible)


# Take the first free slot of 0 .. :slots - 1, if any. The Limit stops the scan at the first lock taken: the filter
# runs row by row in generate_series' order (no sort, no join), so a call takes one slot at most.
TAKE_LISTEN_SLOT = text("""
    SELECT slot FROM generate_series(0, :slots - 1) AS slot
    WHERE pg_try_advisory_lock(:locks, slot)
    LIMIT 1
""")

# Give the slot back (the caller stops listening first).
GIVE_UP_LISTEN_SLOT = text("SELECT pg_advisory_unlock(:locks, :slot) AS given_up")

# The slots held now and by whom: granted advisory locks of the slots' key in this database. A listener's
# application_name is 'scrapyd-pgqueue-listener <node>' (db.application_name): the node is the rest.
LISTEN_SLOT_HOLDERS = text("""
    SELECT l.objid::integer AS slot,
           coalesce(substr(a.application_name, length('scrapyd-pgqueue-listener ') + 1), '') AS node
    FROM pg_locks AS l
    LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = :locks
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ORDER BY l.objid
""")


def take_listen_slot(connection: Connection, slots: int) -> int | None:
    """On the listener's own session: a free slot, now held by it, or None when all ``slots`` are taken."""
    if slots < 1:
        return None
    return connection.execute(TAKE_LISTEN_SLOT, {"slots": slots, "locks": LISTEN_SLOT_LOCKS}).scalar()


def give_up_listen_slot(connection: Connection, slot: int) -> None:
    connection.execute(GIVE_UP_LISTEN_SLOT, {"locks": LISTEN_SLOT_LOCKS, "slot": slot})


class ListenSlotHolders(StorePerEngine):
    """Who holds the slots, for ``status`` and ``/metrics`` (any role may read pg_locks)."""

    @database_errors
    def holders(self) -> list[ListenSlot]:
        with self.engine.connect() as connection:
            rows = connection.execute(LISTEN_SLOT_HOLDERS, {"locks": LISTEN_SLOT_LOCKS}).all()
        return [ListenSlot(row.slot, row.node) for row in rows]
