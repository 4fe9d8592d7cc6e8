"""One LISTEN connection per node, for every channel: new jobs, cancel requests, deployed eggs.

A thread with a blocking ``select`` rather than a socket watched by Twisted's reactor: libpq closes the socket
itself when the server goes away, and an epoll reactor then keeps a stale descriptor registered (and may watch a
reused one).
It reconnects for ever with a capped backoff and tells subscribers after each reconnect, since notifications
sent while it was away are lost (NOTIFY is a hint; polling and heartbeats are the floor).

LISTEN needs a session of its own on the server, which a transaction pooler (PgBouncer's ``pool_mode =
transaction``) cannot give: the LISTEN lands on whichever server connection served that transaction. So after
connecting the listener proves that it hears a NOTIFY sent through the node's pool; if it does not, the node runs
poll-only (said once) and listens no more; its connection still carries the lease's statements. ``listen_url``
points the listener (and so the lease) straight at Postgres.

Only a node that holds a listen slot LISTENs (``store/listen_slots.py``): the poller asks for one while the node
wants work (``want_slot``), and this thread takes a free one on its session (trying again every ``slot_retry``
seconds while none is free), LISTENs on every channel, and gives it up, UNLISTEN first, when the node no longer
wants work. A node without a slot hears nothing: its polls and its tick are its floor, as for a poll-only node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
import uuid

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import listen_statement
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.store.listen_slots import give_up_listen_slot, take_listen_slot
from scrapyd_pgqueue.web import metrics

log = logging.getLogger(__name__)

# Stop listening on every channel: at its commit the session leaves Postgres's list of listeners.
UNLISTEN_ALL = "UNLISTEN *"
# Seconds to hear our own NOTIFY before concluding LISTEN does not work through this URL: for good, so long enough
# for a busy machine (a direct session hears it in milliseconds; the node polls meanwhile).
PROBE_WAIT = 8.0
MAX_BACKOFF = 5.0


class Listener(threading.Thread):
    """LISTEN on ``url`` and hand each notification to the callbacks subscribed to its channel (on this thread).

    The connection is the node's session engine's (``db.session_engine``), which the lease thread borrows for its
    statements between notifications: this thread holds it only to LISTEN and to read what arrived, never while it
    waits. Notifications that arrive during a borrowed statement are read by it; its return wakes this thread.
    """

    def __init__(self, url: str, send_notify, node_name: str = "", timeout: float = db.DEFAULT_TIMEOUT, *,
                 slots: int = 8, slot_retry: float = 5.0):
        super().__init__(name="pgqueue-listener", daemon=True)
        self.url = url
        self.slots, self.slot_retry = slots, slot_retry  # listen_slots; seconds between two tries while none is free
        self.slot: int | None = None  # the listen slot this session holds: it LISTENs only then
        self.slot_wanted = False
        self.next_slot_try = 0.0  # time.monotonic()
        self.probing = False
        self.engine = db.session_engine(url, node_name, timeout)
        self.send_notify = send_notify  # send_notify(channel, payload) through the node's pool: the probe
        self.lock = threading.Lock()
        self.callbacks: dict[str, list] = {}
        self.reconnect_callbacks: list = []
        self.session = None  # the driver connection the channels below are LISTENed on
        self.listening: set[str] = set()
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.poll_only = threading.Event()  # LISTEN does not work through this URL: subscribers must poll
        self.probe_channel = f"scrapyd_pgqueue_probe_{uuid.uuid4().hex[:16]}"
        self.trouble = ThrottledLog(log.warning)
        self.wake_reader, self.wake_writer = os.pipe()
        os.set_blocking(self.wake_writer, False)
        self.engine.checkin_listeners.append(self._wake_if_heard)

    def subscribe(self, channel: str, callback, on_reconnect=None) -> None:
        """Call ``callback(payload)`` for each NOTIFY on ``channel``; ``on_reconnect()`` after each reconnect."""
        with self.lock:
            self.callbacks.setdefault(channel, []).append(callback)
            if on_reconnect is not None:
                self.reconnect_callbacks.append(on_reconnect)

    def want_slot(self, wanted: bool) -> None:
        """Any thread: whether the node wants work, and so a listen slot (taken or given up on this thread)."""
        if wanted == self.slot_wanted:
            return
        self.slot_wanted = wanted
        if wanted:
            self.next_slot_try = 0.0
        self._wake()

    def stop(self) -> None:
        self.stopping.set()
        self._wake()

    def run(self) -> None:
        backoff = 0.2
        try:
            while not self.stopping.is_set():
                try:
                    if self.session is None and not self._probe():
                        return
                    self._wait_and_dispatch()
                    backoff = 0.2
                except db.PoolTimeout:  # the lease's statement holds the session (a stalled database): wait on
                    continue
                except Exception as e:  # noqa: BLE001 - any failure: the next checkout reconnects
                    self.connected.clear()
                    self._lost_slot()  # the server frees a lost session's lock
                    self.trouble.report(
                        f"notification listener on {db.describe(self.url)} lost its connection ({db.first_line(e)}); "
                        "reconnecting", key="lost",
                    )
                    self.stopping.wait(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF)
        finally:
            self.engine.checkin_listeners.remove(self._wake_if_heard)
            self._hand_slot_on()

    def _hand_slot_on(self) -> None:
        """Stopping: give the slot up now, for a node that wants work (the session, which the lease may still use,
        stays open). If the database cannot be reached, the session's end frees it."""
        self.slot_wanted = False
        if self.slot is None:
            return
        with contextlib.suppress(Exception), db.deadline(1.0), self.engine.connect() as connection:
            if connection.driver_connection is self.session:
                self._settle_slot(connection)

    def _probe(self) -> bool:
        """On the first connection: does LISTEN work through this URL? If not, say so once and listen no more."""
        if self._hears_itself():
            return True
        self.poll_only.set()
        log.warning(
            "LISTEN does not work through %s (a transaction pooler such as PgBouncer?): this node runs "
            "poll-only, claiming every poll_interval; set listen_url (SCRAPYD_LISTEN_URL) to a direct "
            "connection to Postgres for instant wake-up", db.describe(self.url),
        )
        return False

    def _wait_and_dispatch(self) -> None:
        """Take or give up the listen slot, LISTEN (and tell subscribers of a reconnect or a slot taken: they missed
        what was sent meanwhile), hand out what arrived, then wait (the connection free for the lease) until
        something is readable or a borrowed statement read a notification."""
        payloads, reconnected, taken = self._read()
        self._hand_out(payloads)
        if reconnected:
            self.trouble.clear("lost")
        if reconnected or taken:
            for callback in list(self.reconnect_callbacks):
                callback()
        self.connected.set()
        if self.session.closed:  # a statement of the lease's broke it: the next checkout opens another
            return
        readable = select.select([self.session, self.wake_reader], [], [], 1.0)[0]
        if self.wake_reader in readable:
            os.read(self.wake_reader, 4096)

    def _read(self) -> tuple[list, bool, bool]:
        """On the session connection, held briefly: take or give up the listen slot, LISTEN on channels not yet
        listened on there while it holds one, and take the notifications that arrived. ``reconnected``: the
        connection is not the one of before; ``taken``: a slot was taken now."""
        with db.deadline(db.CONNECT_TIMEOUT), self.engine.connect() as connection:
            session = connection.driver_connection
            reconnected = self.session is not None and session is not self.session
            if session is not self.session:
                self.session, self.listening = session, set()
                self._lost_slot()
                self.next_slot_try = 0.0
            taken = self._settle_slot(connection)
            if self.probing and self.probe_channel not in self.listening:
                self._listen(session, self.probe_channel)
            if self.slot is not None:
                with self.lock:
                    new = [channel for channel in self.callbacks if channel not in self.listening]
                for channel in new:
                    self._listen(session, channel)
            session.poll()
            payloads = []
            while session.notifies:
                payloads.append(session.notifies.pop(0))
            return payloads, reconnected, taken

    def _settle_slot(self, connection) -> bool:
        """Take a free slot while the node wants work (one try per ``slot_retry`` seconds), give it up (and stop
        listening) once it does not. Whether one was taken now."""
        if self.slot is None and self.slot_wanted and not self.probing and time.monotonic() >= self.next_slot_try:
            self.next_slot_try = time.monotonic() + self.slot_retry
            self.slot = take_listen_slot(connection, self.slots)
            if self.slot is None:
                return False
            metrics.listening = 1
            return True
        if self.slot is not None and not self.slot_wanted:
            connection.execute(UNLISTEN_ALL)  # first: a session that listens on nothing is no longer signalled
            self.listening = set()
            give_up_listen_slot(connection, self.slot)
            self._lost_slot()
        return False

    def _lost_slot(self) -> None:
        if self.slot is not None:
            self.slot = None
            metrics.listening = 0

    def _listen(self, connection, channel: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(listen_statement(channel))
        self.listening.add(channel)

    def _hears_itself(self) -> bool:
        """Send a NOTIFY through the node's pool and wait for it here: a direct session hears it at once. The
        probe's channel is UNLISTENed after: a session that listens on nothing is not signalled by NOTIFYs."""
        self.probing = True
        try:
            self._read()
            token = uuid.uuid4().hex
            self.send_notify(self.probe_channel, token)
            deadline = time.monotonic() + PROBE_WAIT  # by the clock: a wake (want_slot) ends a select early
            while time.monotonic() < deadline:
                readable = select.select([self.session, self.wake_reader], [], [], 0.25)[0]
                if self.wake_reader in readable:
                    os.read(self.wake_reader, 4096)
                payloads, _, _ = self._read()
                if token in self._hand_out(payloads):
                    return True
            return False
        finally:
            self.probing = False
            with db.deadline(db.CONNECT_TIMEOUT), self.engine.connect() as connection:
                if connection.driver_connection is self.session:
                    connection.execute(UNLISTEN_ALL)
                    self.listening = set()

    def _hand_out(self, notifies) -> list[str]:
        """Give each notification to its channel's callbacks; return the payloads of probes."""
        probes = []
        for notify in notifies:
            if notify.channel == self.probe_channel:
                probes.append(notify.payload)
                continue
            metrics.notifications_heard[notify.channel] = metrics.notifications_heard.get(notify.channel, 0) + 1
            with self.lock:
                callbacks = list(self.callbacks.get(notify.channel, ()))
            for callback in callbacks:
                try:
                    callback(notify.payload)
                except Exception:  # noqa: BLE001 - one subscriber's bug must not cost the others their events
                    log.exception("handling a notification on %s failed", notify.channel)
        return probes

    def _wake_if_heard(self, connection) -> None:
        """A connection given back (the lease's statement) read notifications: hand them out now, not in a second."""
        if connection.notifies:
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_writer, b"\0")


_listeners: dict[str, Listener] = {}
_listeners_lock = threading.Lock()


def listener_for(settings) -> Listener:
    """The node's one listener (started on first use): on ``listen_url`` if set, else on ``database_url``."""
    from scrapyd_pgqueue.store import notify_through_pool

    url = settings.listen_url or settings.database_url
    with _listeners_lock:
        listener = _listeners.get(url)
        if listener is None:
            listener = _listeners[url] = Listener(url, notify_through_pool(settings), settings.node_name,
                                                  settings.database_timeout, slots=settings.listen_slots,
                                                  slot_retry=settings.poll_interval)
            listener.start()
        return listener
