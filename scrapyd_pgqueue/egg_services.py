"""Scrapyd's egg services off the reactor now live in ``services/eggs.py``; this path stays for configurations."""

from scrapyd_pgqueue.services.eggs import (  # noqa: F401
    AddVersion,
    DeleteProject,
    DeleteVersion,
    ListSpiders,
    ListVersions,
)

__all__ = ["AddVersion", "DeleteProject", "DeleteVersion", "ListSpiders", "ListVersions"]
