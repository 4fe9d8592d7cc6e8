"""``stats.json``: a job's Scrapy stats, from any node of the cluster.

``stats.json?project=P&job=J`` answers ``{"project": P, "job": J, "stats": {...}}``: the whole stats dict of the
newest run of that job, as its crawl last reported it (every ``stats_interval`` seconds while it runs, in full once
it ends; ``{}`` before its first report). An unknown job is Scrapyd's JSON error. Installed through ``[services]``
like the other services.
"""

from __future__ import annotations

from scrapyd.webservice import param

from scrapyd_pgqueue.services.resource import DatabaseService, refuse


class JobStats(DatabaseService):
    """The stats of one job, wherever it ran."""

    @param("project")
    @param("job")
    def render_GET(self, txrequest, project, job):
        self.check_project(project)
        stats = self.store.job_stats(project, job)
        if stats is None:
            raise refuse(f"job '{job}' not found in project '{project}'")
        return {"project": project, "job": job, "stats": stats}
