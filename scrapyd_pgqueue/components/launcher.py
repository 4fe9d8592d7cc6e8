"""Launcher that records each crawl on its row and never loses a process slot.

Over Scrapyd's Launcher it adds: the node's registration and heartbeat (its lease on the jobs it runs), node
name and pid on the row when the crawl starts, the exit code and outcome when it ends, a failed row (with the
reason) when the crawl cannot even be spawned, and finishes that are buffered and retried while the database
is away. Whatever fails, the slot asks the poller for its next job.

Leases (``node/leases.py``): a thread renews this process's lease on its jobs every heartbeat and recovers the jobs of
other processes whose lease expired, only once this node's own heartbeats have been prompt without a break for a
whole lease; with ``on_lease_lost = stop`` another stops this node's crawls before its lease can expire. That
thread's tick (one statement a heartbeat) also hands back claims this node has no crawl for (a claim whose reply
was lost with its connection) and reads the cancel requests, egg catalogue and next periodic and webhook due times,
which ``learn`` acts on (webhook events are sent by ``node/webhooks.py``'s thread); the reactor's upkeep hands back
the jobs of crawls stopped for a lost lease.

The watchdog (``node/watchdog.py``) stops crawls past their job's limits (outcome 'timeout' or 'stalled'), kills
those that ignore a stop, and hands back the jobs of crawls that never reach their spider.

Graceful stop (SIGTERM): stop claiming, let running crawls go on for up to ``stop_timeout`` seconds, record
the ones that end, then kill what still runs and hand it back to the queue (the attempt stays counted; once
``max_attempts`` are used up the job ends as 'interrupted'). Only then is the node marked stopped.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time

from twisted.application.internet import TimerService
from twisted.internet import defer, error, reactor, task, threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from scrapyd.interfaces import IEggStorage, IEnvironment, IPoller
from scrapyd.launcher import Launcher, ScrapyProcessProtocol, get_crawl_args
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue import crawl
from scrapyd_pgqueue.components.eggstorage import EggRefused
from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.job_stats import INTERVAL_VARIABLE, STATS_FD
from scrapyd_pgqueue.statuses import CANCELLED, FAILED, FINISHED, PENDING
from scrapyd_pgqueue.node import metrics
from scrapyd_pgqueue.node.crawl_api import SOCKET_DIRECTORY, CrawlApi
from scrapyd_pgqueue.node.crawl_keys import crawl_environment, node_secrets
from scrapyd_pgqueue.node.crawl_stats import CrawlStats
from scrapyd_pgqueue.node.events import ClusterEvents
from scrapyd_pgqueue.node.leases import LeaseKeeper, LeaseWatch
from scrapyd_pgqueue.node.warm import WarmStarts
from scrapyd_pgqueue.node.watchdog import Watchdog
from scrapyd_pgqueue.node.webhooks import WebhookSender
from scrapyd_pgqueue.store import JobStore, WatchdogLimits
from scrapyd_pgqueue.throttled_log import ThrottledLog

log = Logger()

class EggNotKept(RuntimeError):
    """The node could not keep a job's egg as a file; its crawl would have no code to run."""


# Seconds a stopping node waits for killed crawls to end, and for buffered finishes to be written.
KILL_WAIT = 5.0
FLUSH_BEFORE_EXIT_WAIT = 5.0


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


