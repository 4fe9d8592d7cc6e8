"""This node's own counters and histograms, exported by ``/metrics`` (``web/prometheus.py``) with the cluster's gauges.

The poller and launcher count through one-line hooks (``metrics.CLAIMS.inc(n)``). No per-job label: a label's
values are a bounded set (outcomes, operations, the projects' spiders). The node's registry is its own, so a test
process that builds several nodes' components does not collide with the default registry.

The metrics are built, and prometheus_client imported, when the node first counts something or is first scraped:
an idle node that nobody scrapes does not carry the library (about 1 MB of an idle node's memory).
"""

from __future__ import annotations

import threading

# The node's metrics, in the order /metrics exports them.
METRIC_NAMES = ("CLAIMS", "CRAWLS_STARTED", "CRAWLS_ENDED", "SCHEDULE_TO_START", "DATABASE_ERRORS", "ITEMS_SCRAPED",
                "CRAWL_ERRORS", "STATS_LINES_DROPPED", "WEBHOOK_DELIVERIES", "FRONTIER_REQUESTS")
_NAMES = ("REGISTRY", *METRIC_NAMES)
# What the node's listener keeps as it goes (node/notifications.py), exported at each scrape (web/prometheus.py):
# plain values, so that a node holding a listen slot that nobody scrapes does not import prometheus_client for them.
listening = 0  # 1 while the node holds a listen slot
notifications_heard: dict[str, int] = {}  # channel -> NOTIFYs heard
_building = threading.Lock()  # the reactor and the web threads may count first at the same moment


def __getattr__(name: str):
    """``metrics.CLAIMS`` and the others (PEP 562): built together on first use, plain module globals after."""
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _building:
        if "REGISTRY" not in globals():
            globals().update(_build())
    return globals()[name]


def _build() -> dict:
    from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

    disable_created_metrics()  # no *_created series: they double the exposition and no panel reads them
    registry = CollectorRegistry(auto_describe=True)
    built = {
        "REGISTRY": registry,
        "CLAIMS": Counter("scrapyd_pgqueue_claims", "Jobs this node claimed from the queue.", registry=registry),
        "CRAWLS_STARTED": Counter("scrapyd_pgqueue_crawls_started", "Crawl processes this node started.",
                                  registry=registry),
        "CRAWLS_ENDED": Counter(
            "scrapyd_pgqueue_crawls_ended",
            "Crawls this node ran that ended, by outcome (finished, failed, cancelled, timeout, stalled).",
            ["outcome"], registry=registry,
        ),
        "SCHEDULE_TO_START": Histogram(
            "scrapyd_pgqueue_schedule_to_start_seconds",
            "Seconds from when a job was due (its scheduling, or its _run_at) to its claim by this node (database "
            "clock).",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
            registry=registry,
        ),
        "DATABASE_ERRORS": Counter(
            "scrapyd_pgqueue_database_errors", "Database operations of this node that failed, by operation.",
            ["operation"], registry=registry,
        ),
        # From the stats the crawls report (node/crawl_stats.py), as they come: a long crawl counts as it goes.
        "ITEMS_SCRAPED": Counter(
            "scrapyd_pgqueue_items_scraped", "Items scraped by the crawls this node ran, by project and spider.",
            ["project", "spider"], registry=registry,
        ),
        "CRAWL_ERRORS": Counter(
            "scrapyd_pgqueue_crawl_errors", "Log lines at ERROR or above of the crawls this node ran, by project and "
            "spider.", ["project", "spider"], registry=registry,
        ),
        "STATS_LINES_DROPPED": Counter(
            "scrapyd_pgqueue_stats_lines_dropped", "Lines of the crawls' stats descriptors this node dropped: over "
            "256 KiB, or not a stats message.", registry=registry,
        ),
        "WEBHOOK_DELIVERIES": Counter(
            "scrapyd_pgqueue_webhook_deliveries", "Webhook deliveries this node attempted, by outcome (delivered; "
            "failed: retried later; given_up: past webhook_retry_hours).", ["outcome"], registry=registry,
        ),
        # From the frontier steps of the crawls this node runs (node/crawl_api.py): the crawl's pace, summed over nodes.
        "FRONTIER_REQUESTS": Counter(
            "scrapyd_pgqueue_frontier_requests", "Frontier requests of the crawls this node ran, by project, spider "
            "and event (stored, duplicate: found again and dropped, leased, done, failed: past Scrapy's retries).",
            ["project", "spider", "event"], registry=registry,
        ),
    }
    for outcome in ("delivered", "failed", "given_up"):
        built["WEBHOOK_DELIVERIES"].labels(outcome)
    for outcome in ("finished", "failed", "cancelled", "timeout", "stalled"):
        built["CRAWLS_ENDED"].labels(outcome)  # exported at 0 from the start: rate() sees the first increase
    for operation in ("claim", "record", "start", "web"):
        built["DATABASE_ERRORS"].labels(operation)
    return built


def crawl_started(claimed) -> None:
    """Launcher hook: count the crawl, and observe how long its job waited since it was due (from the claim)."""
    __getattr__("CRAWLS_STARTED").inc()
    if claimed is not None and claimed.waited is not None:  # None: not from the queue (another poller)
        __getattr__("SCHEDULE_TO_START").observe(max(0.0, claimed.waited))
