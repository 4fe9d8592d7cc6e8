"""``/metrics``: the Prometheus text format. This node's counters and histograms (``metrics.py``) and the
cluster's gauges, the same on every node (aggregate them with ``max without (instance)``).

The gauges come from bounded queries (``store/overview.py``): per spider and state counted up to ``COUNT_CAP``;
the pending total is exact up to ``PENDING_COUNT_CAP``, the planner's estimate beyond. No per-job label. Unroutable
jobs (pending, requiring tags no live node has) have one gauge per tag set; this node's tags are the label set of
its own gauges (``scrapyd_pgqueue_node_info``, ``scrapyd_pgqueue_node_slots``), to join its counters on ``instance``.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scrapyd_pgqueue.database.db import DatabaseError
from scrapyd_pgqueue.store import PENDING_COUNT_CAP, AllJobsStore, OverviewStore
from scrapyd_pgqueue.store.frontier import FrontierStore
from scrapyd_pgqueue.store.listen_slots import ListenSlotHolders
from scrapyd_pgqueue.store.pools import PoolStore
from scrapyd_pgqueue.web import metrics
from scrapyd_pgqueue.web.page import ThreadedPage

# The states exported per spider: the waiting and running ones (kept finished jobs are a window, not a state).
GAUGE_STATES = ("pending", "delayed", "running")


# The cluster's gauges, the same on every node: name -> (help, labels). Their values are read at each scrape.
CLUSTER_GAUGES = {
    "scrapyd_pgqueue_cluster_up": ("1 when the cluster's gauges could be read.", ()),
    "scrapyd_pgqueue_jobs": ("Jobs by project, spider and state (counted up to 10,000).",
                             ("project", "spider", "state")),
    "scrapyd_pgqueue_pending_jobs": ("Pending jobs of the cluster (estimated beyond 10,000).", ()),
    "scrapyd_pgqueue_running_jobs": ("Running jobs of the cluster.", ()),
    "scrapyd_pgqueue_live_nodes": ("Node processes with a heartbeat within the lease.", ()),
    "scrapyd_pgqueue_delayed_jobs": ("Delayed jobs of the cluster, waiting for their time (counted up to 10,000).",
                                     ()),
    "scrapyd_pgqueue_dead_jobs": ("Jobs out of retries, kept until requeued.", ()),
    "scrapyd_pgqueue_oldest_pending_age_seconds": (
        "Seconds the longest-waiting pending job has waited since it was due; 0: none.", ()),
    "scrapyd_pgqueue_past_due_jobs": (
        "Pending jobs waiting more than past_due_seconds since they were due (counted up to 10,000).", ()),
    "scrapyd_pgqueue_unroutable_jobs": (
        "Pending jobs that no live node can run, by the tags they require (comma-separated; counted up to 10,000 "
        "each).", ("tags",)),
    "scrapyd_pgqueue_frontier_crawls": ("Crawls spread over workers (_workers) with a worker not yet ended, by project "
                                        "and spider.", ("project", "spider")),
    "scrapyd_pgqueue_frontier_workers": ("Workers of those crawls running now, by project and spider.",
                                         ("project", "spider")),
    "scrapyd_pgqueue_frontier_queued_requests": (
        "Requests of those crawls ready in their frontier, by project and spider (counted up to 100,000 a crawl).",
        ("project", "spider")),
    "scrapyd_pgqueue_frontier_in_flight_requests": ("Requests of those crawls held by their workers, by project and "
                                                    "spider.", ("project", "spider")),
    "scrapyd_pgqueue_listening_nodes": ("Nodes that LISTEN now, a listen slot each (at most listen_slots); the "
                                        "others poll.", ()),
    "scrapyd_pgqueue_wanted_nodes": (
        "Nodes of this node's max_proc the queue's work needs now: running jobs and due ones, within the spiders' "
        "limits (what KEDA's ScaledObject asks), at most max_nodes; 0 when idle.", ()),
}
# This node's gauges, labelled with its name and tags (comma-separated, sorted; '' for none).
NODE_GAUGES = {
    "scrapyd_pgqueue_node_info": ("1, labelled with this node's name and tags.", ("node", "tags")),
    "scrapyd_pgqueue_node_slots": ("Crawls this node runs at once (max_proc).", ("node", "tags")),
    "scrapyd_pgqueue_node_listening": ("1 while this node holds a listen slot: it LISTENs, and a new job wakes it at "
                                       "once; 0: it polls (poll_interval).", ("node", "tags")),
}
# This node's counter of the NOTIFYs its listener heard, kept as a plain dict (metrics.notifications_heard).
HEARD = ("scrapyd_pgqueue_notifications_heard", "NOTIFYs this node heard while it held a listen slot, by channel.",
         ("channel",))


def gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """A declared gauge (CLUSTER_GAUGES, NODE_GAUGES), with its one value when it has no labels."""
    documentation, labels = {**CLUSTER_GAUGES, **NODE_GAUGES}[name]
    if labels:
        return GaugeMetricFamily(name, documentation, labels=list(labels))
    return GaugeMetricFamily(name, documentation, value=value)


def documented_metrics() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """Every metric /metrics exports, as (name as exposed, type, help, labels): this node's counters and histogram
    (``metrics.py``), its gauges and the cluster's; the reference page is made from it."""
    exported = []
    for name in metrics.METRIC_NAMES:
        collector = getattr(metrics, name)
        suffix = "_total" if collector._type == "counter" else ""
        exported.append((collector._name + suffix, collector._type, collector._documentation,
                         tuple(collector._labelnames)))
    exported.append((f"{HEARD[0]}_total", "counter", HEARD[1], HEARD[2]))
    for name, (documentation, labels) in {**NODE_GAUGES, **CLUSTER_GAUGES}.items():
        exported.append((name, "gauge", documentation, labels))
    return exported


