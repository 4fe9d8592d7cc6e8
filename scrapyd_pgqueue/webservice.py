"""Deprecated alias of ``services/jobs.py`` (Scrapyd's job services for the whole cluster), kept for
configurations that name it."""

from scrapyd_pgqueue import deprecated_names

_NAMES = ("Alive", "Cancel", "DaemonStatus", "ListJobs", "Logs", "Schedule", "ScheduleBatch", "Status")
_NEW_PATHS = {name: f"scrapyd_pgqueue.services.jobs.{name}" for name in _NAMES}
_NEW_PATHS["ClusterResource"] = "scrapyd_pgqueue.services.resource.DatabaseService"  # the services' base, renamed
__getattr__ = deprecated_names(__name__, _NEW_PATHS)
__all__ = list(_NEW_PATHS)