class PostgresLauncher(Launcher):
    def __init__(self, config, app):
        super().__init__(config, app)
        self.settings = pgconfig.settings(config)
        self.store = JobStore.for_settings(self.settings)
        self.url = self._node_url(config)
        self.unrecorded: list[ScrapyProcessProtocol] = []  # finished jobs whose finish is not written yet
        self.flushing = False
        self.upkeep = TimerService(self.settings.heartbeat_interval, self.keep_up)
        self.lease = LeaseKeeper(self)
        self.lease_watch = LeaseWatch(self, self.lease) if self.settings.on_lease_lost == "stop" else None
        self.lease_lost_claims = []  # claims of crawls stopped by lease_watch or whose warm process died: handed back
        # once the database answers
        self.events = ClusterEvents(self)  # cancel requests and egg changes from other nodes
        self.watchdog = Watchdog(self)
        self.webhooks = WebhookSender(self.settings, self.url)  # woken by learn when the tick says events are due
        self.stopping = False
        self.unstarted: list = []  # claims that arrived while stopping: handed back with the rest
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))
        # A crawl holds no keys: its environment loses the node's secrets; it schedules through the node's endpoint.
        self.secrets = node_secrets(config, self.settings)
        self.crawl_api = CrawlApi(self.settings, self.store, self.settings.node_name)
        self.warm = None
        if self.settings.warm_start:
            self.warm = WarmStarts(self.settings.warm_processes, self.settings.warm_idle_timeout, self._spawn_cold,
                                   self.secrets)

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
        self.crawl_api.listen(SOCKET_DIRECTORY)
        self.register()
        self.lease.start()
        if self.lease_watch is not None:
            self.lease_watch.start()
        self.events.start()
        self.watchdog.start()
        self.webhooks.start()
        self.upkeep.startService()
        super().startService()

    def stopService(self):
        """Graceful stop (see the module's docstring); twistd waits for the returned Deferred."""
        self.stopping = True
        self.webhooks.stop()  # an event it was sending is sent again by another node after its lease
        stop_claiming = getattr(self.poller, "stop", None)
        if stop_claiming is not None:
            stop_claiming()
        stopping = self._stop_gracefully()
        stopping.addErrback(lambda failure: log.failure("Graceful stop failed", failure))
        return stopping.addBoth(lambda _: super(PostgresLauncher, self).stopService())

    @defer.inlineCallbacks
    def _stop_gracefully(self):
        if self.processes:
            log.info("Stopping: letting {count} crawls run for up to {seconds}s", count=len(self.processes),
                     seconds=self.settings.stop_timeout)
            yield self._wait_until(lambda: not self.processes, self.settings.stop_timeout)
        left = list(self.processes.values())
        for process in left:
            process.handed_back = True
            try:
                process.transport.signalProcess("KILL")
            except error.ProcessExitedAlready:
                pass
        yield self._wait_until(lambda: not self.processes, KILL_WAIT)
        if self.warm is not None:
            self.warm.stop()
        yield self._wait_until(lambda: not self.unrecorded, FLUSH_BEFORE_EXIT_WAIT, retry=self._flush_unrecorded)
        claims = [process.claimed for process in left if process.claimed is not None] + self.unstarted
        try:
            handed_back = yield threads.deferToThread(
                self.store.hand_back, claims, worker=pgconfig.WORKER_ID, node=self.settings.node_name,
                max_attempts=self.settings.max_attempts,
            )
        except Exception as e:  # noqa: BLE001 - the lease expires instead, and another node recovers them
            log.error("Could not hand back {count} jobs; they are recovered when this node's lease expires: {error}",
                      count=len(claims), error=e)
            return
        finally:
            self.upkeep.stopService()
            self.watchdog.stop()
            self.lease.stop()
        self._log_released(handed_back, "was handed back by this stopping node")
        if self.unrecorded:
            return  # their jobs are still ongoing: keep the node unstopped, so only its lease expiry recovers them
        try:
            yield threads.deferToThread(self.store.stop_node, pgconfig.WORKER_ID)
        except Exception as e:  # noqa: BLE001 - shutting down regardless
            log.error("Could not mark this node stopped: {error}", error=e)

    @staticmethod
    @defer.inlineCallbacks
    def _wait_until(done, seconds, retry=None):
        """Fire once ``done()`` holds or ``seconds`` have passed, calling ``retry()`` (if given) between checks."""
        deadline = reactor.seconds() + seconds
        while not done() and reactor.seconds() < deadline:
            if retry is not None:
                retry()
            yield task.deferLater(reactor, 0.1, lambda: None)

    def register(self):
        try:
            self.store.register_node(
                worker=pgconfig.WORKER_ID, name=self.settings.node_name, url=self.url, max_proc=self.max_proc,
                tags=self.settings.node_tags,
            )
        except Exception as e:  # noqa: BLE001 - the heartbeat registers again once the database answers
            log.error("Could not register this node: {error}", error=e)

    def keep_up(self):
        """Retry finishes not written yet, and hand back the jobs of crawls stopped for a lost lease (each sends
        nothing when there is none: an idle node's one statement per heartbeat is the lease thread's tick)."""
        self._flush_unrecorded()
        if self.warm is not None:
            self.warm.retire_idle()
        if self.stopping or self.lease.healthy_since is None:
            return  # a stopping node hands its claims back itself; a database that is away is left alone
        self._hand_back_lease_lost_claims()

    def known_claim_ids(self) -> set[int]:
        """Any thread: the jobs this node runs or is about to run (copies: the reactor changes the originals)."""
        running = [*self.processes.copy().values(), *list(self.unrecorded)]
        known_ids = {process.claimed.id for process in running if process.claimed is not None}
        known_ids.update(claimed.id for claimed in getattr(self.poller, "claims", {}).copy().values())
        return known_ids

    def learn(self, tick, read_at: float):
        """Reactor thread: act on what the lease thread's tick learned (``JobStore.node_tick``), which it asked for
        at ``read_at`` (``time.monotonic()``)."""
        self._log_released(tick.recovered, "was recovered from a node whose lease expired")
        self._log_released(tick.released, "was claimed by this node but its claim's reply was lost")
        self.events.learn(tick.cancels, tick.eggs, read_at)
        periodic = getattr(self.poller, "periodic", None)
        if periodic is not None:
            periodic.due_in(tick.periodic_due_in)
        self.webhooks.due_in(tick.webhooks_due_in)

    def _hand_back_lease_lost_claims(self):
        """The jobs whose crawls lease_watch stopped go back to the queue (unless another node took them over)."""
        claims, self.lease_lost_claims = self.lease_lost_claims, []
        if not claims:
            return

        def failed(failure):
            self.lease_lost_claims.extend(claims)  # next heartbeat
            log.error("Could not hand back {count} jobs stopped for a lost lease: {error}", count=len(claims),
                      error=failure.getErrorMessage())

        threads.deferToThread(
            self.store.hand_back, claims, worker=pgconfig.WORKER_ID, node=self.settings.node_name,
            max_attempts=self.settings.max_attempts,
        ).addCallbacks(self._log_released, failed,
                       callbackArgs=("was stopped (lost lease, its warm process died, or it did not reach its spider "
                                     "within start_timeout) and handed back",))

    def _log_released(self, released, how):
        """Reactor thread: log jobs taken from a node, and claim at once what went back to pending."""
        for job in released:
            log.warn("Job {job} of project {project} {how}: now {status}", job=job.job, project=job.project,
                     how=how, status=job.status)
        if any(job.status == PENDING for job in released) and not self.stopping:
            self.poller.poll()  # NOTIFY wakes the other nodes; this one may have a free slot too

    # --- crawls ----------------------------------------------------------------------------------------------

    def _spawn_process(self, message, slot):
        take_claim = getattr(self.poller, "take_claim", None)
        claimed = take_claim(message) if take_claim is not None else None
        if self.stopping:  # claimed while the stop began: handed back with the rest
            if claimed is not None:
                self.unstarted.append(claimed)
            return
        # The node fetches the egg (from its cache when current), so the crawl opens no database connection.
        egg_file = getattr(self.app.getComponent(IEggStorage), "egg_file", None)
        if egg_file is None:
            return self._spawn_crawl(None, message, slot, claimed)
        threads.deferToThread(egg_file, message["_project"], message.get("_version")).addCallbacks(
            self._spawn_crawl, self._egg_not_fetched, callbackArgs=(message, slot, claimed),
            errbackArgs=(message, slot, claimed),
        )

    def _egg_not_fetched(self, failure, message, slot, claimed):
        """A crawl cannot fetch its egg itself (it holds no database URL): a job whose egg the database could not give
        goes back to the queue; one whose egg is refused (altered in the database) or could not be kept (a full
        disk) fails, with the reason, and nothing runs it."""
        from scrapyd_pgqueue.db import DatabaseError

        if self.stopping and claimed is not None:
            self.unstarted.append(claimed)
            return
        if failure.check(DatabaseError) and claimed is not None:
            log.error("Could not fetch the egg of project {project} for job {job}, handing the job back: {error}",
                      project=message["_project"], job=message["_job"], error=failure.getErrorMessage())
            self.lease_lost_claims.append(claimed)  # handed back once the database answers
            self._get_message(slot)
            return
        self._spawn_crawl(failure, message, slot, claimed)  # recorded as a crawl that could not start

    def _spawn_crawl(self, egg, message, slot, claimed):
        if self.stopping:  # the stop began while the egg was fetched
            if claimed is not None:
                self.unstarted.append(claimed)
            return
        project = message["_project"]
        process = PostgresProcessProtocol(project, message["_spider"], message["_job"], {}, [])
        process.claimed = claimed
        process.on_started = self.crawl_started
        process.crawl_stats = CrawlStats(project, message["_spider"])
        try:
            if isinstance(egg, Failure):
                if egg.check(EggRefused):
                    raise egg.value
                raise EggNotKept(f"could not fetch the egg of project {project}: {egg.getErrorMessage()}")
            environment = self.app.getComponent(IEnvironment)
            message.setdefault("settings", {})
            message["settings"].update(environment.get_settings(message))
            env = environment.get_environment(message, slot)
            env[pgconfig.NODE_NAME_VARIABLE] = self.settings.node_name
            env[crawl.JOB_VARIABLE] = message["_job"]
            env[INTERVAL_VARIABLE] = f"{self.settings.stats_interval:g}"  # the crawl's stats (job_stats.py)
            if egg is not None:
                env[EGG_FILE_VARIABLE] = egg
            process.env = crawl_environment(env, self.secrets)
            # Crawl trees (scrapyd_pgqueue.crawl): the node's endpoint and this crawl's token, which dies with it.
            process.env.update(self.crawl_api.admit(project, message["_job"], claimed))
            process.args = [sys.executable, "-m", self.runner, "crawl", *get_crawl_args(message)]
            process.deferred.addBoth(self._process_finished, slot)
            if self.warm is None:
                self._spawn_cold(process)
            else:
                self.warm.spawn(process, project, egg)  # warm or cold; its start is recorded either way
        except Exception as e:  # noqa: BLE001 - e.g. "Argument list too long", "embedded null byte"
            log.error("Could not start job {job}: {error}", job=message["_job"], error=e)
            self.crawl_api.forget(process.env)
            process.end_time = datetime.datetime.now()
            process.outcome, process.reason = FAILED, f"could not start the crawl: {type(e).__name__}: {e}"
            self._record_finished(process)
            self._get_message(slot)
            return
        self.processes[slot] = process
        metrics.crawl_started(claimed)

    def _spawn_cold(self, process):
        """As Scrapyd spawns a crawl: a new Python running the runner."""
        reactor.spawnProcess(process, sys.executable, args=process.args, env=process.env,
                             childFDs={0: "w", 1: "r", 2: "r", STATS_FD: "r"})

    def crawl_started(self, process):
        """The crawl's pid is known (at once when spawned, once forked when warm): record it on the row."""
        if process.claimed is not None:
            threads.deferToThread(
                self.store.mark_started, process.claimed, worker=pgconfig.WORKER_ID, pid=process.pid,
                start_time=process.start_time,
            ).addCallbacks(
                lambda limits: setattr(process, "limits", limits or WatchdogLimits()),
                lambda failure: log.error("Could not record the pid: {e}", e=failure.getErrorMessage()),
            )

    def _process_finished(self, _, slot):
        process = self.processes.pop(slot)
        process.end_time = datetime.datetime.now()
        self.crawl_api.forget(process.env)
        if (process.lease_lost or process.warm_parent_died or process.start_timed_out) and process.claimed is not None:
            self.lease_lost_claims.append(process.claimed)
        elif not process.handed_back:
            self._record_finished(process)
        if not self.stopping:
            self._get_message(slot)  # always: a failing job storage must not cost the slot

    def _record_finished(self, process):
        metrics.CRAWLS_ENDED.labels(process.outcome or FAILED).inc()
        self.unrecorded.append(process)
        self._flush_unrecorded()

    def _flush_unrecorded(self):
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
                self._flush_unrecorded()  # more may have finished meanwhile

        threads.deferToThread(self._add_to_job_storage, batch).addCallback(written)

    def _add_to_job_storage(self, batch):
        """Thread: write each finish on its own, so that one that fails holds back no other, then prune once;
        return (written, failed). A batch stops after about one database_timeout: a stalled database costs one wait
        per heartbeat, not one per finish."""
        record = getattr(self.finished, "record", self.finished.add)  # add() prunes after each finish
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
        if recorded and hasattr(self.finished, "tidy"):
            self.finished.tidy()  # never raises
        if failed:
            metrics.DATABASE_ERRORS.labels("record").inc(len(failed))
            jobs = ", ".join(process.job for process in failed[:5]) + (", ..." if len(failed) > 5 else "")
            self.trouble.report(f"Could not record {len(failed)} finished jobs ({jobs}), retrying every heartbeat: "
                                f"{error}", key="record")
        else:
            self.trouble.clear("record")
        return recorded, failed
