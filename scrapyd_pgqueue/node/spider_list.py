"""``scrapy list`` without the node's keys: Scrapyd's spider list (``scrapyd.webservice.spider_list``, which every
service asks) runs its subprocess with the crawl's environment (``crawl_keys.crawl_environment``) and the egg the
node fetched (``SCRAPYD_PGQUEUE_EGG``), as a crawl does: the subprocess holds no database URL to look it up itself.
Called in the web threads (the services answer off the reactor): fetching the egg may wait for the database.
"""

from __future__ import annotations

import os
import sys
from subprocess import PIPE, Popen

from scrapyd import webservice
from scrapyd.exceptions import RunnerError
from scrapyd.interfaces import IEggStorage

from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.contracts import IEggFiles
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE, VERSION_VARIABLE
from scrapyd_pgqueue.node.crawl_keys import crawl_environment


class NodeSpiderList(webservice.SpiderList):
    egg_files: IEggFiles | None = None  # the node's egg storage, when it fetches eggs into the node's cache
    secrets: frozenset[str] = frozenset()

    def set(self, project, version, *, runner):
        """As Scrapyd's: ``scrapy list`` of the project's version, cached; in the crawl's environment."""
        env = crawl_environment(os.environ, self.secrets)
        env["PYTHONIOENCODING"] = "UTF-8"
        env[PROJECT_VARIABLE] = project
        if version:
            env[VERSION_VARIABLE] = version
        if self.egg_files is not None:
            env[EGG_FILE_VARIABLE] = self.egg_files.egg_file(project, version)
        process = Popen([sys.executable, "-m", runner, "list", "-s", "LOG_STDOUT=0"], stdout=PIPE, stderr=PIPE, env=env)
        stdout, stderr = process.communicate()
        if process.returncode:
            raise RunnerError((stderr or stdout or b"").decode())
        spiders = stdout.decode().splitlines()
        self.cache[project].pop(None, None)  # as Scrapyd: the default version's answer may be this one's
        self.cache[project][version] = spiders
        return spiders


def install(app, secrets) -> None:
    """Make Scrapyd's one spider list (which its services and ours import by name) this node's."""
    NodeSpiderList.egg_files = IEggFiles(app.getComponent(IEggStorage), None)
    NodeSpiderList.secrets = frozenset(secrets)
    webservice.spider_list.__class__ = NodeSpiderList
