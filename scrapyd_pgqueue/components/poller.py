"""IPoller for a shared queue: one global claim per tick, woken at once by NOTIFY, never stalls.

Scrapyd's QueuePoller walks projects, counts each queue every tick and stops for good the first time a
shared queue's ``pop()`` returns None or raises. This poller claims as many jobs as the node has free slots,
across every project it can run, in one statement in global priority order; a tick with nothing to do is
one index probe, whatever the number of projects. Delayed jobs are claimed on time: each claim says when the next
one is due, and the poller claims again then (the claim makes them pending; the NOTIFY it sends wakes every node).
"""

from __future__ import annotations

from scrapyd.utils import get_spider_queues
from twisted.internet import defer, threads
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import IClaimingPoller
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.node import notifications
from scrapyd_pgqueue.node.periodic import PeriodicFirer
from scrapyd_pgqueue.store import NOTIFY_CHANNEL, Claim, ClaimedJob, JobStore
from scrapyd_pgqueue.web import metrics

log = Logger()


@implementer(IClaimingPoller)
class PostgresPoller:
    def __init__(self, config):
        self.config = config
        self.settings = pgconfig.settings(config)
        self.store = JobStore.for_settings(self.settings)
        self.dq = defer.DeferredQueue()
        self.claims: dict[tuple[str, str], ClaimedJob] = {}  # handed to the launcher with each message
        self.claiming = False
        self.claim_again = False
        self.accepting = True
        self.listening = False
        self.claim_errors = ThrottledLog(lambda message: log.error("{message}", message=message))
        self.due_timer = None  # a claim at the time the next delayed job is due
        self.periodic: PeriodicFirer | None = None  # started with the listener, at the first poll
        self.wants_work: bool | None = None  # as last said to the cluster (scrapyd_node.wants_work); None: unsaid
        self.update_projects()

    def update_projects(self):
        self.queues = get_spider_queues(self.config)

    def next(self):
        """A Deferred fired with the next message for a free process slot (called once per free slot)."""
        from twisted.internet import reactor

        waiting = self.dq.get()
        reactor.callLater(0, self.poll)  # a slot just freed: fill it now, not at the next tick
        return waiting

    def poll(self):
        """Claim jobs for the free slots. Never fails: an error is logged and the next tick tries again.

        The TimerService stops calling poll() for good once a returned Deferred fails (Scrapyd's own poller
        dies that way), so whatever goes wrong ends in the last errback here.
        """
        if self.claiming:  # a claim is under way: run one more after it, it may have missed new jobs
            self.claim_again = True
            return None
        self.claiming = True
        claiming = defer.maybeDeferred(self._claim).addBoth(self._claimed)
        return claiming.addErrback(
            lambda failure: log.failure("Unexpected error while polling, trying again next tick", failure)
        )

    def _claim(self):
        if not self.listening:
            self.start_listening()
        free_slots = len(self.dq.waiting) if self.accepting else 0
        projects = list(self.queues)
        if not free_slots or not projects:
            return defer.succeed(Claim([], 0, None))  # nothing to fill: no claim, no timer
        return threads.deferToThread(
            self.store.claim_next_jobs,
            projects,
            free_slots,
            node=self.settings.node_name,
            worker=pgconfig.WORKER_ID,
            tags=self.settings.node_tags,
        )

    def _claimed(self, result):
        self.claiming = False
        claim_again, self.claim_again = self.claim_again, False
        if isinstance(result, Failure):
            metrics.DATABASE_ERRORS.labels("claim").inc()
            self.claim_errors.report(f"Claiming jobs failed, trying again every tick: {result.getErrorMessage()}",
                                     key="claim")
            return None  # no immediate retry: a database that is away would be hammered
        self.claim_errors.clear("claim")
        # Jobs that became due were claimable by this same claim; when more were due than one claim promotes, the
        # next due time is in the past and the timer claims again at once.
        self.claim_when_due(result.next_due_in)
        for claimed in result.jobs:
            metrics.CLAIMS.inc()
            message = dict(claimed.message)
            message["_project"] = claimed.project
            message["_spider"] = message.pop("name")
            message.setdefault("_job", claimed.job)
            self.claims[(claimed.project, message["_job"])] = claimed
            self.dq.put(message)
        if claim_again:
            return self.poll()
        self.say_whether_wanting()
        return None

    def say_whether_wanting(self) -> None:
        """Tell the cluster, when it changes, whether this node wants work (free slots left after a claim): a new job
        sends a NOTIFY only while some node does. A node that starts wanting claims once more after saying so, since
        a job enqueued between its claim and its word woke nobody. The node's listener holds a listen slot (it
        LISTENs) only meanwhile."""
        wants = self.accepting and bool(self.dq.waiting) and self.hears_notify()
        if self.settings.listen_notify:
            notifications.listener_for(self.settings).want_slot(wants)
        if wants == self.wants_work:
            return
        self.wants_work = wants
        said = threads.deferToThread(self.store.set_wants_work, pgconfig.WORKER_ID, wants)
        said.addCallbacks(lambda _: self.poll() if wants else None, self._not_said)

    def _not_said(self, failure: Failure) -> None:
        self.wants_work = None  # said again after the next claim
        self.claim_errors.report(f"Telling the cluster this node wants work failed: {failure.getErrorMessage()}",
                                 key="wants_work")

    def hears_notify(self) -> bool:
        """Whether a NOTIFY reaches this node (off, or poll-only behind a transaction pooler: waking it is useless)."""
        return self.settings.listen_notify and not notifications.listener_for(self.settings).poll_only.is_set()

    def claim_when_due(self, seconds: float | None) -> None:
        """Claim again when the next delayed job is due (the regular tick stays the floor)."""
        from twisted.internet import reactor

        if self.due_timer is not None and self.due_timer.active():
            self.due_timer.cancel()
        self.due_timer = None
        if seconds is not None and seconds < self.settings.poll_interval and self.accepting:
            self.due_timer = reactor.callLater(max(seconds, 0.0) + 0.01, self.poll)

    def take_claim(self, message) -> ClaimedJob | None:
        """The claim behind a message this poller handed out (the launcher makes its writes conditional on it)."""
        return self.claims.pop((message["_project"], message["_job"]), None)

    def claimed_ids(self) -> set[int]:
        """Any thread: the claims handed out and not taken yet (a copy: the reactor changes the original)."""
        return {claimed.id for claimed in self.claims.copy().values()}

    def periodic_due_in(self, seconds: float | None) -> None:
        """Reactor thread: when the tick says the next periodic job is due (a poller not polled yet fires none)."""
        if self.periodic is not None:
            self.periodic.due_in(seconds)

    # --- wake-up ---------------------------------------------------------------------------------------------

    def start_listening(self):
        """Start a claim as soon as any node enqueues a job, instead of at the next tick (the node's one listener;
        it falls back to polling alone where LISTEN cannot work, behind a transaction pooler)."""
        from twisted.internet import reactor

        self.listening = True
        self.periodic = PeriodicFirer(self.settings).start()  # fires the cluster's due periodic jobs (any node)
        if not self.settings.listen_notify:
            return

        def wake(*_):
            if self.accepting:
                reactor.callFromThread(self.poll)

        notifications.listener_for(self.settings).subscribe(NOTIFY_CHANNEL, wake, on_reconnect=wake)

    def stop(self):
        """Stop claiming (graceful shutdown); notifications are then ignored."""
        self.accepting = False
        if self.listening and self.settings.listen_notify:
            notifications.listener_for(self.settings).want_slot(False)  # handed on before the node is gone
        if self.periodic is not None:
            self.periodic.stop()
