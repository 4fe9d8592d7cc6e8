"""What a node acts on when the cluster changes elsewhere: cancel requests for its crawls, deployed or deleted eggs.

Another node's cancel.json reaches the node running the job; an egg deployed through another node becomes known
here without a restart. The node's one listener (``notifications.py``, shared with the poller) hears both;
NOTIFY is only a hint, so the launcher's heartbeat calls ``check()`` to read the same state as the floor.
Used by ``PostgresLauncher``; runs on the reactor thread except where noted.
"""

from __future__ import annotations

import json

from twisted.internet import error, reactor, threads
from twisted.logger import Logger

from scrapyd.interfaces import ISpiderScheduler
from scrapyd.webservice import spider_list
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue import notifications
from scrapyd_pgqueue.db import ThrottledLog
from scrapyd_pgqueue.store import CANCEL_CHANNEL, PROJECTS_CHANNEL, CancelRequest, ClusterStore, EggStore

log = Logger()


class ClusterEvents:
    def __init__(self, launcher):
        self.launcher = launcher
        self.settings = launcher.settings
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))
        self.eggs: dict[str, tuple[int, int]] | None = None  # the egg catalogue last seen

    def start(self):
        try:
            self.eggs = EggStore.for_settings(self.settings).egg_catalogue()
        except Exception as e:  # noqa: BLE001 - the first heartbeat that reaches the database reads it
            log.error("Could not read the egg catalogue: {error}", error=e)
        if not self.settings.listen_notify:
            return  # the heartbeat's check() alone
        listener = notifications.listener_for(self.settings)
        listener.subscribe(CANCEL_CHANNEL, self._cancel_requested, on_reconnect=lambda: reactor.callFromThread(self.check))
        listener.subscribe(PROJECTS_CHANNEL, lambda project: reactor.callFromThread(self.refresh_projects, [project]))

    def _cancel_requested(self, payload):
        """Listener thread: hand a cancel request for one of this node's crawls to the reactor."""
        request = CancelRequest(**json.loads(payload))
        if request.worker == pgconfig.WORKER_ID:
            reactor.callFromThread(self.deliver_cancels, [request])

    def check(self):
        """The floor under NOTIFY (every heartbeat, and after the listener reconnects)."""
        return (
            threads.deferToThread(self._read_state)
            .addCallback(self._apply_state)
            .addErrback(lambda failure: self.trouble.report(
                f"Reading cancel requests and eggs failed: {failure.getErrorMessage()}", key="check"))
        )

    def _read_state(self):
        cancels = ClusterStore.for_settings(self.settings).requested_cancels(pgconfig.WORKER_ID)
        return cancels, EggStore.for_settings(self.settings).egg_catalogue()

    def _apply_state(self, state):
        self.trouble.clear("check")
        cancels, eggs = state
        self.deliver_cancels(cancels)
        seen = self.eggs if self.eggs is not None else {}  # never read: whatever exists may be new here
        changed = sorted(project for project in eggs.keys() | seen.keys() if eggs.get(project) != seen.get(project))
        if self.eggs is None or changed:
            if not self.refresh_projects(changed):
                return  # keep the old catalogue: the next heartbeat tries again
        self.eggs = eggs

    def deliver_cancels(self, requests):
        """Signal this node's crawls once per cancel request not delivered yet (a second cancel.json forces)."""
        for request in requests:
            for process in list(self.launcher.processes.values()):
                claimed = getattr(process, "claimed", None)
                same_job = claimed.id == request.id if claimed is not None else (
                    (process.project, process.job) == (request.project, request.job))
                if not same_job or request.requests <= process.cancels_delivered:
                    continue
                process.cancels_delivered = request.requests
                process.cancel_signal = request.signal
                log.info("Cancelling job {job} of project {project} (signal {signal})", job=process.job,
                         project=process.project, signal=request.signal)
                try:
                    process.transport.signalProcess(int(request.signal) if request.signal.isdigit() else request.signal)
                except error.ProcessExitedAlready:
                    pass

    def refresh_projects(self, projects) -> bool:
        """Learn deployed or deleted eggs: poller and scheduler rebuild their queues (schedule.json and
        listprojects.json read them), and the cached spider lists of those projects are dropped."""
        try:
            self.launcher.poller.update_projects()
            self.launcher.app.getComponent(ISpiderScheduler).update_projects()
        except Exception as e:  # noqa: BLE001 - the heartbeat's check sees the change again
            log.error("Could not refresh the projects: {error}", error=e)
            return False
        for project in projects:
            spider_list.delete(project)
        return True
