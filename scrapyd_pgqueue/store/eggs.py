"""Project eggs in the database: their queries and ``EggStore``."""

from __future__ import annotations

import hashlib
import zlib
from typing import NamedTuple

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store.base import PROJECTS_CHANNEL, StorePerEngine, database_errors

# --- eggs ---

# Replace the egg of :project/:version (a second upload of a version wins, like a file overwritten).
DELETE_EGG_VERSION = text("DELETE FROM project_egg WHERE project = :project AND version = :version")

# Store an egg with its sha256 (computed by the node that took the deploy); its new id changes the eggs' fingerprint,
# so nodes that missed the NOTIFY still notice.
INSERT_EGG = text("INSERT INTO project_egg (project, version, egg, sha256) VALUES (:project, :version, :egg, :sha256)")

# Tell every node that the eggs of :project changed (delivered on commit).
NOTIFY_EGGS_CHANGED = text("SELECT pg_notify(:channel, :project)")

# The versions of :project (unordered; the caller sorts them like Scrapyd). Reads the unique (project, version) index.
EGG_VERSIONS = text("SELECT version FROM project_egg WHERE project = :project")

# The egg of :project/:version, with its row id and the digest it must match.
GET_EGG = text("SELECT id, egg, sha256 FROM project_egg WHERE project = :project AND version = :version")

# Each version of :project with its egg's row id and digest, no egg: which file a node's egg cache must hold (a
# redeployed version has a new id) and what that file must hash to.
EGG_IDS = text("SELECT version, id, sha256 FROM project_egg WHERE project = :project")

# One egg by its row id.
EGG_BY_ID = text("SELECT egg FROM project_egg WHERE id = :id")

# The spiders of one egg, as `scrapy list` answered on the node that listed them first (none: not listed yet).
EGG_SPIDERS = text("SELECT spiders FROM project_egg_spiders WHERE egg_id = :egg_id")

# The spiders a node listed for one egg; another node that listed them meanwhile got the same answer: kept as it is.
# An egg deleted meanwhile inserts nothing (its row is gone: the foreign key refuses, and the caller ignores it).
REMEMBER_EGG_SPIDERS = text("""
    INSERT INTO project_egg_spiders (egg_id, spiders)
    SELECT id, CAST(:spiders AS text[]) FROM project_egg WHERE id = :egg_id
    ON CONFLICT (egg_id) DO NOTHING
""")

# The row ids of every egg: the files a node's egg cache may keep.
ALL_EGG_IDS = text("SELECT id FROM project_egg")

# Every project with an egg.
EGG_PROJECTS = text("SELECT DISTINCT project FROM project_egg ORDER BY project")

# Delete the egg of :project/:version, or all of the project's eggs when :version is NULL.
DELETE_EGGS = text("""
    DELETE FROM project_egg WHERE project = :project AND (CAST(:version AS text) IS NULL OR version = :version)
""")

# The uid of :project's crawls, assigned now if it has none: the first free uid of :first..:last, counted on from a
# point the project's name picks (so uids mostly do not depend on the order projects come in). A node that assigns at
# the same moment for this project or this uid inserts nothing (ON CONFLICT DO NOTHING) and no row comes back: asked
# again, it reads the row the other wrote. Probes the uid index once per candidate, at a project's first crawl only.
PROJECT_UID = text("""
    WITH assigned AS (
        INSERT INTO project_user (project, uid)
        SELECT :project, candidate FROM generate_series(:first, :last) AS candidate
        WHERE NOT EXISTS (SELECT 1 FROM project_user WHERE project = :project)
          AND NOT EXISTS (SELECT 1 FROM project_user AS taken WHERE taken.uid = candidate)
        ORDER BY (candidate - :first + :start) % (:last - :first + 1)
        LIMIT 1
        ON CONFLICT DO NOTHING
        RETURNING uid
    )
    SELECT uid FROM assigned UNION ALL SELECT uid FROM project_user WHERE project = :project
""")

# Per project, its number of eggs and newest egg id: changes whenever one of its eggs is added, replaced or deleted
# (ids are never reused). The heartbeat's floor under NOTIFY; reads no egg.
EGG_CATALOGUE = text("SELECT project, count(*) AS eggs, max(id) AS newest FROM project_egg GROUP BY project")


class StoredEgg(NamedTuple):
    id: int
    sha256: bytes  # what the egg's bytes must hash to
    egg: bytes = b""


