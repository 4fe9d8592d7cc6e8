"""Launcher that records each crawl on its row and never loses a process slot.

Over Scrapyd's Launcher it adds: the node's registration and heartbeat (its lease on the jobs it runs), node
name and pid on the row when the crawl starts, the exit code and outcome when it ends, a failed row (with the
reason) when the crawl cannot even be spawned, and finishes that are buffered and retried while the database
is away (``node/crawls.py``, which is what the node's threads below see of the launcher). Whatever fails, the slot asks
the poller for its next job.

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
import uuid

from scrapyd.interfaces import IEggStorage, IEnvironment, IPoller, ISpiderScheduler
from scrapyd.launcher import Launcher, get_crawl_args
from twisted.application.internet import TimerService
from twisted.internet import defer, error, reactor, task, threads
from twisted.logger import Logger
from twisted.python.failure import Failure

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.components.eggstorage import EggRefused
from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.contracts import IClaimingPoller, IEggFiles
from scrapyd_pgqueue.crawl_process import launch
from scrapyd_pgqueue.crawl_process.crawl_node import JOB_VARIABLE
from scrapyd_pgqueue.crawl_process.job_stats import INTERVAL_VARIABLE, STATS_FD
from scrapyd_pgqueue.node import relayed, spawning
from scrapyd_pgqueue.node.crawl_api import SOCKET_DIRECTORY, CrawlApi
from scrapyd_pgqueue.node.crawl_keys import crawl_environment, node_secrets
from scrapyd_pgqueue.node.crawl_stats import CrawlStats
from scrapyd_pgqueue.node.crawls import NodeCrawls, PostgresProcessProtocol
from scrapyd_pgqueue.node.events import ClusterEvents
from scrapyd_pgqueue.node.leases import LeaseKeeper, LeaseWatch
from scrapyd_pgqueue.node.warm import WarmStarts
from scrapyd_pgqueue.node.watchdog import Watchdog
from scrapyd_pgqueue.node.webhooks import WebhookSender
from scrapyd_pgqueue.store import JobStore, WatchdogLimits
from scrapyd_pgqueue.store.statuses import FAILED, PENDING
from scrapyd_pgqueue.web import metrics

log = Logger()

class EggNotKept(RuntimeError):
    """The node could not keep a job's egg as a file; its crawl would have no code to run."""


# Seconds a stopping node waits for killed crawls to end, and for buffered finishes to be written.
KILL_WAIT = 5.0
FLUSH_BEFORE_EXIT_WAIT = 5.0


