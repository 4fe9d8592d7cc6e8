"""Scrapyd's own egg services, answering off the reactor: the eggs are in Postgres (``PostgresEggStorage``), and
``scrapy list`` (addversion.json, listspiders.json) reads the egg from there too, so on the reactor a stalled
database would freeze every request of the node. Same parameters, checks and answers as Scrapyd's."""

from __future__ import annotations

from scrapyd import webservice

from scrapyd_pgqueue.web.offload import OffTheReactor


class AddVersion(OffTheReactor, webservice.AddVersion):
    pass


class ListVersions(OffTheReactor, webservice.ListVersions):
    pass


class ListSpiders(OffTheReactor, webservice.ListSpiders):
    pass


class DeleteProject(OffTheReactor, webservice.DeleteProject):
    pass


class DeleteVersion(OffTheReactor, webservice.DeleteVersion):
    pass
