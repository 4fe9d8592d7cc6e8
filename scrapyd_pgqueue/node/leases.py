"""A node's lease on the jobs it runs: renewed by a thread of its own, and what happens when it cannot be.

``LeaseKeeper`` sends the node's tick every heartbeat: it renews the lease, recovers other nodes' expired leases
(only after a whole lease of prompt heartbeats of its own: a stall is not a death), hands back forgotten claims and
reads what the node must learn from the cluster, all in one statement (``JobStore.node_tick``); ``LeaseWatch``
(``on_lease_lost = stop``) stops this node's crawls before its lease can expire. Used by ``PostgresLauncher``, which
gives them its crawls (``contracts.INodeCrawls``);
threads, not the reactor, which may be busy for seconds (a launcher's work, Twisted's own). The keeper's statements
never go through the node's pool: requests, finishes and maintenance holding every pooled connection cannot delay a
heartbeat. They ride the listener's connection, which idles between notifications (``db.lease_engine_for_settings``),
or, with ``listen_notify`` off, a connection of their own.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

from twisted.internet import reactor
from twisted.logger import Logger

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import INodeCrawls
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.node import crawl_stats
from scrapyd_pgqueue.store import JobStore

log = Logger()

# A claim this old that the node runs no crawl for was lost on its way back (the connection died after the commit):
# far longer than a claim can take (connect and statement timeouts), so a claim still on its way is never taken.
FORGOTTEN_CLAIM_AGE = datetime.timedelta(seconds=60)
# A tick recovers other nodes' leases only when this node's previous heartbeat is at most this many heartbeat
# intervals old on the database's clock: one sent before a stall and run after it recovers nothing.
PROMPT_HEARTBEATS = 2


class LeaseKeeper(threading.Thread):
    """Renews this process's lease every ``heartbeat_interval`` and recovers other processes' expired leases.

    A thread of its own, not the reactor: the reactor can be busy for seconds while the node's crawls run on (it
    starts and records crawls, and a slow request's answer is written there), and that must not cost the node
    its jobs. A stopping node keeps its lease until it has handed its jobs back, and recovers
    nobody's.

    A stall is not a death. A heartbeat is *prompt* when it completes within one heartbeat interval (it is given
    no longer); one that fails, or is slow, means the database (or the path to it) stalled, and then every other
    node's heartbeat was held up just the same. So this node recovers other nodes' jobs only once its own
    heartbeats have been prompt without a break for a whole lease: any node that is alive has beaten again within
    that lease (the interval is much shorter), and only nodes that are really gone lose their jobs, whether the
    database was down, stalled for longer than the lease, or this node itself was cut off.

    ``on_lease_lost = stop``: measured on this node's monotonic clock from the *start* of its last successful
    heartbeat (the database stamped the lease after that), a node that has not renewed its lease for
    ``stop_deadline`` seconds sends its crawls SIGTERM, and SIGKILL ``stop_timeout`` later, which is
    ``lease_margin`` (two heartbeat intervals) before any other node may take the jobs over.
    """

    def __init__(self, settings, crawls: INodeCrawls, learn, *, url: str, max_proc: int):
        """``learn(tick, read_at)``: the reactor acts on what a tick read; ``url`` and ``max_proc``: the node's row,
        written again when the tick finds it gone."""
        super().__init__(name="pgqueue-lease", daemon=True)
        self.crawls, self.learn = crawls, learn
        self.url, self.max_proc = url, max_proc
        self.settings = settings
        self.store = JobStore(db.lease_engine_for_settings(self.settings))  # a connection the node's work never holds
        self.stopping = threading.Event()
        self.healthy_since: float | None = None  # monotonic start of the unbroken run of prompt heartbeats
        self.renewed_at = time.monotonic()  # start of the last successful heartbeat (registration counts)
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))
        self.told: set[int] = set()  # jobs already reported taken over

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        interval = self.settings.heartbeat_interval
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                with db.deadline(interval):
                    self.beat(started)
            except Exception as e:  # noqa: BLE001 - the database is away or stalled: try again next beat
                self.healthy_since = None
                self.trouble.report(f"Heartbeat failed: {e}", key="heartbeat")
            self.stopping.wait(max(0.0, interval - (time.monotonic() - started)))

    def beat(self, started: float) -> None:
        """One tick (``JobStore.node_tick``): renew the lease, recover expired ones when this node has been healthy
        for a whole lease, hand back forgotten claims, write the running crawls' changed stats, and hand what it
        learned to the reactor."""
        crawls, settings = self.crawls, self.settings
        healthy = self.healthy_since is not None and not crawls.stopping
        stats = crawl_stats.stats_due(crawls.running(), settings.stats_interval)
        tick = self.store.node_tick(
            worker=pgconfig.WORKER_ID, lease_seconds=settings.lease_seconds, max_attempts=settings.max_attempts,
            recover=healthy and started - self.healthy_since >= settings.lease_seconds,
            release=healthy, known_ids=crawls.known_claim_ids(),
            claimed_before=datetime.datetime.now() - FORGOTTEN_CLAIM_AGE,
            prompt_seconds=PROMPT_HEARTBEATS * settings.heartbeat_interval,
            stats=[(claimed, job_stats) for claimed, _, job_stats in stats],
        )
        if tick.stats_written is not None:
            crawl_stats.written(stats)
        if not tick.registered:
            self.store.register_node(
                worker=pgconfig.WORKER_ID, name=settings.node_name, url=self.url, max_proc=self.max_proc,
                tags=settings.node_tags,
            )
        now = time.monotonic()
        self.renewed_at = started
        reactor.callFromThread(self.learn, tick, started)
        if now - started > settings.heartbeat_interval:  # not prompt: the database stalled
            self.healthy_since = None
            return
        if self.healthy_since is None:
            self.healthy_since = started
            self.trouble.clear("heartbeat")
            self.report_jobs_taken_over()

    def report_jobs_taken_over(self) -> None:
        """After a break: say, once per job, which of this node's crawls another node took over meanwhile."""
        claims = [crawl.claimed for crawl in self.crawls.held()
                  if crawl.claimed is not None and crawl.claimed.id not in self.told]
        for job in self.store.claims_taken_over(claims, worker=pgconfig.WORKER_ID):
            self.told.add(job.id)
            where = {
                "ongoing": f"{job.node} runs it now",
                "pending": "it waits to run again",
            }.get(job.status, f"it ended as {job.outcome} on {job.node}")
            log.warn("Job {job} of project {project} ran on {node} after its lease expired; {where}",
                     job=job.job, project=job.project, node=self.settings.node_name, where=where)