class ClusterCollector:
    """The cluster's gauges, read once per scrape; ``slots`` is this node's max_proc (for the wanted nodes)."""

    def __init__(self, settings, slots: int):
        self.settings = settings
        self.slots = slots

    def collect(self):
        try:
            families = list(self.cluster_families())
        except DatabaseError:
            metrics.DATABASE_ERRORS.labels("web").inc()
            families = []
        yield gauge("scrapyd_pgqueue_cluster_up", 1 if families else 0)
        yield from node_families(self.settings, self.slots)
        yield from families

    def cluster_families(self):
        cluster = AllJobsStore.for_settings(self.settings)
        overview = OverviewStore.for_settings(self.settings)
        counts = cluster.cluster_counts(self.settings.lease_seconds, self.settings.past_due_seconds)
        jobs = gauge("scrapyd_pgqueue_jobs")
        for depth in overview.depth_by_spider():
            for state in GAUGE_STATES:
                if state in depth.counts:
                    jobs.add_metric([depth.project, depth.spider, state], depth.counts[state])
        yield jobs
        yield gauge("scrapyd_pgqueue_pending_jobs", counts.pending)
        yield gauge("scrapyd_pgqueue_running_jobs", counts.running)
        yield gauge("scrapyd_pgqueue_live_nodes", counts.nodes)
        yield gauge("scrapyd_pgqueue_delayed_jobs", counts.delayed)
        yield gauge("scrapyd_pgqueue_dead_jobs", counts.dead)
        yield gauge("scrapyd_pgqueue_oldest_pending_age_seconds", max(overview.oldest_pending_age() or 0.0, 0.0))
        yield gauge("scrapyd_pgqueue_past_due_jobs", counts.past_due)
        unroutable = gauge("scrapyd_pgqueue_unroutable_jobs")
        for pool in PoolStore.for_settings(self.settings).unroutable(self.settings.lease_seconds, PENDING_COUNT_CAP):
            unroutable.add_metric([",".join(pool.tags)], pool.jobs)
        yield unroutable
        yield from frontier_families(FrontierStore.for_settings(self.settings).open_crawls())
        yield gauge("scrapyd_pgqueue_listening_nodes", len(ListenSlotHolders.for_settings(self.settings).holders()))
        yield gauge("scrapyd_pgqueue_wanted_nodes", overview.wanted_nodes(self.slots, self.settings.max_nodes))


def frontier_families(crawls):
    """The frontier's gauges: the open crawls summed per project and spider."""
    families = {name: gauge(f"scrapyd_pgqueue_frontier_{name}")
                for name in ("crawls", "workers", "queued_requests", "in_flight_requests")}
    totals: dict[tuple[str, str], list[int]] = {}
    for crawl in crawls:
        total = totals.setdefault((crawl.project, crawl.spider), [0, 0, 0, 0])
        for index, count in enumerate((1, crawl.running, crawl.queued, crawl.in_flight)):
            total[index] += count
    for labels, total in totals.items():
        for family, count in zip(families.values(), total):
            family.add_metric(list(labels), count)
    yield from families.values()


def node_families(settings, slots: int):
    """This node's gauges, labelled with its name and tags."""
    values = [settings.node_name, ",".join(settings.node_tags)]
    info = gauge("scrapyd_pgqueue_node_info")
    info.add_metric(values, 1)
    yield info
    node_slots = gauge("scrapyd_pgqueue_node_slots")
    node_slots.add_metric(values, slots)
    yield node_slots
    listening = gauge("scrapyd_pgqueue_node_listening")
    listening.add_metric(values, metrics.listening)
    yield listening
    heard = CounterMetricFamily(HEARD[0], HEARD[1], labels=HEARD[2])
    for channel, count in sorted(metrics.notifications_heard.copy().items()):
        heard.add_metric([channel], count)
    yield heard


class MetricsPage(ThreadedPage):
    content_type = CONTENT_TYPE_LATEST.encode()

    def build(self, request) -> bytes:
        cluster = CollectorRegistry(auto_describe=False)
        cluster.register(ClusterCollector(self.root.settings, self.root.launcher.max_proc))
        return generate_latest(metrics.REGISTRY) + generate_latest(cluster)
