"""Scrapyd's ``webroot`` for a cluster node (``webroot = scrapyd_pgqueue.web.root.Root``):
Scrapyd's own root with the cluster's pages, ``/jobs`` for every node, ``/dashboard`` and ``/metrics``."""

from __future__ import annotations

from scrapyd.website import Home as ScrapydHome
from scrapyd.website import Root as ScrapydRoot
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import INodeRoot
from scrapyd_pgqueue.web.dashboard import DashboardPage
from scrapyd_pgqueue.web.jobs import JobsPage
from scrapyd_pgqueue.web.page import forwarded_prefix


@implementer(INodeRoot)
class Root(ScrapydRoot):
    def __init__(self, config, app):
        self.settings = pgconfig.settings(config)
        super().__init__(config, app)
        self.putChild(b"", Home(self))
        self.putChild(b"jobs", JobsPage(self))
        self.putChild(b"dashboard", DashboardPage(self))

    def getChild(self, path, request):
        if path == b"metrics":  # built on the first scrape, with prometheus_client (see metrics.py)
            from scrapyd_pgqueue.web.prometheus import MetricsPage

            self.putChild(b"metrics", MetricsPage(self))
            return self.children[b"metrics"]
        return super().getChild(path, request)


class Home(ScrapydHome):
    """Scrapyd's home page, with a link to the dashboard after the one to the jobs; its links' forwarded prefix
    validated and escaped (Scrapyd's puts the header in the page as it comes)."""

    def get_base_path(self, txrequest):
        return forwarded_prefix(txrequest, self.root.prefix_header)

    def render_GET(self, txrequest):
        content = super().render_GET(txrequest)
        jobs_link = b'/jobs">Jobs</a></li>'
        dashboard = f'\n<li><a href="{self.get_base_path(txrequest)}/dashboard">Dashboard</a></li>'.encode()
        content = content.replace(jobs_link, jobs_link + dashboard, 1)
        txrequest.setHeader("Content-Length", str(len(content)))
        return content
