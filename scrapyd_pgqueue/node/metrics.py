"""This node's own counters and histograms, exported by ``/metrics`` (``web/prometheus.py``) with the cluster's gauges.

The poller and launcher count through one-line hooks (``metrics.CLAIMS.inc(n)``). No per-job labels: a label's
values are a bounded set (outcomes, operations). The node's registry is its own, so a test process that builds
several nodes' components does not collide with the default registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

disable_created_metrics()  # no *_created series: they double the exposition and no panel reads them

REGISTRY = CollectorRegistry(auto_describe=True)

CLAIMS = Counter("scrapyd_pgqueue_claims", "Jobs this node claimed from the queue.", registry=REGISTRY)
CRAWLS_STARTED = Counter("scrapyd_pgqueue_crawls_started", "Crawl processes this node started.", registry=REGISTRY)
CRAWLS_ENDED = Counter(
    "scrapyd_pgqueue_crawls_ended", "Crawls this node ran that ended, by outcome (finished, failed, cancelled).",
    ["outcome"], registry=REGISTRY,
)
SCHEDULE_TO_START = Histogram(
    "scrapyd_pgqueue_schedule_to_start_seconds",
    "Seconds from when a job was due (its scheduling, or its _run_at) to its claim by this node (database clock).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
    registry=REGISTRY,
)
DATABASE_ERRORS = Counter(
    "scrapyd_pgqueue_database_errors", "Database operations of this node that failed, by operation.",
    ["operation"], registry=REGISTRY,
)
for _outcome in ("finished", "failed", "cancelled"):
    CRAWLS_ENDED.labels(_outcome)  # exported at 0 from the start: rate() sees the first increase
for _operation in ("claim", "record", "start", "web"):
    DATABASE_ERRORS.labels(_operation)


def crawl_started(claimed) -> None:
    """Launcher hook: count the crawl, and observe how long its job waited since it was due (from the claim)."""
    CRAWLS_STARTED.inc()
    if claimed is not None and claimed.waited is not None:  # None: not from the queue (another poller)
        SCHEDULE_TO_START.observe(max(0.0, claimed.waited))
