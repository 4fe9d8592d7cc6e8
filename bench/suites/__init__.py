"""The registry of suites: THE EXTENSION POINT.

A suite is a module with ``SUMMARY``, ``SERIES`` (the series names its result always holds), and three
functions: ``run(ctx) -> dict``, ``format_table(result) -> str`` and ``plot(result, directory) -> list[Path]``.
``run`` returns ``{"parameters", "series", "ratios", "targets", "notes"}``; the runner adds timing, writes the
JSON, prints the table and draws the plots. A suite whose ``run`` is None is planned: listed, never run.

To add a suite: write ``bench/suites/<name>.py`` (or a package ``bench/suites/<name>/`` whose ``__init__`` holds
those names) with that contract and add one ``Suite`` line to ``SUITES``.
"wakeup" and "idle" were registered here as planned suites before they were written.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from bench.suites import (
    bulk,
    churn,
    crawlstart,
    delayed,
    depth,
    frontier,
    frontierstore,
    idle,
    idlenode,
    notify,
    scale,
    soak,
    throughput,
    tickstats,
    wakeup,
    warmstart,
)


@dataclass(frozen=True)
class Suite:
    name: str
    module: ModuleType

    @property
    def summary(self) -> str:
        return self.module.SUMMARY

    @property
    def series(self) -> tuple[str, ...]:
        return self.module.SERIES

    @property
    def implemented(self) -> bool:
        return self.module.run is not None


# In the order they run. Throughput first: it needs the quietest machine.
SUITES = [
    Suite("throughput", throughput),
    Suite("depth", depth),
    Suite("churn", churn),
    Suite("delayed", delayed),
    Suite("wakeup", wakeup),
    Suite("idle", idle),
    Suite("idlenode", idlenode),
    Suite("tickstats", tickstats),
    Suite("crawlstart", crawlstart),
    Suite("warmstart", warmstart),
    # Starts one real node and, when installed, a redis-server and scrapy-redis workers.
    Suite("frontier", frontier),
    Suite("bulk", bulk),
    Suite("frontierstore", frontierstore),
    # Starts its own Postgres (max_connections above 1,000 listening sessions) and one real node.
    Suite("notify", notify),
    # Starts its own Postgres and PgBouncer, 100 real Scrapyd nodes twice and up to 1,000 simulated ones: last.
    Suite("scale", scale),
    # Starts its own Postgres (autovacuum off) and 3 real nodes for 15 minutes, one SIGKILLed every 3: after scale.
    Suite("soak", soak),
]

SUITES_BY_NAME = {suite.name: suite for suite in SUITES}


def implemented() -> list[Suite]:
    return [suite for suite in SUITES if suite.implemented]
