"""One line makes a Scrapyd node a cluster node: ``application = scrapyd_pgqueue.application``.

Scrapyd builds its node with the callable its ``application`` option names (``scrapyd.app.application``). This
one fills in every component, web service and page of the cluster, then builds the node as Scrapyd does. Scrapyd's
own defaults already name a component for every option, so "set explicitly" means "differs from Scrapyd's
default": an option left at Scrapyd's default gets ours, any other value wins.

The crawl and ``scrapy list`` subprocesses read the configuration files again (``scrapyd.runner``): the runner
becomes ``scrapyd_pgqueue.runner``, which applies the same defaults there, so they find the eggs in the database.

A node whose configuration mixes the shared queue with Scrapyd's per-node poller, launcher or services logs what
will be wrong, and the line that fixes it (``warn_half_configuration``); so does a one-line node whose ``runner``
goes around the one line (``bypassed_defaults``). A node that would listen beyond loopback without a username and
password refuses to start (``open_to_the_network``): whoever reaches it can deploy code to every node. Nothing here
imports Twisted's reactor: the runner imports this module in the crawl process, where the reactor must stay
uninstalled until Scrapy installs its asyncio one.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import types

from scrapyd_pgqueue.config import COMPONENTS, SERVICES, apply_defaults, scrapyd_defaults  # noqa: F401 - the one line's tables, here too

ONE_LINE = "application = scrapyd_pgqueue.application"

# What goes wrong when the shared queue runs with Scrapyd's own piece instead of ours.
CONSEQUENCES = {
    "poller": "the node stops claiming jobs for good the first time another node wins a job (and claims project "
    "by project, ignoring priority across projects)",
    "launcher": "crawls are not recorded on their rows: no node, pid or outcome, no lease, a dead node's jobs stay "
    "running forever, cancel.json on another node cannot stop them",
    "jobstorage": "finished jobs are kept in this node's memory only",
    "services": "status.json, listjobs.json, daemonstatus.json and cancel.json answer for this node's crawls only "
    "(status.json answers null for a job running on another node) and /logs/ has no log of other nodes' jobs",
}


def half_configuration(config) -> list[str]:
    """What is wrong with a configuration that uses the shared queue with some of Scrapyd's per-node pieces."""
    if not config.get("spiderqueue", "").startswith("scrapyd_pgqueue."):
        return []
    problems = [
        f"{option} = {config.get(option, '')}: {CONSEQUENCES[option]}"
        for option in ("poller", "launcher", "jobstorage")
        if is_scrapyds(config.get(option, ""))
    ]
    services = dict(config.items("services", default=[]))
    stock = [name for name in ("status.json", "listjobs.json", "daemonstatus.json", "cancel.json")
             if is_scrapyds(services.get(name, ""))]
    if stock:
        problems.append(f"[services] {', '.join(stock)} are Scrapyd's own: {CONSEQUENCES['services']}")
    return problems


_warned = False


def is_scrapyds(path: str) -> bool:
    """Scrapyd's own per-node piece (or none): a class of the user's own is theirs to judge."""
    return not path or path.startswith("scrapyd.")


def warn_half_configuration(config) -> None:
    """Log, once per process, what a half configuration gets wrong and the line that fixes it. Called by the
    application and by the shared queue itself (the explicit form runs Scrapyd's application)."""
    global _warned
    problems = half_configuration(config)
    if problems and not _warned:
        from twisted.logger import Logger

        _warned = True
        Logger(namespace="scrapyd_pgqueue").warn(
            "This node uses the shared Postgres queue but not all of its components:\n  - {problems}\nFix: put the "
            "one line '{line}' in the [scrapyd] section and remove the component and [services] lines (or name "
            "every scrapyd_pgqueue component and service, see scrapyd.cfg).",
            problems="\n  - ".join(problems), line=ONE_LINE,
        )


def bypassed_defaults(config) -> list[str]:
    """Options of a one-line configuration (before ``apply_defaults``) that go around the one line, with the fix.

    The crawl and ``scrapy list`` subprocesses build their egg storage from the configuration files: only
    ``scrapyd_pgqueue.runner`` applies the one line's defaults there. Another runner (one wrapping
    ``scrapyd.runner``) finds the eggs only if ``eggstorage`` is in the file itself."""
    defaults = scrapyd_defaults()
    runner, eggstorage = config.get("runner", ""), config.get("eggstorage", "")
    if runner in ("", COMPONENTS["runner"], defaults.get("scrapyd", "runner")):
        return []
    if eggstorage not in ("", defaults.get("scrapyd", "eggstorage")):
        return []
    return [
        f"runner = {runner} does not apply the one line's defaults in the crawl and `scrapy list` processes: they "
        "look for eggs in Scrapyd's per-node directory and every deployed project fails with 'no active project'. "
        f"Fix: add the line 'eggstorage = {COMPONENTS['eggstorage']}' to the [scrapyd] section (or make the runner "
        "call scrapyd_pgqueue.runner.main)"
    ]


def open_to_the_network(config) -> str | None:
    """Why this node must not start, when it would listen beyond loopback with no username and password (the
    address and credentials as Scrapyd reads them: the environment first)."""
    address = os.environ.get("SCRAPYD_BIND_ADDRESS") or config.get("bind_address", "127.0.0.1")
    username = os.environ.get("SCRAPYD_USERNAME") or config.get("username", "")
    password = os.environ.get("SCRAPYD_PASSWORD") or config.get("password", "")
    if (username and password) or not address or address == "localhost" or _is_loopback(address):
        return None
    return (
        f"this node would listen on {address} with no username and password: anyone who reaches it can deploy an "
        "egg, which is code that runs on every node of the cluster with its database role. Set SCRAPYD_USERNAME "
        "and SCRAPYD_PASSWORD (or username and password in [scrapyd]), or bind_address = 127.0.0.1"
    )


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, possibly beyond this host


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
    spider_list.install(app, secrets, settings)
    copy_writer.install(settings, secrets)
    return app


class _CallableModule(types.ModuleType):
    """``scrapyd_pgqueue.application`` names this module once it is imported (Python sets a package's attribute to
    its submodule): calling the module builds the node, so the one line works whichever import came first."""

    def __call__(self, config):
        return application(config)


sys.modules[__name__].__class__ = _CallableModule