class EggStore(StorePerEngine):
    """Project eggs in the database: deployed once through any node, runnable on every node."""

    @classmethod
    def for_url(cls, url: str, migrate_schema: bool = True) -> EggStore:
        return cls.for_engine(db.get_engine(url, migrate_schema=migrate_schema))

    @database_errors
    def put_egg(self, project: str, version: str, egg: bytes) -> None:
        digest = hashlib.sha256(egg).digest()
        with db.transaction(self.engine) as connection:
            connection.execute(DELETE_EGG_VERSION, {"project": project, "version": version})
            connection.execute(INSERT_EGG, {"project": project, "version": version, "egg": egg, "sha256": digest})
            connection.execute(NOTIFY_EGGS_CHANGED, {"channel": PROJECTS_CHANNEL, "project": project})

    @database_errors
    def egg_versions(self, project: str) -> list[str]:
        with db.autocommit(self.engine) as connection:
            return list(connection.execute(EGG_VERSIONS, {"project": project}).scalars())

    @database_errors
    def get_egg(self, project: str, version: str) -> StoredEgg | None:
        with db.autocommit(self.engine) as connection:
            row = connection.execute(GET_EGG, {"project": project, "version": version}).first()
        return None if row is None else StoredEgg(row.id, bytes(row.sha256), bytes(row.egg))

    @database_errors
    def egg_ids(self, project: str) -> dict[str, StoredEgg]:
        """Version -> its egg's row id and digest (``egg`` empty: not read)."""
        with db.autocommit(self.engine) as connection:
            return {row.version: StoredEgg(row.id, bytes(row.sha256))
                    for row in connection.execute(EGG_IDS, {"project": project})}

    @database_errors
    def egg_spiders(self, egg_id: int) -> list[str] | None:
        """The spiders listed for the egg of row ``egg_id``; None when no node has listed them yet."""
        with db.autocommit(self.engine) as connection:
            spiders = connection.execute(EGG_SPIDERS, {"egg_id": egg_id}).scalar()
        return None if spiders is None else list(spiders)

    @database_errors
    def remember_egg_spiders(self, egg_id: int, spiders: list[str]) -> None:
        """The spiders ``scrapy list`` found in the egg of row ``egg_id``, for every node."""
        with db.autocommit(self.engine) as connection:
            connection.execute(REMEMBER_EGG_SPIDERS, {"egg_id": egg_id, "spiders": spiders})

    @database_errors
    def project_uid(self, project: str, first: int, last: int) -> int:
        """The uid :project's crawls run as (``crawl_users``), assigned at its first crawl on any node."""
        start = zlib.crc32(project.encode()) % (last - first + 1)
        for _ in range(5):  # each round loses only to another node's assignment, which the next one reads
            with db.autocommit(self.engine) as connection:
                uid = connection.execute(PROJECT_UID, {"project": project, "first": first, "last": last,
                                                       "start": start}).scalar()
            if uid is not None:
                return uid
        raise db.DatabaseError(f"no uid of {first}-{last} is free for project {project!r} (crawl_uid_range)")

    @database_errors
    def egg_by_id(self, egg_id: int) -> bytes | None:
        with db.autocommit(self.engine) as connection:
            egg = connection.execute(EGG_BY_ID, {"id": egg_id}).scalar()
        return None if egg is None else bytes(egg)

    @database_errors
    def all_egg_ids(self) -> set[int]:
        with db.autocommit(self.engine) as connection:
            return set(connection.execute(ALL_EGG_IDS).scalars())

    @database_errors
    def egg_projects(self) -> list[str]:
        with db.autocommit(self.engine) as connection:
            return list(connection.execute(EGG_PROJECTS).scalars())

    @database_errors
    def delete_eggs(self, project: str, version: str | None = None) -> int:
        """Delete one version (or every version) of ``project``; return how many eggs were deleted."""
        with db.transaction(self.engine) as connection:
            deleted = connection.execute(DELETE_EGGS, {"project": project, "version": version}).rowcount
            if deleted:
                connection.execute(NOTIFY_EGGS_CHANGED, {"channel": PROJECTS_CHANNEL, "project": project})
            return deleted

    @database_errors
    def egg_catalogue(self) -> dict[str, tuple[int, int]]:
        """Project -> (number of eggs, newest egg id): compare two catalogues to see which projects changed."""
        with db.autocommit(self.engine) as connection:
            return {row.project: (row.eggs, row.newest) for row in connection.execute(EGG_CATALOGUE)}
