"""``/jobs``: Scrapyd's jobs page for the whole cluster.

Pending jobs one page at a time in run order (``?pending_offset=``), the running jobs of every node, and the kept
finished jobs with their outcome. Scrapyd's columns come first, in Scrapyd's order, with plain ``<td>`` cells under
``<h1>Jobs</h1>``: ScrapydWeb reads this page by position. Node and Outcome follow them, then the job's items
scraped, errors and finish reason (from its stats), then the tags a node needs to run it, then the crawl it is a
worker of (a crawl spread over workers: its first worker's job id, linked to its ``crawl.json``). A pending job that
no live node can run (none has all of its tags) says ``unroutable`` in its Outcome cell.

Log links: a stored log (finished jobs) and a log file of this node are served here; a running job's log is on its
node, linked at that node's registered URL. A node whose ``node_url`` is not set registers a URL made of its host
name, which a browser elsewhere usually cannot resolve (a container's name): the page says so instead of linking.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import urlencode, urljoin, urlsplit

from scrapyd_pgqueue.crawl_process.job_stats import stats_summary
from scrapyd_pgqueue.database import clock
from scrapyd_pgqueue.store import MAX_PENDING_OFFSET, PENDING_COUNT_CAP, AllJobsStore, OverviewStore, local_time
from scrapyd_pgqueue.store.pools import PoolStore
from scrapyd_pgqueue.web.page import (
    CANCEL_CONFIRM,
    ThreadedPage,
    document,
    esc,
    int_parameter,
    no_microseconds,
    quoted_log_path,
)

STOCK_HEADERS = ["Project", "Spider", "Job", "PID", "Start", "Runtime", "Finish", "Log"]
EXTRA_HEADERS = ["Node", "Outcome"]
# From each job's stats (job_stats.stats_summary), after every other column: pages read by position keep theirs.
STATS_HEADERS = ["Items scraped", "Errors", "Finish reason"]
POOL_HEADERS = ["Tags"]
CRAWL_HEADERS = ["Crawl"]
PENDING_PAGE_SIZE = 100


@dataclass
class JobsData:
    pending: list
    more_pending: bool
    pending_total: int
    pending_exact: bool
    running: list
    finished: list
    node_urls: dict
    offset: int
    unroutable: list  # store.pools.UnroutablePool: tag sets of pending jobs no live node can run


class JobsPage(ThreadedPage):
    @functools.cached_property
    def headers(self) -> list[str]:
        headers = list(STOCK_HEADERS)
        if self.root.local_items:
            headers.append("Items")
        if b"cancel.json" in self.root.children:
            headers.append("Cancel")
        return headers + EXTRA_HEADERS + STATS_HEADERS + POOL_HEADERS + CRAWL_HEADERS

    def fetch(self, offset: int) -> JobsData:
        settings = self.root.settings
        cluster = AllJobsStore.for_settings(settings)
        counts = cluster.cluster_counts(settings.lease_seconds)
        pending, more = cluster.pending_page(None, PENDING_PAGE_SIZE, offset)
        return JobsData(
            pending, more, counts.pending, counts.pending_exact, cluster.running_jobs(),
            cluster.finished_jobs(None, settings.finished_to_keep),
            OverviewStore.for_settings(settings).node_urls(), offset,
            PoolStore.for_settings(settings).unroutable(settings.lease_seconds, PENDING_COUNT_CAP),
        )

    def build(self, request) -> bytes:
        data = self.fetch(int_parameter(request, "pending_offset", 0, 0, MAX_PENDING_OFFSET))
        base = self.base_path(request)
        rows = Rows(self, base, data.node_urls, {",".join(pool.tags) for pool in data.unroutable})
        span = len(self.headers)
        sections = "\n".join(
            f"""<tbody>
<tr>
    <th colspan="{span}">{title}</th>
</tr>
{"".join(row(job) for job in jobs)}
</tbody>"""
            for title, row, jobs in (
                ("Pending", rows.pending, data.pending),
                ("Running", rows.running, data.running),
                ("Finished", rows.finished, data.finished),
            )
        )
        body = f"""<h1>Jobs</h1>
