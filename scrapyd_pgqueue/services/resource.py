"""What every JSON service of the cluster shares: answering off the reactor, over the cluster's store, a database
that is away said as a plain message in Scrapyd's JSON error, and the web root seen as ``contracts.INodeRoot``."""

from __future__ import annotations

import functools

from scrapyd.webservice import WsResource
from twisted.web import error, http, resource
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.contracts import INodeRoot
from scrapyd_pgqueue.database.db import DatabaseError
from scrapyd_pgqueue.store import AllJobsStore
from scrapyd_pgqueue.web import offload


@implementer(INodeRoot)
class ScrapydRootOfANode:
    """Scrapyd's own web root (an explicit configuration names no webroot) as ``INodeRoot``: the node's settings are
    its poller's (the cluster's, which reads them from the same configuration), the rest is Scrapyd's root's."""

    def __init__(self, root):
        self.scrapyd_root = root

    @property
    def settings(self) -> pgconfig.Settings:
        return self.scrapyd_root.poller.settings

    def __getattr__(self, name):
        return getattr(self.scrapyd_root, name)


def node_root(root) -> INodeRoot:
    """The web root a service hangs under, as the services need it."""
    return root if INodeRoot.providedBy(root) else ScrapydRootOfANode(root)


def refuse(message: str) -> error.Error:
    """A request refused with ``message``, in Scrapyd's JSON error (HTTP 200, as WsResource answers)."""
    return error.Error(code=http.OK, message=message.encode())


class DatabaseErrorsAsMessages(resource.Resource):
    """Answers a database that is away with a plain message in Scrapyd's JSON error, not an exception's name.

    Placed after WsResource in a service's bases: WsResource.render turns the raised error into the JSON.
    """

    def render(self, txrequest):
        try:
            return super().render(txrequest)
        except DatabaseError as e:
            raise error.Error(code=http.OK, message=f"the job queue is unavailable: {e}".encode()) from e


class DatabaseService(offload.OffTheReactor, WsResource, DatabaseErrorsAsMessages):
    """A JSON service over the shared queue's tables, answering off the reactor (``web/offload.py``)."""

    def __init__(self, root):
        super().__init__(node_root(root))

    @functools.cached_property
    def settings(self) -> pgconfig.Settings:
        return self.root.settings

    @functools.cached_property
    def store(self) -> AllJobsStore:
        return AllJobsStore.for_settings(self.settings)

    def check_project(self, project: str | None) -> None:
        if project is not None and project not in self.root.poller.queues:
            raise error.Error(code=http.OK, message=b"project '%b' not found" % project.encode())
