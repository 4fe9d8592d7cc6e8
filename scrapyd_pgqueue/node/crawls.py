"""This node's crawls: each crawl's process and how it ended, and the set of them as ``node/`` sees it.

``PostgresProcessProtocol`` is the launcher's process protocol: Scrapyd's, plus the claim it runs on, how it ended
(outcome, exit code, reason), what the watchdog and the cancel requests did to it, and what it reported of its stats.

``NodeCrawls`` (``contracts.INodeCrawls``) holds the running crawls (the launcher's ``processes``, by slot) and the
ended ones whose finish is not written yet: finishes are written off the reactor, each on its own, and those that
fail stay, retried every heartbeat, while the database is away. The lease threads, the cluster's events and the
watchdog receive it, not the launcher.
"""

from __future__ import annotations

import time

from scrapyd.launcher import ScrapyProcessProtocol
from twisted.internet import error, threads
from twisted.logger import Logger
from zope.interface import implementer

from scrapyd_pgqueue.contracts import IClaimingPoller, INodeCrawls, IRecordingJobStorage
from scrapyd_pgqueue.crawl_process.job_stats import STATS_FD
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.store import WatchdogLimits
from scrapyd_pgqueue.store.statuses import CANCELLED, FAILED, FINISHED
from scrapyd_pgqueue.web import metrics

log = Logger()


class PostgresProcessProtocol(ScrapyProcessProtocol):
    """A crawl process that remembers how it ended."""

    claimed = None  # the poller's ClaimedJob: finishing the row is conditional on it
    handed_back = False  # killed by a stopping node and handed back to the queue: not recorded
    lease_lost = False  # stopped because this node could not renew its lease (on_lease_lost = stop): handed back
    exit_code = None
    outcome = None
    reason = None
    cancels_delivered = 0  # cancel requests (cancel.json on any node) signalled to this crawl; see node/events.py
    cancel_signal = None  # the signal of the latest one
    warm_parent_died = False  # forked from a warm process that died under it (node/warm.py): handed back
    on_started = None  # the launcher's crawl_started, called once the pid is known
    # The watchdog (node/watchdog.py); times are time.monotonic(). The crawl reports its spider's opening and its
    # progress (the last change of its request, response or item counts; the opening at first) to its node.
    started_at: float | None = None
    limits = WatchdogLimits()  # the job's own _max_runtime and _stall_timeout, learnt when its start is recorded
    stop_asked_at: float | None = None  # first asked to stop (cancel.json's first signal, the watchdog)
    killed_after_stop = False  # SIGKILLed cancel_timeout after that
    watchdog_outcome = None  # timeout or stalled: stopped by the watchdog, which says why
    watchdog_reason = None
    start_timed_out = False  # killed for not reaching its spider within start_timeout: handed back
    crawl_stats = None  # what the crawl reports on its stats descriptor (node/crawl_stats.py)
    token = None  # its crawl endpoint token (node/crawl_api.py)
    launch = None  # what it is told at its start (crawl_process/launch.py): its arguments, token, directories
    uid = None  # the uid it runs as (None: the node's)

    @property
    def spider_opened_at(self) -> float | None:
        return None if self.crawl_stats is None else self.crawl_stats.opened_at

    @property
    def progress_at(self) -> float | None:
        """The last change of its request, response or item counts; its spider's opening until the first."""
        if self.crawl_stats is None or self.crawl_stats.progress_at is None:
            return self.spider_opened_at
        return self.crawl_stats.progress_at

    def childDataReceived(self, childFD, data):
        if childFD == STATS_FD and self.crawl_stats is not None:
            self.crawl_stats.receive(data)
        else:
            super().childDataReceived(childFD, data)

    def connectionMade(self):
        self.started_at = time.monotonic()
        super().connectionMade()
        if self.on_started is not None:
            self.on_started(self)

    def processEnded(self, status):
        if isinstance(status.value, error.ProcessDone):
            self.exit_code, self.outcome = 0, FINISHED
        else:
            self.exit_code = status.value.exitCode
            signal = getattr(status.value, "signal", None)
            self.outcome = FAILED
            self.reason = f"killed by signal {signal}" if signal else f"exit code {self.exit_code}"
        if self.watchdog_outcome is not None:  # asked to stop by the watchdog before any cancel
            self.outcome = self.watchdog_outcome
            self.reason = f"{self.watchdog_reason}; {self.reason or 'exit code 0'}"
        elif self.cancel_signal is not None:  # however it exits, a crawl stopped by cancel.json was cancelled
            self.outcome = CANCELLED
            self.reason = f"cancelled (signal {self.cancel_signal}); {self.reason or 'exit code 0'}"
        super().processEnded(status)


