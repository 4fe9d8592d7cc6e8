"""Deprecated alias of ``services/schedules.py`` (the periodic-job services), kept for configurations."""

from scrapyd_pgqueue import deprecated_names

_NAMES = ("AddPeriodic", "DelPeriodic", "ListPeriodic", "PausePeriodic", "ResumePeriodic")
__getattr__ = deprecated_names(__name__, {name: f"scrapyd_pgqueue.services.schedules.{name}" for name in _NAMES})
__all__ = list(_NAMES)
