"""Scrapyd's configuration as a one-line node (``application = scrapyd_pgqueue.application``) and its crawls read
it, and what is wrong with one.

Scrapyd's own defaults already name a component for every option, so "set explicitly" means "differs from Scrapyd's
default": an option left at Scrapyd's default gets ours (``apply_defaults``), any other value wins. The crawl and
``scrapy list`` subprocesses read the configuration files again (``scrapyd.runner``): the runner becomes
``scrapyd_pgqueue.runner``, which reads an ``OneLineConfig``, so they find the eggs in the database.

A node whose configuration mixes the shared queue with Scrapyd's per-node poller, launcher or services logs what
will be wrong, and the line that fixes it (``warn_half_configuration``); so does a one-line node whose ``runner``
goes around the one line (``bypassed_defaults``). A node that would listen beyond loopback without a username and
password refuses to start (``open_to_the_network``): whoever reaches it can deploy code to every node. Nothing here
imports Twisted's reactor: crawl processes import this module.
"""

from __future__ import annotations

import configparser
import ipaddress
import os
import pkgutil

from scrapyd.config import Config

# --- the one line's defaults: what ``application = scrapyd_pgqueue.application`` installs -------------------------
# Read by the node (``application.py``) and by every crawl's runner, cold (``runner.py``) or warm.
COMPONENTS = {
    "spiderqueue": "scrapyd_pgqueue.PostgresSpiderQueue",
    "jobstorage": "scrapyd_pgqueue.PostgresJobStorage",
    "poller": "scrapyd_pgqueue.PostgresPoller",
    "launcher": "scrapyd_pgqueue.PostgresLauncher",
    "eggstorage": "scrapyd_pgqueue.PostgresEggStorage",
    "webroot": "scrapyd_pgqueue.web.root.Root",
    "runner": "scrapyd_pgqueue.runner",
}
SERVICES = {
    "schedule.json": "scrapyd_pgqueue.services.jobs.Schedule",
    "schedule_batch.json": "scrapyd_pgqueue.services.batches.ScheduleBatch",
    "status.json": "scrapyd_pgqueue.services.jobs.Status",
    "listjobs.json": "scrapyd_pgqueue.services.jobs.ListJobs",
    "daemonstatus.json": "scrapyd_pgqueue.services.jobs.DaemonStatus",
    "cancel.json": "scrapyd_pgqueue.services.jobs.Cancel",
    "logs": "scrapyd_pgqueue.services.jobs.Logs",
    "addperiodic.json": "scrapyd_pgqueue.services.schedules.AddPeriodic",
    "listperiodic.json": "scrapyd_pgqueue.services.schedules.ListPeriodic",
    "delperiodic.json": "scrapyd_pgqueue.services.schedules.DelPeriodic",
    "pauseperiodic.json": "scrapyd_pgqueue.services.schedules.PausePeriodic",
    "resumeperiodic.json": "scrapyd_pgqueue.services.schedules.ResumePeriodic",
    "tree.json": "scrapyd_pgqueue.services.trees.Tree",
    "crawl.json": "scrapyd_pgqueue.services.crawls.Crawl",
    "stats.json": "scrapyd_pgqueue.services.stats.JobStats",
    "alive.json": "scrapyd_pgqueue.services.jobs.Alive",
    # Scrapyd's own, answering off the reactor: they read the eggs in the database.
    "addversion.json": "scrapyd_pgqueue.services.eggs.AddVersion",
    "listversions.json": "scrapyd_pgqueue.services.eggs.ListVersions",
    "listspiders.json": "scrapyd_pgqueue.services.eggs.ListSpiders",
    "delproject.json": "scrapyd_pgqueue.services.eggs.DeleteProject",
    "delversion.json": "scrapyd_pgqueue.services.eggs.DeleteVersion",
}


def scrapyd_defaults() -> configparser.ConfigParser:
    """Scrapyd's own default configuration (the first file it reads)."""
    defaults = configparser.ConfigParser()
    defaults.read_string(pkgutil.get_data("scrapyd", "default_scrapyd.conf").decode())
    return defaults


def apply_defaults(config) -> None:
    """Give every option still at Scrapyd's default (or unset) the cluster's value, in a ``scrapyd.config.Config``."""
    defaults = scrapyd_defaults()
    parser = config.cp
    for section, values in (("scrapyd", COMPONENTS), ("services", SERVICES)):
        if not parser.has_section(section):
            parser.add_section(section)
        for option, value in values.items():
            current = parser.get(section, option, fallback=None)
            if current is None or current == defaults.get(section, option, fallback=None):
                parser.set(section, option, value)


class OneLineConfig(Config):
    """Scrapyd's configuration with the one-line node's defaults applied (``apply_defaults``): what a crawl's runner
    reads, so it finds the eggs in the database and not in Scrapyd's egg folder."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        apply_defaults(self)


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
