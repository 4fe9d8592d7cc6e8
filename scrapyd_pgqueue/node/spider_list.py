"""``scrapy list`` without the node's keys: Scrapyd's spider list (``scrapyd.webservice.spider_list``, which every
service asks) runs its subprocess as a crawl runs: through the node's spawner, under the project's user, with the
crawl's environment (``crawl_keys.crawl_environment``) and the sealed egg the node fetched (``SCRAPYD_PGQUEUE_EGG``):
the subprocess holds no database URL to look it up itself. The spiders of a deployed egg are listed once for the whole
cluster (``IEggFiles.listed_spiders``): a node that has just started checks a schedule against them at once, instead
of starting Python to import the project first.
Called in the web threads (the services answer off the reactor): fetching the egg may wait for the database.
"""

from __future__ import annotations

import os

from scrapyd import webservice
from scrapyd.exceptions import RunnerError
from scrapyd.interfaces import IEggStorage, IEnvironment

from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.contracts import IEggFiles
from scrapyd_pgqueue.crawl_process import launch
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE, VERSION_VARIABLE
from scrapyd_pgqueue.node import relayed, spawning
from scrapyd_pgqueue.node.crawl_keys import crawl_environment


class NodeSpiderList(webservice.SpiderList):
    egg_files: IEggFiles | None = None  # the node's egg storage, when it fetches eggs into the node's cache
    secrets: frozenset[str] = frozenset()
    baked_in: dict[str, str] = {}  # [settings]: project -> settings module (its HOME is its own: no ~/.scrapy.cfg)
    settings = None  # the node's: crawl_paths

    def set(self, project, version, *, runner):
        """As Scrapyd's: ``scrapy list`` of the project's version, cached; in the crawl's environment, under the
        project's user, started by the node's spawner."""
        from twisted.internet import reactor, threads

        env = crawl_environment(os.environ, self.secrets)
        env["PYTHONIOENCODING"] = "UTF-8"
        env[PROJECT_VARIABLE] = project
        if version:
            env[VERSION_VARIABLE] = version
        if project in self.baked_in:
            env["SCRAPY_SETTINGS_MODULE"] = self.baked_in[project]
        egg = None if self.egg_files is None else self.egg_files.sealed_egg(project, version)
        listed = None if egg is None else self.egg_files.listed_spiders(egg)
        if listed is not None:
            os.close(egg.fd)
            return self._cached(project, version, listed)
        launch_fd = spawning.launch_file({launch.ARGS: ["-s", "LOG_STDOUT=0"],
                                          launch.LANDLOCK: spawning.boundary().landlock,
                                          launch.WRITABLE: [*self.settings.crawl_paths, os.devnull]})
        env[EGG_FILE_VARIABLE] = launch.EGG_PATH if egg is not None else ""
        env[launch.LAUNCH_VARIABLE] = str(launch.LAUNCH_FD)
        try:
            fds = {launch.LAUNCH_FD: launch_fd, **({launch.EGG_FD: egg.fd} if egg is not None else {})}
            code, stdout, stderr = threads.blockingCallFromThread(
                reactor, spawning.run_to_end, [*spawning.PYTHON, "-m", runner, "list"], env, project,
                spawning.crawl_uid(project), fds)
        finally:
            relayed.close_all([launch_fd, *([egg.fd] if egg is not None else [])])
        if code:
            raise RunnerError((stderr or stdout or b"").decode())
        spiders = stdout.decode().splitlines()
        if egg is not None:
            self.egg_files.remember_spiders(egg, spiders)
        return self._cached(project, version, spiders)

    def _cached(self, project, version, spiders: list[str]) -> list[str]:
        self.cache[project].pop(None, None)  # as Scrapyd: the default version's answer may be this one's
        self.cache[project][version] = spiders
        return spiders


def install(app, secrets, settings) -> None:
    """Make Scrapyd's one spider list (which its services and ours import by name) this node's."""
    NodeSpiderList.egg_files = IEggFiles(app.getComponent(IEggStorage), None)
    NodeSpiderList.secrets = frozenset(secrets)
    NodeSpiderList.baked_in = dict(app.getComponent(IEnvironment).settings)
    NodeSpiderList.settings = settings
    webservice.spider_list.__class__ = NodeSpiderList