class LeaseWatch(threading.Thread):
    """``on_lease_lost = stop``: stops this node's crawls before its lease can expire (see LeaseKeeper).

    A thread of its own that signals the crawl processes directly: neither the reactor nor the heartbeat thread
    (blocked for one heartbeat by a database that does not answer) may hold it up.
    """

    CHECK_EVERY = 0.25

    def __init__(self, settings, crawls: INodeCrawls, keeper: LeaseKeeper):
        super().__init__(name="pgqueue-lease-watch", daemon=True)
        self.crawls = crawls
        self.keeper = keeper
        self.settings = settings
        self.stopping = keeper.stopping

    def run(self) -> None:
        term_at, kill_at = self.settings.stop_deadline, self.settings.stop_deadline + self.settings.stop_timeout
        signalled = None
        while not self.stopping.wait(self.CHECK_EVERY):
            silent = time.monotonic() - self.keeper.renewed_at
            if silent < term_at:
                signalled = None
            elif signalled is None:
                signalled = "TERM"
                self.signal_crawls(signal.SIGTERM, silent)
            elif signalled == "TERM" and silent >= kill_at:
                signalled = "KILL"
                self.signal_crawls(signal.SIGKILL, silent)

    def signal_crawls(self, signum: int, silent: float) -> None:
        for process in self.crawls.running():
            process.lease_lost = True  # before the signal: its end is then not recorded, its job handed back
            if process.pid is None:
                continue
            log.warn("Lease not renewed for {silent:.0f}s (on_lease_lost = stop): sending {signal} to the crawl of "
                     "job {job} of project {project}; it goes back to the queue once the database answers",
                     silent=silent, signal=signal.Signals(signum).name, job=process.job, project=process.project)
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass
