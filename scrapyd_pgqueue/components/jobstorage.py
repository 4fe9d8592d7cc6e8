"""IJobStorage over the shared ``spider_job`` table: finished jobs of the whole cluster.

Never stores ``job.env``: it is a copy of the node's environment, database password included. Stores the tail of
each finished job's log (``log_max_bytes``), so that every node can serve it (``Logs`` in ``services/jobs.py``).

A finish is written on its own (``record``); pruning and vacuuming after it (``tidy``) never undo or fail it: a
finish stays written whatever the prune does (a role without DELETE, a prune past ``statement_timeout``).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field

from scrapyd.exceptions import DirectoryTraversalError
from scrapyd.utils import get_file_path
from twisted.logger import Logger
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import IRecordingJobStorage
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.store import AllJobsStore, JobStore, QueueMaintenance, local_time
from scrapyd_pgqueue.store.statuses import FINISHED
from scrapyd_pgqueue.web.log_files import read_log_tail

log = Logger()

# Seconds finishes skip pruning after a prune failed: one failing prune a minute, not one (and its wait) per finish.
PRUNE_RETRY_SECONDS = 60.0


@dataclass
class FinishedJob:
    """What Scrapyd's web services read of a finished job (the attributes of ScrapyProcessProtocol)."""

    project: str
    spider: str
    job: str
    start_time: datetime.datetime | None
    end_time: datetime.datetime | None
    pid: int | None = None
    node: str | None = None
    outcome: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    args: list = field(default_factory=list)
    env: dict = field(default_factory=dict)


@implementer(IRecordingJobStorage)
class PostgresJobStorage:
    def __init__(self, config):
        settings = pgconfig.settings(config)
        self.store = JobStore.for_settings(settings)
        self.node = settings.node_name
        self.finished_to_keep = settings.finished_to_keep
        self.dead_to_keep = settings.dead_to_keep
        self.all_jobs_store = AllJobsStore.for_settings(settings)
        self.logs_dir = config.get("logs_dir", "logs") if config is not None else ""
        self.log_max_bytes = settings.log_max_bytes
        self.maintenance = QueueMaintenance.for_settings(settings)
        self.next_prune = 0.0  # monotonic: no prune before (set after a failed one)
        self.trouble = ThrottledLog(lambda message: log.error("{message}", message=message))

    def add(self, job):
        """Record a finished job (raises when it is not written), then prune and vacuum (which never raise)."""
        self.record(job)
        self.tidy()

    def record(self, job):
        """Write a finished job's row and log; raises when the finish is not written (the caller retries it). ``job``
        is a launcher's process protocol: Scrapyd's knows no claim, outcome or stats (read with defaults)."""
        claimed = getattr(job, "claimed", None)
        if claimed is not None:
            self.save_log(job)  # first: once any node reports the job finished, its log is there to serve
        # A job from our launcher carries its claim, so a late finish cannot overwrite a newer attempt.
        recorded = self.store.finish_job(
            project=job.project,
            spider=job.spider,
            job=job.job,
            start_time=job.start_time,
            end_time=job.end_time,
            outcome=getattr(job, "outcome", None) or FINISHED,
            exit_code=getattr(job, "exit_code", None),
            reason=getattr(job, "reason", None),
            pid=job.pid,
            node=self.node,
            claimed=getattr(job, "claimed", None),
            worker=pgconfig.WORKER_ID,
            stats=getattr(getattr(job, "crawl_stats", None), "stats", None),  # what the crawl reported last
        )
        if not recorded:
            log.warn("Job {job} of project {project} ended here, but this node's lease on it expired and another "
                     "attempt took it over: its result is not recorded", job=job.job, project=job.project)
        if claimed is None:
            self.save_log(job)  # a job known by its id only: its row may exist only now

    def tidy(self):
        """Prune the finished jobs beyond ``finished_to_keep``, then vacuum when due. Never raises: the finishes
        before it are written already; a failing prune is said once with a count and tried again a minute later."""
        if time.monotonic() >= self.next_prune:
            try:
                self.store.prune_terminated(self.finished_to_keep, self.dead_to_keep)
            except Exception as e:  # noqa: BLE001 - whatever it is, it must not cost a finish
                self.next_prune = time.monotonic() + PRUNE_RETRY_SECONDS
                self.trouble.report(f"Could not prune the finished jobs beyond finished_to_keep "
                                    f"({self.finished_to_keep}), trying again in a minute: {e}", key="prune")
            else:
                self.trouble.clear("prune")
        self.maintenance.vacuum_when_due()  # the nodes that make dead rows clear them (autovacuum is too rare)

    def save_log(self, job):
        """Store the tail of the job's log file, if this node has one; a retried ``add`` stores it again."""
        if not self.logs_dir or self.log_max_bytes <= 0:
            return
        try:
            path = get_file_path(self.logs_dir, job.project, job.spider, f"{job.job}.log").path
            size, tail = read_log_tail(path, self.log_max_bytes)
        except (OSError, DirectoryTraversalError):
            return  # no log (the crawl never started), or not a regular file of its own
        if size > len(tail):
            tail = (f"[first {size - len(tail)} of {size} bytes left out (log_max_bytes); the whole log is in "
                    f"logs_dir on node {self.node}]\n").encode() + tail
        self.all_jobs_store.save_log(
            project=job.project, job=job.job, log=tail, size=size, claimed=getattr(job, "claimed", None),
            worker=pgconfig.WORKER_ID,
        )

    def list(self):
        return list(self)

    def __len__(self):
        return min(self.store.count_terminated(), self.finished_to_keep)

    def __iter__(self):
        for row in self.store.list_terminated(self.finished_to_keep):
            yield FinishedJob(
                project=row.project,
                spider=row.spider,
                job=row.job,
                start_time=local_time(row.start_time),
                end_time=local_time(row.end_time),
                pid=row.pid,
                node=row.node,
                outcome=row.outcome,
                exit_code=row.exit_code,
                reason=row.reason,
            )
