"""IEggStorage in Postgres: deploy once (addversion.json, scrapyd-deploy) through any node, run on every node.

Every node lists the same projects and versions. A crawl opens no database connection to start: before spawning
it, the node (a long-lived process) finds the egg the job runs, keeps it as a file in ``eggs_dir`` keyed by the
egg's row id (a redeployed version gets a new id, so a cached file is never stale), and hands the crawl a sealed
memory file of it (``SealedEgg``; ``SCRAPYD_PGQUEUE_EGG`` names its ``/proc/self/fd`` path, empty when the project
has no egg, it is baked in). Before a crawl gets an egg, cached or fetched, the very bytes sealed into that memory
file are checked against the sha256 stored with it at deploy: an egg altered in the database is refused
(``EggRefused``: the job fails, and the node says so once per egg), a cached file altered on disk is fetched again,
and nothing can be swapped between the check and the crawl's import. When eggs are deleted or replaced, each node
deletes the cached files and memory files of ids no longer in the database (``prune_cache``). The crawl subprocess
(``scrapyd.runner``) imports this module before Scrapy picks its reactor: nothing here may import
``twisted.internet.reactor`` (or ``scrapyd.launcher``), and the store (SQLAlchemy) is imported only when used.
Other nodes learn about a change from a NOTIFY (see ``node/events.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import os
import tempfile
import threading
from io import BytesIO
from typing import NamedTuple

from scrapyd.eggstorage import sorted_versions
from scrapyd.exceptions import EggNotFoundError, ProjectNotFoundError
from twisted.logger import Logger
from zope.interface import implementer

from scrapyd_pgqueue import config as pgconfig
from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.contracts import IEggFiles

log = Logger()
# Eggs refused this process, by row id: each is logged once, not once per job that would have run it.
_refused: set[int] = set()


class EggRefused(Exception):
    """An egg whose bytes do not hash to the sha256 stored with it at deploy: no crawl runs it."""


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _read_file(path: str) -> bytes | None:
    """The file's bytes, None when there is no such file."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


class SealedEgg(NamedTuple):
    """An egg as a crawl gets it: a memory file sealed against every change, its sha256 (hex) and its row's id."""

    fd: int  # the caller's own descriptor, to close
    digest: str
    egg_id: int


