"""One line makes a Scrapyd node a cluster node: ``application = scrapyd_pgqueue.application``.

Scrapyd builds its node with the callable its ``application`` option names (``scrapyd.app.application``). This
one fills in every component, web service and page of the cluster (``one_line_config.apply_defaults``), checks the
configuration (a node open to the network refuses to start, a half or bypassed one is logged), then builds the node
as Scrapyd does. Nothing here imports Twisted's reactor at import time: the runner imports this package in the crawl
process, where the reactor must stay uninstalled until Scrapy installs its asyncio one.
"""

from __future__ import annotations

import sys
import types

from scrapyd_pgqueue.one_line_config import (
    apply_defaults,
    bypassed_defaults,
    open_to_the_network,
    warn_half_configuration,
)


def application(config):
    """Scrapyd's ``application``: the cluster's components, services and pages, then Scrapyd's own build."""
    from scrapyd.app import application as scrapyd_application
    from scrapyd.interfaces import IEnvironment
    from twisted.logger import Logger

    from scrapyd_pgqueue import config as pgconfig
    from scrapyd_pgqueue.components.environment import CrawlEnvironment
    from scrapyd_pgqueue.crawl_process.not_dumpable import make_not_dumpable
    from scrapyd_pgqueue.database import db, roles
    from scrapyd_pgqueue.node import copy_writer, crawl_keys, spawning, spider_list
    from scrapyd_pgqueue.web.request_limits import judge_requests_on_their_headers

    make_not_dumpable()  # no crawl may read its environment or memory
    refusal = open_to_the_network(config)
    if refusal:
        raise pgconfig.ConfigurationError(refusal)
    for problem in bypassed_defaults(config):
        Logger(namespace="scrapyd_pgqueue").warn("This one-line node is misconfigured: {problem}.", problem=problem)
    apply_defaults(config)
    warn_half_configuration(config)
    settings = pgconfig.settings(config)
    secrets = crawl_keys.node_secrets(config, settings)
    environment = CrawlEnvironment(config)
    # First, before any connection, thread or port: the spawner, then (a node started as root) the node unprivileged.
    spawning.start_spawner(settings, spawning.node_directories(config, settings, environment), secrets)
    roles.warn_if_privileged(db.engine_for_settings(settings))
    app = scrapyd_application(config)
    app.setComponent(IEnvironment, environment)  # Scrapyd's application builds its own, which no option names
    judge_requests_on_their_headers(app, config, settings)
    spider_list.install(app, secrets, settings, config.get("runner", "scrapyd.runner"))
    copy_writer.install(settings, secrets)
    return app


class _CallableModule(types.ModuleType):
    """``scrapyd_pgqueue.application`` names this module once it is imported (Python sets a package's attribute to
    its submodule): calling the module builds the node, so the one line works whichever import came first."""

    def __call__(self, config):
        return application(config)


sys.modules[__name__].__class__ = _CallableModule
