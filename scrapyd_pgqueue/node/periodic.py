"""Every node fires the cluster's due periodic jobs: whichever is alive fires each due time, exactly once (the store's
compare-and-set decides between nodes; there is no leader to lose).

A timer on the reactor, no thread of its own: it sleeps until the earliest due time (the database's clock says in
how many seconds); a NOTIFY on ``PERIODIC_CHANNEL`` (a schedule added, changed or resumed) wakes it at once. The
node's tick (``JobStore.node_tick``, every heartbeat) reads the next due time too and hands it to ``due_in()``: that
is the floor under NOTIFY, and the firer sends nothing of its own until something is due. Without ticks (a poller
under another launcher) it sleeps at most ``MAX_SLEEP``, so that schedules added while a NOTIFY was lost are seen.
The database work runs in Twisted's thread pool, never on the reactor. No reactor import at module level: importing
it installs Twisted's default reactor, which a process that later runs Scrapy (and installs its asyncio reactor)
cannot change.
"""

from __future__ import annotations

from twisted.internet import threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.node import notifications
from scrapyd_pgqueue.store import PERIODIC_CHANNEL, Firing, ScheduleStore

log = Logger()

MAX_SLEEP = 30.0  # seconds: the floor under NOTIFY for schedules added or changed
MIN_SLEEP = 0.2  # a due job still there after a pass is being fired by another node: look again shortly
ERROR_RETRY = 5.0  # seconds before trying again after a database error


class PeriodicFirer:
    """Fires due periodic jobs from this node: ``start()`` once the reactor runs, ``stop()`` at shutdown."""

    ticked = False  # the node's tick tells it when the next job is due (due_in): no floor timer of its own

    def __init__(self, settings):
        self.settings = settings
        self.store = ScheduleStore.for_settings(settings)
        self.running = False
        self.firing = False  # a pass runs in the thread pool
        self.fire_again = False  # woken during a pass: it may have read the schedules before the change
        self.timer = None
        self.listener = None
        self.errors = ThrottledLog(lambda message: log.error("{message}", message=message))

    def start(self) -> PeriodicFirer:
        self.running = True
        if self.settings.listen_notify:
            self.listener = notifications.listener_for(self.settings)
            self.listener.subscribe(PERIODIC_CHANNEL, self.wake_from_thread, on_reconnect=self.wake_from_thread)
        self.wake()
        return self

    def stop(self) -> None:
        self.running = False
        if self.timer is not None and self.timer.active():
            self.timer.cancel()

    def wake_from_thread(self, *_) -> None:
        """A NOTIFY (or the listener's reconnect, after which missed ones are lost), on the listener's thread."""
        from twisted.internet import reactor

        reactor.callFromThread(self.wake)

    def due_in(self, seconds: float | None) -> None:
        """Reactor thread: the node's tick read when the next periodic job is due; wake then, unless a timer or a
        pass comes sooner."""
        from twisted.internet import reactor

        self.ticked = True
        if seconds is None or not self.running or self.firing:
            return
        seconds = max(seconds, 0.0)
        if self.timer is not None and self.timer.active():
            if self.timer.getTime() <= reactor.seconds() + seconds:
                return
            self.timer.cancel()
        self.timer = reactor.callLater(seconds, self.wake)

    def wake(self) -> None:
        """Fire what is due now, then sleep until the next due time."""
        if not self.running:
            return
        if self.firing:
            self.fire_again = True
            return
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.firing = True
        threads.deferToThread(self.store.fire_due).addBoth(self._fired).addErrback(
            lambda failure: log.failure("Unexpected error while firing periodic jobs", failure)
        )

    def _fired(self, result: Firing | Failure) -> None:
        from twisted.internet import reactor

        self.firing = False
        if isinstance(result, Failure):
            self.errors.report(f"Firing periodic jobs failed, trying again in {ERROR_RETRY:g}s: "
                               f"{result.getErrorMessage()}", key="fire")
            delay = ERROR_RETRY
        else:
            self.errors.clear("fire")
            self._log(result)
            delay = self.sleep_for(result.next_due_in)
        if self.fire_again:
            self.fire_again, delay = False, 0.0
        if self.running and delay is not None:
            self.timer = reactor.callLater(delay, self.wake)

    def sleep_for(self, next_due_in: float | None) -> float | None:
        """Seconds until the next pass: the next due time, within [MIN_SLEEP, the cap]; told by the node's ticks,
        no cap (None: no timer, nothing is due)."""
        if self.ticked:
            return None if next_due_in is None else max(next_due_in, MIN_SLEEP)
        cap = MAX_SLEEP
        if self.listener is None or self.listener.poll_only.is_set():
            cap = min(MAX_SLEEP, self.settings.poll_interval)  # no NOTIFY: new schedules are seen by polling only
        if next_due_in is None:
            return cap
        return min(max(next_due_in, MIN_SLEEP), cap)

    def _log(self, firing: Firing) -> None:
        for fired in firing.fired:
            log.info("Periodic job {name} due {due} fired: job {job} of {project}/{spider}", name=fired.name,
                     due=fired.due.isoformat(), job=fired.job, project=fired.project, spider=fired.spider)
        for name in firing.skipped:
            log.info("Periodic job {name} skipped a due time: its previous job still waits or runs (overlap skip)",
                     name=name)
        for name, reason in firing.broken:
            self.errors.report(f"Periodic job {name} cannot fire, trying again later: {reason}", key=f"broken {name}")
