"""``/dashboard``: the cluster at a glance, on every node; refreshes itself every ``REFRESH_SECONDS``.

A list of sections, each a query (run in the page's thread) and a renderer: a new view of the cluster is one more
``Section``. Every query is bounded whatever the backlog (see
``store/overview.py``); every value from users is escaped.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scrapyd_pgqueue.database import clock
from scrapyd_pgqueue.store import COUNT_CAP, AllJobsStore, OverviewStore, ScheduleStore, local_time
from scrapyd_pgqueue.store.frontier import MAX_OPEN_CRAWLS, QUEUED_COUNT_CAP, FrontierStore
from scrapyd_pgqueue.web.jobs import crawl_link
from scrapyd_pgqueue.web.page import ThreadedPage, document, esc, int_parameter, no_microseconds, quoted_log_path
from scrapyd_pgqueue.web.svg import minute_chart

REFRESH_SECONDS = 10
DEFAULT_HOURS, MAX_HOURS = 3, 48
FAILURES_SHOWN = 20
# Columns of the depth table, in this order, each shown when some spider has such jobs (running always).
DEPTH_STATES = ("pending", "delayed", "running", "finished", "failed", "cancelled", "lost", "interrupted", "dead",
                "timeout", "stalled")
ALWAYS_SHOWN = ("pending", "running")
# Outcomes charted as failures: the job did not end well.
FAILED_OUTCOMES = ("failed", "lost", "interrupted", "dead", "timeout", "stalled")

STYLE = """
    .summary span { display: inline-block; margin-right: 1.5rem; }
    td.number { text-align: right; }
    .live { color: #070; } .silent { color: #b00; } .stopped { color: #777; }
    figure.chart { margin: 0 0 1rem 0; }
"""


@dataclass(frozen=True)
class View:
    """What a renderer needs besides its data."""

    base: str
    now: datetime.datetime
    hours: int
    settings: Any


@dataclass(frozen=True)
class Section:
    title: str
    fetch: Callable[[AllJobsStore, OverviewStore, View], Any]
    render: Callable[[Any, View], str]


def fetch_summary(cluster, overview, view):
    return cluster.cluster_counts(view.settings.lease_seconds, view.settings.past_due_seconds), \
        overview.oldest_pending_age()


def render_summary(data, view) -> str:
    counts, oldest_age = data
    pending = f"{counts.pending:,}" + ("" if counts.pending_exact else " (estimated)")
    age = no_microseconds(datetime.timedelta(seconds=oldest_age)) if oldest_age is not None else "none waiting"
    return f"""<p class="summary">
<span>Live nodes: <b id="live-nodes">{counts.nodes}</b></span>
<span>Pending: <b id="pending-total">{pending}</b></span>
<span>Delayed: <b id="delayed-total">{count_text(counts.delayed)}</b></span>
<span>Running: <b id="running-total">{counts.running}</b></span>
<span>Oldest pending: <b id="oldest-pending">{esc(age)}</b></span>
<span>Past due ({view.settings.past_due_seconds:g} s): <b id="past-due">{count_text(counts.past_due)}</b></span>
<span>Dead: <b id="dead-total">{counts.dead:,}</b></span>
<span>Unroutable (no live node has their tags): <b id="unroutable-total">{count_text(counts.unroutable)}</b></span>
</p>"""


def fetch_nodes(cluster, overview, view):
    return cluster.nodes(lease_seconds=view.settings.lease_seconds)


def render_nodes(nodes, view) -> str:
    rows = []
    for node in nodes:
        slots = node.max_proc or 0
        rows.append(
            f'<tr class="node"><td>{esc(node.name)}</td><td class="{esc(node.state)}">{esc(node.state)}</td>'
            f"<td>{node.heartbeat_age:.1f} s ago</td><td class=\"number\">{node.running}</td>"
            f'<td class="number">{max(slots - node.running, 0)}</td><td>{esc(node.url)}</td>'
            f"<td>{esc(','.join(node.tags))}</td></tr>"
        )
    return table("nodes", ["Node", "State", "Last heartbeat", "Slots used", "Slots free", "URL", "Tags"], rows,
                 "No node has registered yet.")


def fetch_depth(cluster, overview, view):
    return overview.depth_by_spider()


def render_depth(depths, view) -> str:
    states = [s for s in DEPTH_STATES if s in ALWAYS_SHOWN or any(d.counts.get(s) for d in depths)]
    rows = []
    for depth in depths:
        cells = "".join(f'<td class="number">{count_text(depth.counts.get(state, 0))}</td>' for state in states)
        rows.append(f'<tr class="depth"><td>{esc(depth.project)}</td><td>{esc(depth.spider)}</td>{cells}</tr>')
    note = (f"<p>Counted up to {COUNT_CAP:,} per spider and state; finished, failed and the other outcomes are "
            f"among the kept finished jobs (finished_to_keep = {view.settings.finished_to_keep}).</p>")
    headers = ["Project", "Spider", *(state.capitalize() for state in states)]
    return table("depth", headers, rows, "No jobs.") + note


def fetch_crawls(cluster, overview, view):
    return FrontierStore.for_engine(overview.engine).open_crawls()


def render_crawls(crawls, view) -> str:
    def cells(crawl):
        return [f"<td>{crawl_link(view.base, crawl.project, crawl.crawl)}</td>", cell(crawl.project), cell(crawl.spider),
                number_cell(f"{crawl.running} / {crawl.workers}"),
                number_cell(count_text(crawl.queued, QUEUED_COUNT_CAP)), number_cell(f"{crawl.in_flight:,}")]

    note = (f"<p>Crawls spread over workers (_workers) with a worker not yet ended, the newest {MAX_OPEN_CRAWLS} at "
            f"most; queued: the requests ready to fetch, counted up to {QUEUED_COUNT_CAP:,}; in flight: those its "
            "workers hold.</p>")
    return table("crawls", ["Crawl", "Project", "Spider", "Workers running / in all", "Queued", "In flight"],
                 table_rows("crawl", crawls, cells), "No crawl spread over workers is running.") + note


def fetch_throughput(cluster, overview, view):
    since = (view.now - datetime.timedelta(hours=view.hours)).replace(second=0, microsecond=0)
    return since, *overview.per_minute(since)


def render_throughput(data, view) -> str:
    since, minutes, oldest_kept = data
    finished, failed = {}, {}
    for row in minutes:
        target = finished if row.outcome == "finished" else failed if row.outcome in FAILED_OUTCOMES else None
        if target is not None:
            target[row.minute] = target.get(row.minute, 0) + row.jobs
    end = view.now.replace(second=0, microsecond=0)
    kept = f"since {no_microseconds(oldest_kept)}" if oldest_kept else "none yet"
    links = " · ".join(f'<a href="{view.base}/dashboard?hours={h}">{h} h</a>' for h in (1, 3, 12, 24))
    return (
        f"<p>Jobs per minute over the last {view.hours} hours ({links}), from the finished jobs the cluster keeps "
        f"(the newest {view.settings.finished_to_keep}, finished_to_keep: {kept}). Prometheus keeps the whole "
        "history: see /metrics.</p>"
        + minute_chart("Finished", finished, since, end, "#3a7", "chart-finished")
        + minute_chart("Failed (failed, lost, interrupted, dead)", failed, since, end, "#c33", "chart-failed")
    )


def fetch_items(cluster, overview, view):
    return overview.items_by_spider()


def render_items(spiders, view) -> str:
    def cells(spider):
        return [cell(spider.project), cell(spider.spider), number_cell(f"{spider.jobs:,}"),
                number_cell(f"{spider.items:,}"), number_cell(f"{spider.per_minute:,.1f}")]

    note = ("<p>Items each spider scraped over the minutes its jobs ran, from the stats its crawls report: the kept "
            f"finished jobs (finished_to_keep = {view.settings.finished_to_keep}) and the running ones.</p>")
    return table("items", ["Project", "Spider", "Jobs", "Items", "Items per minute"],
                 table_rows("items", spiders, cells), "No job has reported stats yet.") + note


def fetch_failures(cluster, overview, view):
    return cluster.troubled_jobs(FAILURES_SHOWN)


def render_failures(jobs, view) -> str:
    def cells(job):
        log_link = f'<a href="{view.base}{esc(quoted_log_path(job.project, job.spider, job.job))}">Log</a>'
        return [cell(job.project), cell(job.spider), cell(job.job), cell(job.outcome), cell(job.reason),
                cell(job.node), cell(no_microseconds(local_time(job.end_time))), f"<td>{log_link}</td>"]

    return table("failures", ["Project", "Spider", "Job", "Outcome", "Reason", "Node", "Ended", "Log"],
                 table_rows("failure", jobs, cells), "No failures among the kept finished jobs.")


def fetch_periodic(cluster, overview, view):
    return ScheduleStore.for_settings(view.settings).list_periodic()


def render_periodic(schedules, view) -> str:
    def cells(p):
        when = p.cron + " (" + p.timezone + ")" if p.cron else f"every {p.every_seconds:g} s"
        return [cell(p.name), cell(p.project), cell(p.spider), cell(when),
                cell("paused" if p.paused else no_microseconds(p.next_fire_time)),
                cell(no_microseconds(p.last_fire_time)), cell(p.last_job),
                number_cell(f"{p.fired:,}"), number_cell(f"{p.skipped:,}")]

    headers = ["Name", "Project", "Spider", "When", "Next", "Last fired", "Last job", "Fired", "Skipped"]
    return table("periodic", headers, table_rows("periodic", schedules, cells),
                 "No periodic jobs (scrapyd-pgqueue periodic add).")


def fetch_limits(cluster, overview, view):
    return ScheduleStore.for_settings(view.settings).list_limits()


def render_limits(limits, view) -> str:
    def cells(limit):
        return [cell(limit.project), cell(limit.spider), number_cell(limit.running), number_cell(limit.max_running)]

    return table("limits", ["Project", "Spider", "Running", "Limit"], table_rows("limit", limits, cells),
                 "No per-spider limits (scrapyd-pgqueue limit set).")


SECTIONS = [
    Section("Nodes", fetch_nodes, render_nodes),
    Section("Queue by spider", fetch_depth, render_depth),
    Section("Crawls", fetch_crawls, render_crawls),
    Section("Throughput", fetch_throughput, render_throughput),
    Section("Items per spider", fetch_items, render_items),
    Section("Newest failures", fetch_failures, render_failures),
    Section("Periodic jobs", fetch_periodic, render_periodic),
    Section("Per-spider limits", fetch_limits, render_limits),
]


def table(element_id: str, headers: list[str], rows: list[str], empty: str) -> str:
    if not rows:
        return f'<p id="{element_id}">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(header)}</th>" for header in headers)
    return f'<table id="{element_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(rows) + "\n</tbody></table>"


def table_rows(row_class: str, items, cells: Callable[[Any], list[str]]) -> list[str]:
    """One ``<tr class=row_class>`` per item, of the cells ``cells(item)`` gives."""
    return [f'<tr class="{row_class}">' + "".join(cells(item)) + "</tr>" for item in items]


def cell(value) -> str:
    return f"<td>{esc(value)}</td>"


def number_cell(value) -> str:
    return f'<td class="number">{esc(value)}</td>'


def count_text(count: int, cap: int = COUNT_CAP) -> str:
    """A count its query stopped at ``cap``: shown as at least that many."""
    return f"{count:,}+" if count >= cap else f"{count:,}"


class DashboardPage(ThreadedPage):
    def build(self, request) -> bytes:
        hours = int_parameter(request, "hours", DEFAULT_HOURS, 1, MAX_HOURS)
        settings = self.root.settings
        view = View(self.base_path(request), local_time(clock.database_now()), hours, settings)
        cluster, overview = AllJobsStore.for_settings(settings), OverviewStore.for_settings(settings)
        parts = [render_summary(fetch_summary(cluster, overview, view), view)]
        for section in SECTIONS:
            parts.append(f"<h2>{esc(section.title)}</h2>\n" + section.render(section.fetch(cluster, overview, view), view))
        body = (
            f'<h1>Cluster dashboard</h1>\n<p><a href="{view.base}/">Go up</a> · <a href="{view.base}/jobs">Jobs</a> · '
            f'<a href="{view.base}/metrics">Metrics</a> · shown by {esc(self.root.node_name)} at '
            f"{no_microseconds(view.now)}, refreshed every {REFRESH_SECONDS} s</p>\n" + "\n".join(parts)
        )
        return document("Scrapyd dashboard", body, head=f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
                        style=STYLE)