<p><a href="{base}/">Go up</a> · <a href="{base}/dashboard">Dashboard</a> · every node of the cluster (this page:
{esc(self.root.node_name)})</p>
{self.pending_note(data, base)}{unroutable_note(data.unroutable)}
<table id="jobs">
<thead>
{row_html(f"<th>{header}</th>" for header in self.headers)}
</thead>
{sections}
</table>"""
        return document("Scrapyd", body)

    @staticmethod
    def pending_note(data: JobsData, base: str) -> str:
        total = f"{data.pending_total:,}" + ("" if data.pending_exact else " (estimated)")
        if data.offset and not data.pending:  # past the end (the queue may have shrunk since the link was made)
            return (f'<p id="pending-note">No pending jobs from {data.offset + 1:,} on: {total} in all. '
                    f'<a href="{base}/jobs">first page</a></p>')
        first = data.offset + 1 if data.pending else data.offset
        links = []
        if data.offset:
            previous = max(0, data.offset - PENDING_PAGE_SIZE)
            links.append(f'<a href="{base}/jobs?pending_offset={previous}">previous {PENDING_PAGE_SIZE}</a>')
        if data.more_pending:
            following = data.offset + len(data.pending)
            links.append(f'<a id="next-pending" href="{base}/jobs?pending_offset={following}">next '
                         f"{PENDING_PAGE_SIZE}</a>")
        return (f'<p id="pending-note">Pending jobs {first:,}–{data.offset + len(data.pending):,} of {total}, '
                f"in the order they will run. {' · '.join(links)}</p>")


def unroutable_note(unroutable) -> str:
    """The tag sets that pending jobs require and no live node has, with how many jobs wait for each."""
    if not unroutable:
        return ""
    sets = ", ".join(f"{esc(','.join(pool.tags))} ({pool.jobs:,})" for pool in unroutable)
    return (f'<p id="unroutable-note">Pending jobs no live node can run (unroutable), by the tags they require: '
            f"{sets}. They run as soon as a node with those tags joins.</p>\n")


def row_html(cells) -> str:
    return "<tr>\n" + "\n".join(f"    {cell}" for cell in cells) + "\n</tr>\n"


class Rows:
    """The table's rows: one value per header, escaped here."""

    def __init__(self, page: JobsPage, base: str, node_urls: dict[str, str | None], unroutable: set[str]):
        self.page, self.base, self.node_urls, self.unroutable = page, base, node_urls, unroutable
        self.root = page.root

    def row(self, values: dict) -> str:
        return row_html(f"<td>{'' if values.get(h) is None else values[h]}</td>" for h in self.page.headers)

    def cancel_button(self, project: str, job: str) -> str:
        return (f'<form method="post" onsubmit="{CANCEL_CONFIRM}" action="{self.base}/cancel.json">'
                f'<input type="hidden" name="project" value="{esc(project)}">'
                f'<input type="hidden" name="job" value="{esc(job)}">'
                f'<input type="submit" style="float: left;" value="Cancel"></form>')

    def pending(self, job) -> str:
        job_id = job.message.get("_job", job.job)
        return self.row({
            "Project": esc(job.project), "Spider": esc(job.message.get("name")), "Job": esc(job_id),
            "Cancel": self.cancel_button(job.project, job_id),
            "Outcome": "unroutable" if job.run_at is None and job.pool in self.unroutable else None,
            "Tags": esc(",".join(job.tags)), "Crawl": self.crawl_link(job),
        })

    def running(self, job) -> str:
        start = job.start_time
        runtime = no_microseconds(clock.database_now() - start) if start else None  # the same clock as start_time
        return self.row({
            "Project": esc(job.project), "Spider": esc(job.spider), "Job": esc(job.job), "PID": esc(job.pid),
            "Start": esc(no_microseconds(local_time(start))), "Runtime": esc(runtime),
            "Log": self.log_link(job, stored=False), "Items": self.items_link(job),
            "Cancel": self.cancel_button(job.project, job.job), "Node": esc(job.node),
            **stats_cells(job.stats, running=True), "Tags": esc(",".join(job.tags)), "Crawl": self.crawl_link(job),
        })

    def finished(self, job) -> str:
        ran = job.node is not None  # a job cancelled while pending never started
        start = no_microseconds(local_time(job.start_time)) if ran else None
        end = no_microseconds(local_time(job.end_time))
        return self.row({
            "Project": esc(job.project), "Spider": esc(job.spider), "Job": esc(job.job), "Start": esc(start),
            "Runtime": esc(end - start if start and end else None), "Finish": esc(end),
            "Log": self.log_link(job, stored=job.has_log) if ran else None, "Items": self.items_link(job),
            "Node": esc(job.node), "Outcome": esc(job.outcome), **stats_cells(job.stats, running=False),
            "Tags": esc(",".join(job.tags)), "Crawl": self.crawl_link(job),
        })

    def log_link(self, job, stored: bool) -> str:
        path = quoted_log_path(job.project, job.spider, job.job)
        if stored or self.root.get_log_url(job) or job.node == self.root.node_name:
            return f'<a href="{self.base}{esc(path)}">Log</a>'
        url = self.node_urls.get(job.node)
        if url is None:
            return f"on {esc(job.node)}, which is stopped" if not stored else None
        if url_is_guessed(url, job.node):
            return f'<span class="no-node-url">on {esc(job.node)}: node_url not set there</span>'
        return f'<a href="{esc(urljoin(url, path.lstrip("/")))}">Log</a>'

    def crawl_link(self, job) -> str | None:
        return crawl_link(self.base, job.project, job.crawl) if job.crawl is not None else None

    def items_link(self, job) -> str | None:
        url = self.root.get_item_url(job)
        return f'<a href="{self.base}{esc(url)}">Items</a>' if url else None


def crawl_link(base: str, project: str, crawl: str) -> str:
    """The crawl's id, linked to its crawl.json (escaped)."""
    query = urlencode({"project": project, "crawl": crawl})
    return f'<a href="{base}/crawl.json?{esc(query)}">{esc(crawl)}</a>'


def stats_cells(stats, running: bool) -> dict[str, str | None]:
    """The stats columns of a job's row (escaped); the reason only once it ended."""
    summary = stats_summary(stats)
    return {"Items scraped": esc(summary["items"]), "Errors": esc(summary["errors"]),
            "Finish reason": None if running else esc(summary["finish_reason"])}


def url_is_guessed(url: str, node: str | None) -> bool:
    """Whether a node registered the URL made of its host name (no node_url): Scrapyd's node name is the host
    name too unless set, so the URL's host is the node's name."""
    return (urlsplit(url).hostname or "") == (node or "").lower()
