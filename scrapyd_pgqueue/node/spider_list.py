"""``scrapy list`` without the node's keys: Scrapyd's spider list (``scrapyd.webservice.spider_list``, which every
service asks) runs its subprocess as a crawl runs: through the node's spawner, under the project's user, with the
crawl's environment (``crawl_keys.crawl_environment``) and the sealed egg the node fetched (``SCRAPYD_PGQUEUE_EGG``):
the subprocess holds no database URL to look it up itself. The spiders of a deployed egg are listed once for the whole
cluster (``IEggFiles.listed_spiders``): a node that has just started checks a schedule against them at once, instead
of starting Python to import the project first. As it starts, the node reads them for every deployed project in a
thread, fetching the egg into its cache, so that its first schedules wait for neither. A project baked into the node
([settings], no egg) is listed by its first schedule, as in Scrapyd.
Called in the web threads (the services answer off the reactor): fetching the egg may wait for the database.
"""

from __future__ import annotations

import os

from scrapyd import webservice
from scrapyd.exceptions import RunnerError
from scrapyd.interfaces import IEggStorage, IEnvironment
from twisted.logger import Logger

from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.contracts import IEggFiles
from scrapyd_pgqueue.crawl_process import launch
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE, VERSION_VARIABLE
from scrapyd_pgqueue.node import relayed, spawning
from scrapyd_pgqueue.node.crawl_keys import crawl_environment

log = Logger()


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


def install(app, secrets, settings, runner: str) -> None:
    """Make Scrapyd's one spider list (which its services and ours import by name) this node's, and read the deployed
    projects' spiders once the reactor runs."""
    from twisted.internet import reactor

    NodeSpiderList.egg_files = IEggFiles(app.getComponent(IEggStorage), None)
    NodeSpiderList.secrets = frozenset(secrets)
    NodeSpiderList.baked_in = dict(app.getComponent(IEnvironment).settings)
    NodeSpiderList.settings = settings
    webservice.spider_list.__class__ = NodeSpiderList
    if NodeSpiderList.egg_files is not None:
        reactor.callWhenRunning(reactor.callInThread, read_spiders_at_start, runner)


def read_spiders_at_start(runner: str) -> None:
    """In a thread: the spiders of each deployed project's newest egg, cached for the schedules to come. A project
    that cannot be read is a schedule's error later (as in Scrapyd), not the node's."""
    try:
        projects = NodeSpiderList.egg_files.list_projects()
    except Exception as e:  # noqa: BLE001 - a database away: its schedules read them when it is back
        log.warn("Could not read the deployed projects to read their spiders: {error}", error=e)
        return
    for project in sorted(projects):
        try:
            webservice.spider_list.get(project, None, runner=runner)
        except Exception as e:  # noqa: BLE001 - a refused egg, RunnerError: said, and the node goes on
            log.warn("Could not read the spiders of project {project}: {error}", project=project, error=e)
