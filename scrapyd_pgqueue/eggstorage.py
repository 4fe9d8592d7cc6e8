"""IEggStorage in Postgres: deploy once (addversion.json, scrapyd-deploy) through any node, run on every node.

Every node lists the same projects and versions, and each crawl subprocess (``scrapyd.runner``) fetches its egg
from the database. That subprocess imports this module before Scrapy picks its reactor: nothing here may import
``twisted.internet.reactor`` (or ``scrapyd.launcher``). Other nodes learn about a change from a NOTIFY (see
``events.py``).
"""

from __future__ import annotations

from io import BytesIO

from zope.interface import implementer

from scrapyd.eggstorage import sorted_versions
from scrapyd.exceptions import EggNotFoundError, ProjectNotFoundError
from scrapyd.interfaces import IEggStorage
from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.db import DatabaseError
from scrapyd_pgqueue.store import EggStore


@implementer(IEggStorage)
class PostgresEggStorage:
    def __init__(self, config):
        self.database_url = pgconfig.database_url(config)
        self.baked_in = {project for project, _ in config.items("settings", default=[])}

    @property
    def store(self) -> EggStore:
        return EggStore.for_url(self.database_url)

    def put(self, eggfile, project, version):
        self.store.put_egg(project, version, eggfile.read())

    def get(self, project, version=None):
        try:
            return self._get(project, version)
        except DatabaseError:
            if project not in self.baked_in:
                raise
            # A project baked in through [settings] runs without an egg: a crawl starting while the database is
            # away still runs (Scrapyd itself activates an egg of the same name first when there is one).
            return None, None

    def _get(self, project, version):
        # All the crawl subprocess calls: it reads a schema its node has migrated, so it skips the check (~0.4 s).
        store = EggStore.for_url(self.database_url, migrate_schema=False)
        if version is None:
            versions = sorted_versions(store.egg_versions(project))
            if not versions:
                return None, None
            version = versions[-1]
        egg = store.get_egg(project, version)
        return (None, None) if egg is None else (version, BytesIO(egg))

    def list(self, project):
        return sorted_versions(self.store.egg_versions(project))

    def list_projects(self):
        return self.store.egg_projects()

    def delete(self, project, version=None):
        if not self.store.delete_eggs(project, version):
            raise ProjectNotFoundError if version is None else EggNotFoundError
