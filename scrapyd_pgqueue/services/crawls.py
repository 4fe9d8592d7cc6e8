"""``crawl.json``: one crawl spread over workers (``_workers``), for the whole cluster, in Scrapyd's JSON.

``crawl.json?project=P&crawl=ID`` (ID: the crawl's first worker's job id, which ``schedule.json`` answered as
``jobid``) answers its frontier's requests: ``queued`` (ready), ``in_flight`` (held by a worker), ``done`` and
``failed``; ``duplicates`` dropped (the requests found again, as the workers' Scrapy counted them); ``pages_per_minute``
(requests done in the last minute); its ``workers``, each with its state in Scrapyd's names, outcome and node; and
its ``stats``: the sum of its workers' numeric Scrapy stats.
Installed through ``[services]`` like the other services.
"""

from __future__ import annotations

from scrapyd.webservice import param
from twisted.web import error, http

from scrapyd_pgqueue.services.resource import DatabaseService
from scrapyd_pgqueue.store.frontier import FrontierStore
from scrapyd_pgqueue.store.trees import SCRAPYD_STATES


class Crawl(DatabaseService):
    """A crawl's frontier and workers."""

    @param("project")
    @param("crawl")
    def render_GET(self, txrequest, project, crawl):
        self.check_project(project)
        view = FrontierStore.for_engine(self.store.engine).crawl(project, crawl)
        if view is None:
            raise error.Error(code=http.OK, message=b"crawl '%b' not found in project '%b'" % (crawl.encode(),
                                                                                               project.encode()))
        return {
            "crawl": view.crawl,
            "queued": view.requests["ready"], "in_flight": view.requests["leased"],
            "done": view.requests["done"], "failed": view.requests["failed"],
            "duplicates": sum(worker.duplicates for worker in view.workers),
            "pages_per_minute": view.done_last_minute,
            "workers": [{"id": worker.job, "state": SCRAPYD_STATES[worker.status], "outcome": worker.outcome,
                         "node": worker.node} for worker in view.workers],
            "stats": view.stats,
        }