def _seal(egg: bytes, digest: str, egg_id: int) -> SealedEgg:
    fd = os.memfd_create("egg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, egg)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    os.fchmod(fd, 0o444)
    return SealedEgg(fd, digest, egg_id)


# This process's sealed eggs, by row id: each is read and checked once, and handed to its crawls as a copy of the
# descriptor.
_sealed: dict[int, SealedEgg] = {}
_sealing = threading.Lock()


def check_egg(project: str, version: str, stored, egg: bytes) -> None:
    """Raise ``EggRefused`` unless ``egg`` hashes to ``stored.sha256`` (stored: a ``StoredEgg``)."""
    if hmac.compare_digest(_sha256(egg), stored.sha256):
        return
    if stored.id not in _refused:
        _refused.add(stored.id)
        log.error("Refused the egg of project {project} version {version} (row id {id}): its bytes do not match the "
                  "sha256 stored at its deploy, so it was altered in the database; no crawl runs it. Deploy the "
                  "version again.", project=project, version=version, id=stored.id)
    raise EggRefused(f"the egg of project {project!r} version {version!r} (row id {stored.id}) does not match the "
                     "sha256 stored at its deploy: refused")


@implementer(IEggFiles)
class PostgresEggStorage:
    def __init__(self, config):
        self.config = config
        self.baked_in = {project for project, _ in config.items("settings", default=[])}
        self.cache_dir = os.path.abspath(os.path.join(config.get("eggs_dir", "eggs"), "pgqueue"))

    @property
    def store(self):
        from scrapyd_pgqueue.store import EggStore

        return EggStore.for_settings(pgconfig.settings(self.config))

    def put(self, eggfile, project, version):
        self.store.put_egg(project, version, eggfile.read())

    def get(self, project, version=None):
        egg_file = os.environ.get(EGG_FILE_VARIABLE)
        if egg_file is not None:  # a crawl started by our launcher: the node fetched the egg
            return (None, None) if not egg_file else (version, open(egg_file, "rb"))
        from scrapyd_pgqueue.database.db import DatabaseError

        try:
            return self._get(project, version)
        except DatabaseError:
            if project not in self.baked_in:
                raise
            # A project baked in through [settings] runs without an egg: a crawl starting while the database is
            # away still runs (Scrapyd itself activates an egg of the same name first when there is one).
            return None, None

    def _get(self, project, version):
        from scrapyd_pgqueue.store import EggStore

        # A crawl started by another launcher: it reads a schema its node has migrated, so it skips the check.
        store = EggStore.for_url(pgconfig.database_url(self.config), migrate_schema=False)
        if version is None:
            versions = sorted_versions(store.egg_versions(project))
            if not versions:
                return None, None
            version = versions[-1]
        stored = store.get_egg(project, version)
        if stored is None:
            return None, None
        check_egg(project, version, stored, stored.egg)
        return version, BytesIO(stored.egg)

    def sealed_egg(self, project: str, version: str | None = None) -> SealedEgg | None:
        """Node side, off the reactor: the egg a job of ``project`` runs (the newest version unless pinned), checked
        and sealed, fetched into the cache when not there yet; None when the project has no such egg. Raises
        ``EggRefused`` when the database's egg does not match its sha256."""
        store = self.store
        ids = store.egg_ids(project)  # version -> egg id and sha256: one small query, no egg
        if version is None:
            version = sorted_versions(ids)[-1] if ids else None
        if version not in ids:
            return None
        stored = ids[version]
        with _sealing:
            sealed = _sealed.get(stored.id)
            if sealed is None:
                egg = self._checked_egg(store, project, version, stored)
                if egg is None:  # deleted meanwhile
                    return None
                sealed = _sealed[stored.id] = _seal(egg, stored.sha256.hex(), stored.id)
            return SealedEgg(os.dup(sealed.fd), sealed.digest, sealed.egg_id)

    def listed_spiders(self, egg: SealedEgg) -> list[str] | None:
        return self.store.egg_spiders(egg.egg_id)

    def remember_spiders(self, egg: SealedEgg, spiders: list[str]) -> None:
        self.store.remember_egg_spiders(egg.egg_id, spiders)

    def _checked_egg(self, store, project: str, version: str, stored) -> bytes | None:
        """The egg's bytes from the cache, else from the database into the cache; checked against its sha256."""
        path = os.path.join(self.cache_dir, f"{stored.id}.egg")
        egg = _read_file(path)
        if egg is not None and hmac.compare_digest(_sha256(egg), stored.sha256):
            return egg
        if egg is not None:
            log.warn("The cached egg {path} did not match its sha256: fetched again", path=path)
        egg = store.egg_by_id(stored.id)
        if egg is None:
            return None
        check_egg(project, version, stored, egg)
        os.makedirs(self.cache_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=self.cache_dir, suffix=".part", delete=False) as part:
            part.write(egg)
        os.replace(part.name, path)  # whole or absent
        return egg

    def prune_cache(self) -> list[str]:
        """Node side, off the reactor: delete the cached eggs no longer in the database (a deleted version or
        project, a version deployed again under a new id), files and sealed copies; return the deleted files' names
        (crawls hold copies of the descriptors they run)."""
        kept_ids = set(self.store.all_egg_ids())
        with _sealing:
            for egg_id in [egg_id for egg_id in _sealed if egg_id not in kept_ids]:
                os.close(_sealed.pop(egg_id).fd)
        try:
            cached = [name for name in os.listdir(self.cache_dir) if name.endswith(".egg")]
        except FileNotFoundError:
            return []
        kept = {f"{egg_id}.egg" for egg_id in kept_ids}
        deleted = []
        for name in cached:
            if name not in kept:
                with contextlib.suppress(FileNotFoundError):  # another pruner of a shared eggs_dir was first
                    os.remove(os.path.join(self.cache_dir, name))
                    deleted.append(name)
        return deleted

    def list(self, project):
        return sorted_versions(self.store.egg_versions(project))

    def list_projects(self):
        return self.store.egg_projects()

    def delete(self, project, version=None):
        if not self.store.delete_eggs(project, version):
            raise ProjectNotFoundError if version is None else EggNotFoundError