class PostgresLauncher(Launcher):
    def __init__(self, config, app):
        super().__init__(config, app)
        # What the configured components give beyond Scrapyd's interfaces (Scrapyd's own give none, and still work):
        # claims to record the crawls on, eggs as files (and the job storage's, in NodeCrawls).
        self.claiming = IClaimingPoller(app.getComponent(IPoller), None)
        self.egg_files = IEggFiles(app.getComponent(IEggStorage), None)
        self.settings = settings = pgconfig.settings(config)
        self.store = JobStore.for_settings(settings)
        self.url = self._node_url(config)
        # What node/ sees of this launcher: its crawls (processes is Scrapyd's name for the running ones), whose
        # finishes it writes.
        self.crawls = NodeCrawls(settings, self.finished, self.claiming)
        self.processes = self.crawls.processes
        self.upkeep = TimerService(settings.heartbeat_interval, self.keep_up)
        self.lease = LeaseKeeper(settings, self.crawls, self.learn, url=self.url, max_proc=self.max_proc)
        self.lease_watch = LeaseWatch(settings, self.crawls, self.lease) if settings.on_lease_lost == "stop" else None
        self.lease_lost_claims = []  # claims of crawls stopped by lease_watch or whose warm process died: handed back
        # once the database answers
        # A crawl holds no keys: its environment loses the node's secrets; it schedules through the node's endpoint.
        self.secrets = node_secrets(config, settings)
        self.crawl_api = CrawlApi(settings, self.store, settings.node_name)
        self.warm = None
        if settings.warm_start:
            self.warm = WarmStarts(settings, self._spawn_cold, self.secrets)
            self.warm.project_directories = lambda project: app.getComponent(IEnvironment).project_directories(project)
        # Cancel requests and egg changes from other nodes; the poller and scheduler rebuild their queues on the latter.
        self.events = ClusterEvents(settings, self.crawls, (self.poller, app.getComponent(ISpiderScheduler)),
                                    warm=self.warm, egg_files=self.egg_files)
        self.watchdog = Watchdog(settings, self.crawls, self.runner)
        self.webhooks = WebhookSender(settings, self.url)  # woken by learn when the tick says events are due
        self.unstarted: list = []  # claims that arrived while stopping: handed back with the rest

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
        self.crawls.stopping = True
        self.webhooks.stop()  # an event it was sending is sent again by another node after its lease
        if self.claiming is not None:
            self.claiming.stop()
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
        yield self._wait_until(lambda: not self.crawls.unrecorded, FLUSH_BEFORE_EXIT_WAIT, retry=self.crawls.flush)
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
        if self.crawls.unrecorded:
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
        self.crawls.flush()
        if self.warm is not None:
            self.warm.retire_idle()
        if self.crawls.stopping or self.lease.healthy_since is None:
            return  # a stopping node hands its claims back itself; a database that is away is left alone
        self._hand_back_lease_lost_claims()

    def learn(self, tick, read_at: float):
        """Reactor thread: act on what the lease thread's tick learned (``JobStore.node_tick``), which it asked for
        at ``read_at`` (``time.monotonic()``)."""
        self._log_released(tick.recovered, "was recovered from a node whose lease expired")
        self._log_released(tick.released, "was claimed by this node but its claim's reply was lost")
        self.events.learn(tick.cancels, tick.eggs, read_at)
        if self.claiming is not None:
            self.claiming.periodic_due_in(tick.periodic_due_in)
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
        if any(job.status == PENDING for job in released) and not self.crawls.stopping:
            self.poller.poll()  # NOTIFY wakes the other nodes; this one may have a free slot too

    # --- crawls ----------------------------------------------------------------------------------------------

    def _spawn_process(self, message, slot):
        claimed = self.claiming.take_claim(message) if self.claiming is not None else None
        if self.crawls.stopping:  # claimed while the stop began: handed back with the rest
            if claimed is not None:
                self.unstarted.append(claimed)
            return
        # The node fetches the egg (from its cache when current) and the project's uid, so the crawl opens no
        # database connection.
        threads.deferToThread(self._crawl_inputs, message["_project"], message.get("_version")).addCallbacks(
            self._spawn_crawl, self._egg_not_fetched, callbackArgs=(message, slot, claimed),
            errbackArgs=(message, slot, claimed),
        )

    def _crawl_inputs(self, project: str, version: str | None) -> tuple:
        """Thread: the egg the crawl runs (a ``SealedEgg``, None: no egg, the project is baked in) and the uid it runs
        as (None: the node's)."""
        egg = None if self.egg_files is None else self.egg_files.sealed_egg(project, version)
        try:
            return egg, spawning.crawl_uid(project)
        except BaseException:
            if egg is not None:
                os.close(egg.fd)
            raise

    def _egg_not_fetched(self, failure, message, slot, claimed):
        """A crawl cannot fetch its egg itself (it holds no database URL): a job whose egg the database could not give
        goes back to the queue; one whose egg is refused (altered in the database) or could not be kept (a full
        disk) fails, with the reason, and nothing runs it."""
        from scrapyd_pgqueue.database.db import DatabaseError

        if self.crawls.stopping and claimed is not None:
            self.unstarted.append(claimed)
            return
        if failure.check(DatabaseError) and claimed is not None:
            log.error("Could not fetch the egg of project {project} for job {job}, handing the job back: {error}",
                      project=message["_project"], job=message["_job"], error=failure.getErrorMessage())
            self.lease_lost_claims.append(claimed)  # handed back once the database answers
            self._get_message(slot)
            return
        self._spawn_crawl(failure, message, slot, claimed)  # recorded as a crawl that could not start

    def _spawn_crawl(self, inputs, message, slot, claimed):
        egg, uid = (None, None) if isinstance(inputs, Failure) else inputs
        try:
            self._start_crawl(inputs, egg, uid, message, slot, claimed)
        finally:
            if egg is not None:
                os.close(egg.fd)  # the spawner or the warm process holds its own copy

    def _start_crawl(self, inputs, egg, uid, message, slot, claimed):
        if self.crawls.stopping:  # the stop began while the egg was fetched
            if claimed is not None:
                self.unstarted.append(claimed)
            return
        project = message["_project"]
        process = PostgresProcessProtocol(project, message["_spider"], message["_job"], {}, [])
        process.claimed = claimed
        process.on_started = self.crawl_started
        process.crawl_stats = CrawlStats(project, message["_spider"])
        try:
            if isinstance(inputs, Failure):
                if inputs.check(EggRefused):
                    raise inputs.value
                raise EggNotKept(f"could not fetch the egg of project {project}: {inputs.getErrorMessage()}")
            environment = self.app.getComponent(IEnvironment)
            message.setdefault("settings", {})
            message["settings"].update(environment.get_settings(message))
            env = environment.get_environment(message, slot)
            env[pgconfig.NODE_NAME_VARIABLE] = self.settings.node_name
            env[JOB_VARIABLE] = message["_job"]
            env[INTERVAL_VARIABLE] = f"{self.settings.stats_interval:g}"  # the crawl's stats (job_stats.py)
            env[EGG_FILE_VARIABLE] = launch.EGG_PATH if egg is not None else ""
            env[launch.LAUNCH_VARIABLE] = str(launch.LAUNCH_FD)
            process.env = crawl_environment(env, self.secrets)
            # Its arguments and its token (crawl trees: the node's endpoint) go in its launch, never its command line.
            process.token = self.crawl_api.admit(project, message["_job"], claimed, spider=message["_spider"])
            process.args = [*spawning.PYTHON, "-m", self.runner, "crawl"]
            process.launch = self._launch(process, environment, message)
            process.uid = uid
            process.deferred.addBoth(self._process_finished, slot)
            if self.warm is None:
                self._spawn_cold(process, egg)
            else:
                self.warm.spawn(process, egg, ours=self.egg_files is not None)  # warm or cold: recorded either way
        except Exception as e:  # noqa: BLE001 - e.g. a job id that is no file name, a spawner gone
            log.error("Could not start job {job}: {error}", job=message["_job"], error=e)
            self.crawl_api.forget(getattr(process, "token", None))
            process.end_time = datetime.datetime.now()
            process.outcome, process.reason = FAILED, f"could not start the crawl: {type(e).__name__}: {e}"
            self.crawls.record(process)
            self._get_message(slot)
            return
        self.processes[slot] = process
        metrics.crawl_started(claimed)

    def _launch(self, process, environment, message) -> dict:
        """What the crawl is told at its start (``crawl_process/launch.py``)."""
        directories = environment.crawl_directories(message)
        return {
            launch.ARGS: get_crawl_args(message), launch.NODE: self.crawl_api.address, launch.TOKEN: process.token,
            launch.DIRECTORIES: directories, launch.LANDLOCK: spawning.boundary().landlock,
            launch.WRITABLE: [*directories, *self.settings.crawl_paths, os.devnull],
        }

    def _spawn_cold(self, process, egg):
        """A new Python running the runner, started by the node's spawner."""
        ours, theirs = relayed.pipes((1, 2, STATS_FD))
        child = relayed.RelayedProcess(process, ours)
        launch_fd = spawning.launch_file(process.launch)
        fds = {**theirs, launch.LAUNCH_FD: launch_fd, **({launch.EGG_FD: egg.fd} if egg is not None else {})}
        try:
            spawning.node_spawner().start(child, process.args, process.env, process.project, process.uid,
                                          uuid.uuid4().hex, fds)
        except OSError:
            child.close_pipes()
            raise
        finally:
            relayed.close_all([*theirs.values(), launch_fd])

    def crawl_started(self, process):
        """The crawl's pid is known (once started by the spawner or forked when warm): its token is its process's
        alone, and the row records it."""
        self.crawl_api.started(process.token, process.pid)
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
        self.crawl_api.forget(process.token)
        if (process.lease_lost or process.warm_parent_died or process.start_timed_out) and process.claimed is not None:
            self.lease_lost_claims.append(process.claimed)
        elif not process.handed_back:
            self.crawls.record(process)
        if not self.crawls.stopping:
            self._get_message(slot)  # always: a failing job storage must not cost the slot
