"""Series simulated, listen slots: a simulated node's listener session straight to Postgres (``listen_url``).

A real node with ``listen_url`` keeps one session on Postgres itself (``node/notifications.py``; its lease goes
through PgBouncer on a connection of its own, ``db.lease_engine_for_settings``). While the node wants work (a free
slot after a claim: ``PostgresPoller.say_whether_wanting``) its listener takes a free listen slot with the product's
``take_listen_slot`` (``scrapyd_pgqueue.store.listen_slots``), trying again every ``poll_interval`` while none is
free; with one it LISTENs on its channels and wakes the poller on each NOTIFY of new jobs; once the node is busy it
UNLISTENs and gives the slot up. ``SlotSession`` does the same for a ``SimNode`` (its statements on the session are
counted and timed by the node's ``_timed``), and ``SlotReader`` reads the holders' sessions of one simulation
process, as their listener threads would. Not simulated: the listener's start-up probe (a NOTIFY through the pool,
outside the windows) and the other subscribers' reconnect callbacks when a slot is taken (rare once settled).
"""

from __future__ import annotations

import select
import threading


class SlotReader(threading.Thread):
    """The sessions of one process's slot holders: a holder that hears a NOTIFY of new jobs claims at once."""

    def __init__(self, stats):
        super().__init__(name="sim-slot-reader", daemon=True)
        self.stats = stats
        self.lock = threading.Lock()
        self.holders: dict[object, SlotSession] = {}  # driver connection -> its session
        self.stopping = threading.Event()
        self.start()

    def add(self, session: SlotSession) -> None:
        with self.lock:
            self.holders[session.connection.driver_connection] = session

    def remove(self, session: SlotSession) -> None:
        with self.lock:
            self.holders.pop(session.connection.driver_connection, None)

    def run(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                holders = dict(self.holders)
            if not holders:
                self.stopping.wait(0.1)
                continue
            try:
                readable = select.select(list(holders), [], [], 0.2)[0]
            except (OSError, ValueError):  # a session closed meanwhile (stopping)
                continue
            for connection in readable:
                holders[connection].read()

    def stop(self) -> None:
        self.stopping.set()


class SlotSession:
    """A simulated node's direct session: listen slot taken while it wants work, LISTEN while held."""

    def __init__(self, node, url: str, slots: int, retry: float, reader: SlotReader):
        from scrapyd_pgqueue.database import db

        self.node, self.slots, self.retry, self.reader = node, slots, retry, reader
        self.engine = db.get_engine(f"{url}?application_name={node.name}-listener", pool_size=1,
                                    migrate_schema=False, listening=True,
                                    application_name=db.application_name(node.name, "-listener"), purpose="session")
        self.connection = self.engine.connect()  # the node's one session, held for its life (the listener's)
        self.lock = threading.Lock()  # the session: one statement (or read) at a time
        self.state = threading.Lock()
        self.slot: int | None = None
        self.wanted = False
        self.generation = 0  # a change of ``wanted`` ends the retries of the one before

    def want(self, wanted: bool) -> None:
        """Listener.want_slot: a change takes or gives up the slot at once (on a timer thread, as on the listener's)."""
        with self.state:
            if wanted == self.wanted:
                return
            self.wanted = wanted
            self.generation += 1
            generation = self.generation
        self.node.timer.soon(lambda due: self.settle(due, generation))

    def settle(self, due: float, generation: int) -> None:
        """Listener._settle_slot: take a free slot while wanted (one try per ``retry``), give it up once not."""
        from scrapyd_pgqueue.database.sql import listen_statement
        from scrapyd_pgqueue.node.notifications import UNLISTEN_ALL
        from scrapyd_pgqueue.store.listen_slots import give_up_listen_slot, take_listen_slot

        node = self.node
        if node.stopping or generation != self.generation:
            return
        taken = False
        with self.lock:
            if self.slot is None and self.wanted:
                slot = node._timed("take_listen_slot", take_listen_slot, self.connection, self.slots)
                if slot is None:  # none free (or the try failed, counted): again in ``retry`` seconds
                    node.timer.at(node._next(due, self.retry), lambda later: self.settle(later, generation))
                    return
                self.slot, taken = slot, True
                for channel in _channels():
                    node._timed("listen", self._execute, listen_statement(channel), ok=True)
                self.reader.add(self)
            elif self.slot is not None and not self.wanted:
                self.reader.remove(self)
                node._timed("unlisten", self.connection.execute, UNLISTEN_ALL, ok=True)
                node._timed("give_up_listen_slot", give_up_listen_slot, self.connection, self.slot, ok=True)
                self.slot = None
        if taken:  # the listener's reconnect callback: the poller claims, it may have missed a NOTIFY
            node.timer.soon(lambda later: node.poll())

    def _execute(self, statement) -> None:
        with self.connection.driver_connection.cursor() as cursor:
            cursor.execute(statement)

    def read(self) -> None:
        """What arrived on a holder's session: a NOTIFY of new jobs wakes the node's poller."""
        from scrapyd_pgqueue.store import NOTIFY_CHANNEL

        with self.lock:
            connection = self.connection.driver_connection
            try:
                connection.poll()
            except Exception as e:  # noqa: BLE001 - counted; the session is gone
                self.node.stats.error("listen", e)
                self.reader.remove(self)
                return
            notifies, connection.notifies[:] = list(connection.notifies), []
        jobs = sum(1 for notify in notifies if notify.channel == NOTIFY_CHANNEL)
        with self.node.stats.lock:
            self.node.stats.heard += len(notifies)
        if jobs:
            self.node.timer.soon(lambda due: self.node.poll())

    def close(self) -> None:
        self.reader.remove(self)
        try:
            self.connection.driver_connection.close()
        except Exception:  # noqa: BLE001, S110 - stopping
            pass


def _channels() -> tuple[str, ...]:
    """The channels a node's listener LISTENs on while it holds a slot (its subscribers': poller, events, periodic)."""
    from scrapyd_pgqueue.store import NOTIFY_CHANNEL
    from scrapyd_pgqueue.store.base import CANCEL_CHANNEL, PROJECTS_CHANNEL
    from scrapyd_pgqueue.store.schedules import PERIODIC_CHANNEL

    return NOTIFY_CHANNEL, CANCEL_CHANNEL, PROJECTS_CHANNEL, PERIODIC_CHANNEL
