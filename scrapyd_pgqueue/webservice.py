"""Scrapyd's job services for the whole cluster now live in ``services/jobs.py``; this path stays for configurations."""

from scrapyd_pgqueue.services.jobs import (  # noqa: F401
    Alive,
    Cancel,
    DaemonStatus,
    ListJobs,
    Logs,
    Schedule,
    ScheduleBatch,
    Status,
)
from scrapyd_pgqueue.services.resource import ClusterResource  # the services' base, by its former name

__all__ = [
    "Alive", "Cancel", "ClusterResource", "DaemonStatus", "ListJobs", "Logs", "Schedule", "ScheduleBatch", "Status",
]