@implementer(INodeCrawls)
class NodeCrawls:
    def __init__(self, settings, job_storage, claiming: IClaimingPoller | None):
        self.settings = settings
        self.processes: dict[int, PostgresProcessProtocol] = {}  # running, by slot (the launcher's processes)
        self.unrecorded: list[PostgresProcessProtocol] = []  # ended, their finish not written yet
        self.flushing = False
        self.stopping = False
        self.finished = job_storage
        self.recording = IRecordingJobStorage(job_storage, None)  # None: Scrapyd's, whose add() prunes after each
        self.claiming = claiming
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))

    def running(self) -> list[PostgresProcessProtocol]:
        return list(self.processes.copy().values())  # a copy: the reactor changes the original

    def held(self) -> list[PostgresProcessProtocol]:
        return [*self.running(), *list(self.unrecorded)]

    def known_claim_ids(self) -> set[int]:
        known_ids = {process.claimed.id for process in self.held() if process.claimed is not None}
        if self.claiming is not None:
            known_ids.update(self.claiming.claimed_ids())
        return known_ids

    def record(self, process: PostgresProcessProtocol) -> None:
        """Reactor thread: write an ended crawl's finish (now, or at a later heartbeat)."""
        metrics.CRAWLS_ENDED.labels(process.outcome or FAILED).inc()
        self.unrecorded.append(process)
        self.flush()

    def flush(self) -> None:
        """Write buffered finishes, one batch at a time; what fails stays for the next heartbeat, behind the others."""
        if self.flushing or not self.unrecorded:
            return
        self.flushing = True
        batch = list(self.unrecorded)

        def written(outcome):
            recorded, failed = outcome
            self.flushing = False
            for process in recorded + failed:
                self.unrecorded.remove(process)
            self.unrecorded.extend(failed)  # tried after the others next time
            if len(recorded) == len(batch):
                self.flush()  # more may have finished meanwhile

        threads.deferToThread(self._add_to_job_storage, batch).addCallback(written)

    def _add_to_job_storage(self, batch):
        """Thread: write each finish on its own, so that one that fails holds back no other, then prune once;
        return (written, failed). A batch stops after about one database_timeout: a stalled database costs one wait
        per heartbeat, not one per finish."""
        record = self.finished.add if self.recording is None else self.recording.record
        stop_at = time.monotonic() + self.settings.database_timeout
        recorded, failed, error = [], [], None
        for process in batch:
            if failed and time.monotonic() > stop_at:
                break  # the rest is tried next heartbeat
            try:
                record(process)
            except Exception as e:  # noqa: BLE001 - kept and retried; the slot is not affected
                failed.append(process)
                error = error or e
            else:
                recorded.append(process)
        if recorded and self.recording is not None:
            self.recording.tidy()  # never raises
        if failed:
            metrics.DATABASE_ERRORS.labels("record").inc(len(failed))
            jobs = ", ".join(process.job for process in failed[:5]) + (", ..." if len(failed) > 5 else "")
            self.trouble.report(f"Could not record {len(failed)} finished jobs ({jobs}), retrying every heartbeat: "
                                f"{error}", key="record")
        else:
            self.trouble.clear("record")
        return recorded, failed
