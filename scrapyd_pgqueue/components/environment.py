"""IEnvironment: Scrapyd's, with the crawl's files named by absolute paths and its directories left to the crawl.

A crawl runs in a directory of its own (``node/spawner.py``), so the log, items and job directories Scrapyd names
relative to the node's working directory are made absolute here. The node no longer makes a crawl's
``<project>/<spider>`` directories: under ``crawl_users`` they belong to the project's user, who makes them itself
(``crawl_process/launch.py``), and a directory the node made would be the node's, where the crawl cannot write.
The node still prunes the oldest files beyond ``jobs_to_keep``, as Scrapyd does.
"""

from __future__ import annotations

import os
from contextlib import suppress
from urllib.parse import urlsplit

from scrapyd.environ import Environment
from scrapyd.interfaces import IEnvironment
from scrapyd.utils import get_file_path, local_items
from zope.interface import implementer


def local_items_dir(items_dir: str) -> str:
    """The directory of ``items_dir`` when the items are files on this node ('' when none, or not files)."""
    if not items_dir:
        return ""
    parsed = urlsplit(items_dir)
    return parsed.path if local_items(items_dir, parsed) else ""


@implementer(IEnvironment)
class CrawlEnvironment(Environment):
    def __init__(self, config, initenv=os.environ):
        super().__init__(config, initenv)
        self.logs_dir = os.path.abspath(self.logs_dir) if self.logs_dir else ""
        self.jobs_dir = os.path.abspath(self.jobs_dir) if self.jobs_dir else ""
        local = local_items_dir(self.items_dir)
        if local:
            self.items_dir = os.path.abspath(local)

    def _prepare_file(self, message, directory, extension):
        file_path = get_file_path(directory, message["_project"], message["_spider"], f"{message['_job']}.{extension}")
        parent = file_path.dirname()
        with suppress(OSError):  # not there yet: the crawl makes it
            names = [os.path.join(parent, name) for name in os.listdir(parent)]
            for path in sorted(names, key=os.path.getmtime)[: -self.jobs_to_keep]:
                with suppress(OSError):
                    os.remove(path)
        return file_path.path

    def crawl_directories(self, message) -> list[str]:
        """The directories a crawl writes its files to: its log's, its items', its job directory's parent."""
        names = (message["_project"], message["_spider"])  # checked by get_settings (get_file_path) already
        return [os.path.join(base, *names) for base in (self.logs_dir, self.items_dir, self.jobs_dir) if base]

    def project_directories(self, project: str) -> list[str]:
        """The same, for every spider of the project (what a warm process of it may write)."""
        return [os.path.join(base, project) for base in (self.logs_dir, self.items_dir, self.jobs_dir) if base]
