"""What a node acts on when the cluster changes elsewhere: cancel requests for its crawls, deployed or deleted eggs.

Another node's cancel.json reaches the node running the job; an egg deployed through another node becomes known
here without a restart. The node's one listener (``node/notifications.py``, shared with the poller) hears both;
NOTIFY is only a hint, so the node's tick (``JobStore.node_tick``, every heartbeat) reads the same state as the
floor and hands it to ``learn()``; ``check()`` reads it after the listener reconnects.
Used by ``PostgresLauncher``, which gives it its crawls (``contracts.INodeCrawls``) and the parts that act on a
change; runs on the reactor thread except where noted.
"""

from __future__ import annotations

import json
import time

from scrapyd.webservice import spider_list
from twisted.internet import error, reactor, threads
from twisted.logger import Logger

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import IEggFiles, INodeCrawls
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.node import notifications
from scrapyd_pgqueue.node.warm import WarmStarts
from scrapyd_pgqueue.store import (
    CANCEL_CHANNEL,
    PROJECTS_CHANNEL,
    AllJobsStore,
    CancelRequest,
    EggStore,
    signal_number,
)

log = Logger()


class ClusterEvents:
    def __init__(self, settings, crawls: INodeCrawls, queue_holders, *, warm: WarmStarts | None,
                 egg_files: IEggFiles | None):
        """``queue_holders``: the components that rebuild their queues when projects change (the poller and the
        scheduler: schedule.json and listprojects.json read them); ``warm``: the node's warm processes (None: off);
        ``egg_files``: the egg storage that keeps the node's cached eggs (None: Scrapyd's, which keeps its own)."""
        self.settings, self.crawls = settings, crawls
        self.queue_holders, self.warm, self.egg_files = queue_holders, warm, egg_files
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))
        self.eggs: dict[str, tuple[int, int]] | None = None  # the egg catalogue last seen
        self.eggs_read_at = float("-inf")  # when the read that saw it was asked for (time.monotonic())

    def start(self):
        self.eggs_read_at = time.monotonic()
        try:
            self.eggs = EggStore.for_settings(self.settings).egg_catalogue()
        except Exception as e:  # noqa: BLE001 - the first heartbeat that reaches the database reads it
            log.error("Could not read the egg catalogue: {error}", error=e)
        else:
            self.prune_egg_cache()  # files of eggs deleted while this node was down
        if not self.settings.listen_notify:
            return  # the tick's learn() alone
        listener = notifications.listener_for(self.settings)
        listener.subscribe(CANCEL_CHANNEL, self._cancel_requested, on_reconnect=self._check_soon)
        listener.subscribe(PROJECTS_CHANNEL, self._check_soon)  # a deploy or delete: the catalogue as it is now

    def _check_soon(self, *_payload):
        """Listener thread: have the reactor ``check()``."""
        reactor.callFromThread(self.check)

    def _cancel_requested(self, payload):
        """Listener thread: hand a cancel request for one of this node's crawls to the reactor."""
        request = CancelRequest(**json.loads(payload))
        if request.worker == pgconfig.WORKER_ID:
            reactor.callFromThread(self.deliver_cancels, [request])

    def learn(self, cancels, eggs, read_at: float):
        """Reactor thread: the cancel requests and egg catalogue the node's tick read (the floor under NOTIFY),
        asked for at ``read_at`` (``time.monotonic()``); ``eggs`` None: not read this time."""
        if eggs is None:
            self.deliver_cancels(cancels)
        else:
            self._apply_state((cancels, eggs), read_at)

    def check(self):
        """Read what the tick reads, now: after a deploy or delete anywhere, and after the listener reconnects (when
        NOTIFYs may have been lost)."""
        return (
            threads.deferToThread(self._read_state)
            .addCallback(self._apply_state, time.monotonic())
            .addErrback(lambda failure: self.trouble.report(
                f"Reading cancel requests and eggs failed: {failure.getErrorMessage()}", key="check"))
        )

    def _read_state(self):
        cancels = AllJobsStore.for_settings(self.settings).requested_cancels(pgconfig.WORKER_ID)
        return cancels, EggStore.for_settings(self.settings).egg_catalogue()

    def _apply_state(self, state, read_at: float):
        self.trouble.clear("check")
        cancels, eggs = state
        self.deliver_cancels(cancels)
        if read_at < self.eggs_read_at:
            return  # a tick asked before the catalogue already applied: it would undo a change, then see it again
        seen = self.eggs if self.eggs is not None else {}  # never read: whatever exists may be new here
        changed = sorted(project for project in eggs.keys() | seen.keys() if eggs.get(project) != seen.get(project))
        if self.eggs is None or changed:
            if not self.refresh_projects(changed, read_at):
                return  # keep the old catalogue: the next heartbeat tries again
        self.eggs, self.eggs_read_at = eggs, read_at

    def deliver_cancels(self, requests):
        """Signal this node's crawls once per cancel request not delivered yet (a second cancel.json forces). A
        request that cannot be delivered costs no other request its delivery."""
        for request in requests:
            for process in self.crawls.running():
                claimed = process.claimed
                same_job = claimed.id == request.id if claimed is not None else (
                    (process.project, process.job) == (request.project, request.job))
                if not same_job or request.requests <= process.cancels_delivered:
                    continue
                process.cancels_delivered = request.requests
                self._signal(process, request.signal)

    @staticmethod
    def _signal(process, signal: str) -> None:
        """Send a cancel request's signal to a crawl, which then ends 'cancelled'; one that is no signal (a row
        written another way: cancel.json and the operator command refuse them) is logged and sent to nobody."""
        job, project = process.job, process.project
        try:
            number = signal_number(signal)
        except ValueError as e:
            log.error("Not cancelling job {job} of project {project}: {error}", job=job, project=project, error=e)
            return
        log.info("Cancelling job {job} of project {project} (signal {signal})", job=job, project=project,
                 signal=signal)
        try:
            process.transport.signalProcess(number)
        except error.ProcessExitedAlready:
            return
        except OSError as e:
            log.error("Could not signal job {job} of project {project}: {error}", job=job, project=project, error=e)
            return
        process.cancel_signal = signal
        if process.stop_asked_at is None:  # cancel_timeout runs from the first (node/watchdog.py)
            process.stop_asked_at = time.monotonic()

    def refresh_projects(self, projects, read_at: float) -> bool:
        """Learn deployed or deleted eggs, seen in a read asked for at ``read_at`` (``time.monotonic()``): poller
        and scheduler rebuild their queues (schedule.json and listprojects.json read them), the cached spider lists of
        those projects are dropped, and so are the cached egg files of deleted eggs. Warm processes started before
        the read are retired; one started after it imported the eggs the read saw, or newer ones."""
        try:
            for holder in self.queue_holders:
                holder.update_projects()
        except Exception as e:  # noqa: BLE001 - the heartbeat's check sees the change again
            log.error("Could not refresh the projects: {error}", error=e)
            return False
        for project in projects:
            spider_list.delete(project)
        if self.warm is not None:
            self.warm.retire_projects(projects, started_before=read_at)  # no fork from code older than that
        self.prune_egg_cache()
        return True

    def prune_egg_cache(self):
        """Delete this node's cached eggs that the database no longer has, off the reactor (a stock egg storage
        keeps its own files)."""
        if self.egg_files is None:
            return None
        return (
            threads.deferToThread(self.egg_files.prune_cache)
            .addCallback(self._egg_cache_pruned)
            .addErrback(lambda failure: self.trouble.report(
                f"Pruning the egg cache failed: {failure.getErrorMessage()}", key="egg cache"))
        )

    def _egg_cache_pruned(self, deleted):
        self.trouble.clear("egg cache")
        if deleted:
            log.info("Deleted {count} cached eggs that the database no longer has", count=len(deleted))
