"""``tree.json``: a crawl tree for the whole cluster, in Scrapyd's JSON.

``tree.json?project=P&job=ROOT`` (any job of the tree finds its root) answers its jobs by state, in Scrapyd's
names (``pending``, delayed ones included; ``running``; ``finished``) and by outcome, the total, how many are not
ended (``open``), ``done``, the start of its first job and the end of its last, the completion job
(``_on_complete``) once enqueued, and the newest failures (``failures=N``, default 10). Installed through ``[services]`` like the other services.
"""

from __future__ import annotations

from scrapyd.webservice import param
from twisted.web import error, http

from scrapyd_pgqueue.services.answers import FAILURES_SHOWN, find_tree, tree_answer
from scrapyd_pgqueue.services.resource import DatabaseService

MAX_FAILURES_SHOWN = 1000  # an answer of that many failures is already long; more is a mistake (or past bigint)


class Tree(DatabaseService):
    """The tree of a job: counts by state and outcome, done, times, newest failures."""

    @param("project")
    @param("job")
    @param("failures", required=False, default=FAILURES_SHOWN, type=int)
    def render_GET(self, txrequest, project, job, failures):
        self.check_project(project)
        if not 0 <= failures <= MAX_FAILURES_SHOWN:
            raise error.Error(code=http.OK, message=b"failures must be between 0 and %d" % MAX_FAILURES_SHOWN)
        view = find_tree(self.store, project, job, failures)
        if view is None:
            raise error.Error(code=http.OK, message=b"job '%b' not found in project '%b'" % (job.encode(),
                                                                                             project.encode()))
        return tree_answer(view, failures)


def cancel_tree(store, project: str, job: str, signal: str) -> dict:
    """cancel.json with ``_tree=1``: every waiting job of root ``job``'s tree cancelled, every running one
    signalled wherever it runs. ``prevstate`` is the root's, as for one job; ``cancelled`` and ``signalled`` count
    the tree's jobs. Refused for a job that is not a root (it names the root)."""
    lineage = store.lineage(job, project)
    if lineage is None:
        raise error.Error(code=http.OK, message=b"job '%b' not found in project '%b'" % (job.encode(),
                                                                                         project.encode()))
    root = lineage.root
    if root is not None and root != job:
        raise error.Error(code=http.OK, message=b"job '%b' is not a root: _tree=1 takes its root '%b'" % (
            job.encode(), root.encode()))
    prevstate = store.job_status(job, project)
    counts = store.cancel_tree(project, job, signal)
    prevstate = prevstate if prevstate in ("pending", "running") else None
    return {"prevstate": prevstate, "cancelled": counts["cancelled"], "signalled": counts["signalled"]}
