"""Launcher that records each crawl on its row and never loses a process slot.

Over Scrapyd's Launcher it adds: the node's registration and heartbeat (its lease on the jobs it runs), node
name and pid on the row when the crawl starts, the exit code and outcome when it ends, a failed row (with the
reason) when the crawl cannot even be spawned, and finishes that are buffered and retried while the database
is away. Whatever fails, the slot asks the poller for its next job.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

from twisted.application.internet import TimerService
from twisted.internet import error, reactor, threads
from twisted.logger import Logger

from scrapyd.interfaces import IEnvironment, IPoller
from scrapyd.launcher import Launcher, ScrapyProcessProtocol, get_crawl_args
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.models import FAILED, FINISHED
from scrapyd_pgqueue.store import JobStore

log = Logger()


class PostgresProcessProtocol(ScrapyProcessProtocol):
    """A crawl process that remembers how it ended."""

    claimed = None  # the poller's ClaimedJob: finishing the row is conditional on it
    exit_code = None
    outcome = None
    reason = None

    def processEnded(self, status):
        if isinstance(status.value, error.ProcessDone):
            self.exit_code, self.outcome = 0, FINISHED
        else:
            self.exit_code = status.value.exitCode
            signal = getattr(status.value, "signal", None)
            self.outcome = FAILED
            self.reason = f"killed by signal {signal}" if signal else f"exit code {self.exit_code}"
        super().processEnded(status)


class PostgresLauncher(Launcher):
    def __init__(self, config, app):
        super().__init__(config, app)
        self.settings = pgconfig.settings(config)
        self.store = JobStore.for_url(self.settings.database_url)
        self.url = self._node_url(config)
        self.unrecorded: list[ScrapyProcessProtocol] = []  # finished jobs whose finish is not written yet
        self.flushing = False
        self.heartbeat = TimerService(self.settings.heartbeat_interval, self.keep_alive)

    @staticmethod
    def _node_url(config):
        url = os.environ.get("SCRAPYD_NODE_URL") or config.get("node_url", "")
        if url:
            return url
        port = os.environ.get("SCRAPYD_HTTP_PORT") or config.get("http_port", "6800")
        return f"http://{socket.gethostname()}:{port}/"

    @property
    def poller(self):
        return self.app.getComponent(IPoller)

    def startService(self):
        self.register()
        self.heartbeat.startService()
        super().startService()

    def stopService(self):
        stop_claiming = getattr(self.poller, "stop", None)
        if stop_claiming is not None:
            stop_claiming()
        self.heartbeat.stopService()
        try:
            self.store.stop_node(pgconfig.WORKER_ID)
        except Exception as e:  # noqa: BLE001 - shutting down regardless
            log.error("Could not mark this node stopped: {error}", error=e)
        return super().stopService()

    def register(self):
        try:
            self.store.register_node(
                worker=pgconfig.WORKER_ID, name=self.settings.node_name, url=self.url, max_proc=self.max_proc
            )
        except Exception as e:  # noqa: BLE001 - the heartbeat registers again once the database answers
            log.error("Could not register this node: {error}", error=e)

    def keep_alive(self):
        """Renew the lease (off the reactor thread), then retry finishes that could not be written before."""
        self._flush_unrecorded()
        return threads.deferToThread(self._renew_lease).addErrback(
            lambda failure: log.error("Heartbeat failed: {error}", error=failure.getErrorMessage())
        )

    def _renew_lease(self):
        if not self.store.heartbeat(pgconfig.WORKER_ID):
            self.register()

    # --- crawls ----------------------------------------------------------------------------------------------

    def _spawn_process(self, message, slot):
        take_claim = getattr(self.poller, "take_claim", None)
        claimed = take_claim(message) if take_claim is not None else None
        project = message["_project"]
        process = PostgresProcessProtocol(project, message["_spider"], message["_job"], {}, [])
        process.claimed = claimed
        try:
            environment = self.app.getComponent(IEnvironment)
            message.setdefault("settings", {})
            message["settings"].update(environment.get_settings(message))
            env = environment.get_environment(message, slot)
            env[pgconfig.NODE_NAME_VARIABLE] = self.settings.node_name
            args = [sys.executable, "-m", self.runner, "crawl", *get_crawl_args(message)]
            process.env, process.args = env, args
            process.deferred.addBoth(self._process_finished, slot)
            reactor.spawnProcess(process, sys.executable, args=args, env=env)
        except Exception as e:  # noqa: BLE001 - e.g. "Argument list too long", "embedded null byte"
            log.error("Could not start job {job}: {error}", job=message["_job"], error=e)
            process.end_time = datetime.datetime.now()
            process.outcome, process.reason = FAILED, f"could not start the crawl: {type(e).__name__}: {e}"
            self._record_finished(process)
            self._get_message(slot)
            return
        self.processes[slot] = process
        if claimed is not None:
            threads.deferToThread(
                self.store.mark_started, claimed, worker=pgconfig.WORKER_ID, pid=process.pid,
                start_time=process.start_time,
            ).addErrback(lambda failure: log.error("Could not record the pid: {e}", e=failure.getErrorMessage()))

    def _process_finished(self, _, slot):
        process = self.processes.pop(slot)
        process.end_time = datetime.datetime.now()
        self._record_finished(process)
        self._get_message(slot)  # always: a failing job storage must not cost the slot

    def _record_finished(self, process):
        self.unrecorded.append(process)
        self._flush_unrecorded()

    def _flush_unrecorded(self):
        """Write buffered finishes in order, one batch at a time; what fails stays for the next heartbeat."""
        if self.flushing or not self.unrecorded:
            return
        self.flushing = True
        batch = list(self.unrecorded)

        def written(recorded):
            self.flushing = False
            for process in recorded:
                self.unrecorded.remove(process)
            if len(recorded) == len(batch):
                self._flush_unrecorded()  # more may have finished meanwhile

        threads.deferToThread(self._add_to_job_storage, batch).addCallback(written)

    def _add_to_job_storage(self, batch):
        recorded = []
        for process in batch:
            try:
                self.finished.add(process)
            except Exception as e:  # noqa: BLE001 - kept and retried; the slot is not affected
                log.error("Could not record job {job}, retrying: {error}", job=process.job, error=e)
                break
            recorded.append(process)
        return recorded
