"""One LISTEN connection per node, for every channel: new jobs, cancel requests, deployed eggs.

A thread with a blocking ``select`` rather than a socket watched by Twisted's reactor: libpq closes the socket
itself when the server goes away, and an epoll reactor then keeps a stale descriptor registered (and may watch a
reused one).
It reconnects for ever with a capped backoff and tells subscribers after each reconnect, since notifications
sent while it was away are lost (NOTIFY is a hint; polling and heartbeats are the floor).

LISTEN needs a session of its own on the server, which a transaction pooler (PgBouncer's ``pool_mode =
transaction``) cannot give: the LISTEN lands on whichever server connection served that transaction. So after
connecting the listener proves that it hears a NOTIFY sent through the node's pool; if it does not, the node runs
poll-only (said once) and holds no listening connection. ``listen_url`` points the listener straight at Postgres.
"""

from __future__ import annotations

import logging
import select
import threading
import uuid

import psycopg2
from psycopg2 import sql

from scrapyd_pgqueue.store import db
from scrapyd_pgqueue.store.throttled_log import ThrottledLog

log = logging.getLogger(__name__)

PROBE_WAIT = 3.0  # seconds to hear our own NOTIFY before concluding LISTEN does not work through this URL
MAX_BACKOFF = 5.0


class Listener(threading.Thread):
    """LISTEN on ``url`` and hand each notification to the callbacks subscribed to its channel (on this thread)."""

    def __init__(self, url: str, send_notify, node_name: str = ""):
        super().__init__(name="pgqueue-listener", daemon=True)
        self.url = url
        self.application_name = db.application_name(node_name, "-listener")
        self.send_notify = send_notify  # send_notify(channel, payload) through the node's pool: the probe
        self.lock = threading.Lock()
        self.callbacks: dict[str, list] = {}
        self.reconnect_callbacks: list = []
        self.listening: set[str] = set()  # channels LISTENed on the current connection
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.poll_only = threading.Event()  # LISTEN does not work through this URL: subscribers must poll
        self.probe_channel = f"scrapyd_pgqueue_probe_{uuid.uuid4().hex[:16]}"
        self.trouble = ThrottledLog(log.warning)

    def subscribe(self, channel: str, callback, on_reconnect=None) -> None:
        """Call ``callback(payload)`` for each NOTIFY on ``channel``; ``on_reconnect()`` after each reconnect."""
        with self.lock:
            self.callbacks.setdefault(channel, []).append(callback)
            if on_reconnect is not None:
                self.reconnect_callbacks.append(on_reconnect)

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        backoff = 0.2
        first = True
        while not self.stopping.is_set():
            connection = None
            try:
                connection = self._connect()
                if not self._hears_itself(connection):
                    self.poll_only.set()
                    log.warning(
                        "LISTEN does not work through %s (a transaction pooler such as PgBouncer?): this node runs "
                        "poll-only, claiming every poll_interval; set listen_url (SCRAPYD_LISTEN_URL) to a direct "
                        "connection to Postgres for instant wake-up", db.describe(self.url),
                    )
                    return
                self.connected.set()
                self.trouble.clear("lost")
                backoff = 0.2
                if not first:
                    for callback in list(self.reconnect_callbacks):
                        callback()
                first = False
                while not self.stopping.is_set():
                    self._listen_to_new_channels(connection)
                    if select.select([connection], [], [], 1.0)[0]:
                        self._dispatch(connection)
            except Exception as e:  # noqa: BLE001 - any failure: reconnect
                self.connected.clear()
                self.trouble.report(
                    f"notification listener on {db.describe(self.url)} lost its connection ({db.first_line(e)}); "
                    "reconnecting", key="lost",
                )
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
            finally:
                self.listening = set()
                if connection is not None:
                    connection.close()

    def _connect(self):
        connection = db.connect_when_served(
            lambda: psycopg2.connect(
                db.driver_dsn(self.url), application_name=self.application_name, **db.TCP_SETTINGS,
            ),
            self.url,
        )
        connection.autocommit = True
        return connection

    def _listen(self, connection, channel: str) -> None:
        with db.deadline(db.CONNECT_TIMEOUT), connection.cursor() as cursor:
            cursor.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self.listening.add(channel)

    def _listen_to_new_channels(self, connection) -> None:
        with self.lock:
            new = [channel for channel in self.callbacks if channel not in self.listening]
        for channel in new:
            self._listen(connection, channel)

    def _hears_itself(self, connection) -> bool:
        """Send a NOTIFY through the node's pool and wait for it here: a direct session hears it at once."""
        self._listen(connection, self.probe_channel)
        token = uuid.uuid4().hex
        self.send_notify(self.probe_channel, token)
        deadline = PROBE_WAIT
        while deadline > 0:
            if select.select([connection], [], [], 0.25)[0]:
                if token in self._dispatch(connection):
                    return True
            deadline -= 0.25
        return False

    def _dispatch(self, connection) -> list[str]:
        """Hand out what arrived; return the payloads of probes."""
        probes = []
        connection.poll()
        while connection.notifies:
            notify = connection.notifies.pop(0)
            if notify.channel == self.probe_channel:
                probes.append(notify.payload)
                continue
            with self.lock:
                callbacks = list(self.callbacks.get(notify.channel, ()))
            for callback in callbacks:
                try:
                    callback(notify.payload)
                except Exception:  # noqa: BLE001 - one subscriber's bug must not cost the others their events
                    log.exception("handling a notification on %s failed", notify.channel)
        return probes


_listeners: dict[str, Listener] = {}
_listeners_lock = threading.Lock()


def listener_for(settings) -> Listener:
    """The node's one listener (started on first use): on ``listen_url`` if set, else on ``database_url``."""
    from scrapyd_pgqueue.store import notify_through_pool

    url = settings.listen_url or settings.database_url
    with _listeners_lock:
        listener = _listeners.get(url)
        if listener is None:
            listener = _listeners[url] = Listener(url, notify_through_pool(settings), settings.node_name)
            listener.start()
        return listener
