"""IJobStorage over the shared ``spider_job`` table: finished jobs of the whole cluster.

Never stores ``job.env``: it is a copy of the node's environment, database password included.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from zope.interface import implementer

from scrapyd.interfaces import IJobStorage
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.models import FINISHED
from scrapyd_pgqueue.store import JobStore


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


@implementer(IJobStorage)
class PostgresJobStorage:
    def __init__(self, config):
        settings = pgconfig.settings(config)
        self.store = JobStore.for_url(settings.database_url)
        self.node = settings.node_name
        self.finished_to_keep = settings.finished_to_keep

    def add(self, job):
        # A job from our launcher carries its claim, so a late finish cannot overwrite a newer attempt.
        self.store.finish_job(
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
        )
        self.store.prune_terminated(self.finished_to_keep)

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
                start_time=row.start_time,
                end_time=row.end_time,
                pid=row.pid,
                node=row.node,
                outcome=row.outcome,
                exit_code=row.exit_code,
                reason=row.reason,
            )
