"""The periodic-job services now live in ``services/schedules.py``; this path stays for configurations."""

from scrapyd_pgqueue.services.schedules import (  # noqa: F401
    AddPeriodic,
    DelPeriodic,
    ListPeriodic,
    PausePeriodic,
    ResumePeriodic,
)

__all__ = ["AddPeriodic", "DelPeriodic", "ListPeriodic", "PausePeriodic", "ResumePeriodic"]
