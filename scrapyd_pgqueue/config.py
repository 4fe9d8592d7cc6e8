"""Settings read from Scrapyd's ``Config`` and the environment.

The environment wins over the config file: some Scrapyd code paths build ``Config(values={...})``, which
reads no file, and containers pass secrets through the environment.
"""

from __future__ import annotations

import configparser
import os
import pkgutil
import re
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

DATABASE_URL_OPTION = "database_url"
DATABASE_URL_VARIABLE = "SCRAPYD_DATABASE_URL"
LISTEN_URL_OPTION = "listen_url"
LISTEN_URL_VARIABLE = "SCRAPYD_LISTEN_URL"
LEASE_LOST_ACTIONS = ("keep", "stop")
NODE_NAME_VARIABLE = "SCRAPYD_NODE_NAME"
NODE_TAGS_VARIABLE = "SCRAPYD_NODE_TAGS"
# Set by the node for each crawl: the path of the egg to run, or empty when the project has none.
EGG_FILE_VARIABLE = "SCRAPYD_PGQUEUE_EGG"
# Jobs a crawl tree may ever have, unless tree_max_jobs says otherwise.
DEFAULT_TREE_MAX_JOBS = 100_000

# Identifies this Scrapyd process: its row in scrapyd_node and the owner (lease holder) of the jobs it claims.
WORKER_ID = uuid.uuid4().hex


_URL_SCHEME = re.compile(r"^postgres(ql)?(\+psycopg2)?://")


def url_ambiguity(url: str) -> str | None:
    """Why libpq may read ``url`` otherwise than its writer meant, without quoting any of it; None: it will not.

    libpq ends the user and password at the first '@' and the host at the first '/': a password with an unencoded
    '@' or '/' sends the rest of it as the host (which errors then show), and other parsers (SQLAlchemy's, urllib's)
    also split at '#', '?' and ':'. Whatever precedes the URL's last '@' is taken for the user and password."""
    matched = _URL_SCHEME.match(url.strip())
    rest = url.strip()[matched.end():] if matched else ""  # a key=value string quotes its values: never ambiguous
    if "@" not in rest:
        return None
    user, _, password = rest[:rest.rindex("@")].partition(":")
    if any(mark in password for mark in "@/#?:") or any(mark in user for mark in "@/#?"):
        return ("an unencoded '@', '/', '#', '?' or ':' in its user or password (before its last '@'), which libpq "
                "would read as the end of that part: percent-encode them (%40, %2F, %23, %3F, %3A)")
    return None


class ConfigurationError(RuntimeError):
    """The node's configuration cannot work; raised at start-up."""


@dataclass(frozen=True)
class Settings:
    database_url: str = field(repr=False)  # holds the password: never in a log line
    node_name: str
    # The node's tags (node_tags, or SCRAPYD_NODE_TAGS): it claims only jobs whose required tags it all has.
    node_tags: tuple[str, ...] = ()
    finished_to_keep: int = 100
    # Dead jobs (out of retries) kept beside them, newest first; None: every one, until requeued or pruned by hand.
    dead_to_keep: int | None = None
    # Jobs a crawl tree may ever have (its root included): a child past it is refused; 0: no cap.
    tree_max_jobs: int = DEFAULT_TREE_MAX_JOBS
    # Seconds without a heartbeat after which a node's ongoing jobs are recovered by any live node.
    lease_seconds: float = 30.0
    heartbeat_interval: float = 5.0
    # Claims of one job (the first run included) before recovery gives it up as lost.
    max_attempts: int = 3
    # Whether the poller listens for NOTIFY to start jobs at once; polling stays as the floor.
    listen_notify: bool = True
    # Seconds a stopping node (SIGTERM) lets its crawls run on before it hands them back to the queue.
    stop_timeout: float = 5.0
    # Pending jobs listjobs.json returns when not given pending_limit: a huge backlog stays fast to list.
    listjobs_pending_limit: int = 1000
    # Bytes of a finished job's log (its tail) stored in the database for every node to serve; 0: none.
    log_max_bytes: int = 1024 * 1024
    # Connections of the node's pool (no overflow): with the one listener (which carries the lease), the node's
    # budget; with listen_notify off the lease takes one of them.
    database_pool_size: int = 2
    # Seconds any operation (a web request included) waits for the database before it is an error.
    database_timeout: float = 30.0
    # Where the one LISTEN connection goes, when database_url is a transaction pooler (holds a password too).
    listen_url: str = field(default="", repr=False)
    # What a node does with its crawls once it could not renew its lease for too long: keep them, or stop them
    # before another node may take their jobs over.
    on_lease_lost: str = "keep"
    # Scrapyd's poll_interval: the tick of the poller, the floor under NOTIFY and delayed jobs' timers.
    poll_interval: float = 5.0
    # Retries of a failed crawl when schedule.json gives no _retries.
    default_retries: int = 0
    # Seconds a pending job may wait to be claimed before the counts call it past due.
    past_due_seconds: float = 60.0
    # Seconds between two VACUUMs of spider_job by the nodes that finish crawls (store/maintenance.py); 0: off.
    vacuum_interval: float = 5.0
    # Bytes of a request's body, checked before it is read (web/request_limits.py); addversion.json's: max_egg_bytes.
    max_request_bytes: int = 8 * 1024 * 1024
    max_egg_bytes: int = 100 * 1024 * 1024
    # Crawls forked from a warm process per project version (node/warm.py) instead of a new Python each.
    warm_start: bool = True
    # Warm processes a node keeps (least recently used retired first), and seconds an unused one lives on.
    warm_processes: int = 4
    warm_idle_timeout: float = 300.0
    # Seconds between two reports of a running crawl's stats to its node, and between two writes of them.
    stats_interval: float = 30.0
    # The watchdog (node/watchdog.py), seconds. A job without _max_runtime / _stall_timeout gets these; None: off.
    max_runtime: float | None = None
    stall_timeout: float | None = None
    # A crawl asked to stop (cancel.json's first signal, the watchdog) and still alive this long after is SIGKILLed.
    cancel_timeout: float = 300.0
    # A crawl whose spider has not opened this long after its start is killed and its job handed back; None: off.
    start_timeout: float | None = 120.0
    # Webhooks (node/webhooks.py): hours an event is retried before it is given up; seconds one attempt may take; the
    # first retry's delay in seconds (doubled each attempt, with jitter), and the longest delay.
    webhook_retry_hours: float = 24.0
    webhook_timeout: float = 10.0
    webhook_backoff: float = 10.0
    webhook_backoff_max: float = 3600.0
    # The crawl boundary (node/spawner.py). A node started as root runs each project's crawls under a uid of its own
    # from crawl_uid_range, and itself as node_user (a name or uid; empty: the working directory's owner, else the uid
    # below the range); off: crawls run as the node's user (one trust domain).
    crawl_users: bool = True
    crawl_uid_range: tuple[int, int] = (20000, 29999)
    node_user: str = ""
    # Where each crawl gets a directory of its own (its working directory and HOME), under one per project.
    crawls_dir: str = "crawls"
    # Crawls restrict their own file access with Landlock where the kernel has it: they write only to their own
    # directory, log and items, and to crawl_paths (absolute paths, comma-separated), and read only the system's,
    # Python's and those.
    crawl_landlock: bool = True
    crawl_paths: tuple[str, ...] = ()

    @property
    def stop_deadline(self) -> float:
        """Seconds without a renewed lease after which a node sends its crawls SIGTERM (on_lease_lost = stop);
        they are SIGKILLed stop_timeout later, lease_margin before the lease expires."""
        return self.lease_seconds - self.lease_margin - self.stop_timeout

    @property
    def lease_margin(self) -> float:
        """Seconds before its lease expires (on the database's clock) by which a node has stopped its crawls
        (on_lease_lost = stop): two heartbeats, for the time a heartbeat takes to reach the database."""
        return 2 * self.heartbeat_interval


def _get(config, option, default=None):
    if config is None:
        return default
    return config.get(option, default)


def database_url(config=None) -> str:
    url = os.environ.get(DATABASE_URL_VARIABLE) or _get(config, DATABASE_URL_OPTION, "")
    if not url:
        raise ConfigurationError(
            f"no database URL: set '{DATABASE_URL_OPTION}' in the [scrapyd] section of scrapyd.conf "
            f"or the {DATABASE_URL_VARIABLE} environment variable (postgresql://user:password@host:5432/db)"
        )
    return unambiguous(url, f"{DATABASE_URL_VARIABLE} or '{DATABASE_URL_OPTION}'")


def unambiguous(url: str, source: str) -> str:
    """``url``, or a ConfigurationError (which quotes none of it) when libpq may read it otherwise than meant."""

    ambiguity = url_ambiguity(url)
    if ambiguity:
        raise ConfigurationError(f"the database URL of {source} is ambiguous: {ambiguity} (in scrapyd.conf, "
                                 "write each '%' as '%%')")
    return url


# --- tags: a node's (node_tags) and a job's (_tags), by one rule ------------------------------------------------


# A tag: letters, digits and '_', '.', ':', '-', starting with a letter or digit; a comma separates tags.
TAG_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")
MAX_TAGS = 16


class InvalidTagsError(ValueError):
    """Tags that cannot be a node's or a job's (reason in the message)."""


def parse_tags(value: Any) -> tuple[str, ...]:
    """Tags as given (a comma-separated string, or a list of strings), checked, sorted and deduplicated; an empty
    string or list: no tags."""
    if isinstance(value, str):
        given = value.split(",") if value.strip() else []
    elif isinstance(value, (list, tuple)) and all(isinstance(tag, str) for tag in value):
        given = list(value)
    else:
        raise InvalidTagsError("tags must be a comma-separated string or a list of strings")
    tags = sorted({tag.strip() for tag in given})
    for tag in tags:
        if not TAG_PATTERN.fullmatch(tag):
            raise InvalidTagsError(
                f"tag {tag[:100]!r} is not valid: 1 to 63 letters, digits, '_', '.', ':' or '-', starting with a "
                "letter or digit")
    if len(tags) > MAX_TAGS:
        raise InvalidTagsError(f"at most {MAX_TAGS} tags, not {len(tags)}")
    return tuple(tags)


def pool_key(tags: Iterable[str]) -> str:
    """The pool of a job requiring ``tags`` (checked already): sorted, joined by commas; '' for none."""
    return ",".join(sorted(set(tags)))


def pool_tags(pool: str | None) -> list[str]:
    """The tags a pool requires, as a list (empty for '' and None)."""
    return pool.split(",") if pool else []


def node_tags(config=None) -> tuple[str, ...]:
    """The node's tags, checked and sorted (ConfigurationError when one is not a valid tag)."""
    given = os.environ.get(NODE_TAGS_VARIABLE) or _get(config, "node_tags", "") or ""
    try:
        return parse_tags(given)
    except InvalidTagsError as e:
        raise ConfigurationError(f"{NODE_TAGS_VARIABLE} or 'node_tags': {e}") from None


def node_name(config=None) -> str:
    # Scrapyd's own Root uses config "node_name" with the host name as default: agree with it.
    return os.environ.get(NODE_NAME_VARIABLE) or _get(config, "node_name", "") or socket.gethostname()


def _switch(config, option: str, default: bool) -> bool:
    value = str(_get(config, option, "") or ("on" if default else "off")).strip().lower()
    if value not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise ConfigurationError(f"'{option}' must be on or off, not {value!r}")
    return value in ("on", "true", "yes", "1")


def uid_range(value: str) -> tuple[int, int]:
    """``crawl_uid_range``: FIRST-LAST, uids above root's and the system's (1000 up), at least one."""
    first, _, last = value.partition("-")
    try:
        first_uid, last_uid = int(first), int(last)
    except ValueError:
        raise ConfigurationError(f"'crawl_uid_range' must be FIRST-LAST (20000-29999), not {value!r}") from None
    if not 1000 <= first_uid <= last_uid < 2**31 - 1:
        raise ConfigurationError(f"'crawl_uid_range' must run from 1000 up, first <= last, not {value!r}")
    return first_uid, last_uid


def crawl_paths(value: str) -> tuple[str, ...]:
    """``crawl_paths``: absolute paths, comma-separated."""
    paths = tuple(path.strip() for path in value.split(",") if path.strip())
    relative = [path for path in paths if not os.path.isabs(path)]
    if relative:
        raise ConfigurationError(f"'crawl_paths' takes absolute paths, not {relative[0]!r}")
    return paths


def settings(config=None) -> Settings:
    def number(option, default, kind=float):
        value = _get(config, option, "")
        try:
            return kind(value) if value != "" else default
        except ValueError as e:
            raise ConfigurationError(f"'{option}' must be a number, not {value!r}") from e

    on_lease_lost = str(_get(config, "on_lease_lost", "keep")).strip().lower()
    if on_lease_lost not in LEASE_LOST_ACTIONS:
        raise ConfigurationError(f"'on_lease_lost' must be one of {', '.join(LEASE_LOST_ACTIONS)}, not {on_lease_lost!r}")
    result = Settings(
        database_url=database_url(config),
        node_name=node_name(config),
        node_tags=node_tags(config),
        finished_to_keep=number("finished_to_keep", 100, int),
        dead_to_keep=number("dead_to_keep", None, int),
        tree_max_jobs=number("tree_max_jobs", DEFAULT_TREE_MAX_JOBS, int),
        lease_seconds=number("lease_seconds", 30.0),
        heartbeat_interval=number("heartbeat_interval", 5.0),
        max_attempts=number("max_attempts", 3, int),
        listen_notify=str(_get(config, "listen_notify", "on")).lower() not in ("off", "false", "no", "0"),
        stop_timeout=number("stop_timeout", 5.0),
        listjobs_pending_limit=number("listjobs_pending_limit", 1000, int),
        log_max_bytes=number("log_max_bytes", 1024 * 1024, int),
        database_pool_size=number("database_pool_size", 2, int),
        database_timeout=number("database_timeout", 30.0),
        listen_url=unambiguous(os.environ.get(LISTEN_URL_VARIABLE) or _get(config, LISTEN_URL_OPTION, ""),
                               f"{LISTEN_URL_VARIABLE} or '{LISTEN_URL_OPTION}'"),
        on_lease_lost=on_lease_lost,
        poll_interval=number("poll_interval", 5.0),
        default_retries=number("default_retries", 0, int),
        past_due_seconds=number("past_due_seconds", 60.0),
        vacuum_interval=number("vacuum_interval", 5.0),
        max_request_bytes=number("max_request_bytes", 8 * 1024 * 1024, int),
        max_egg_bytes=number("max_egg_bytes", 100 * 1024 * 1024, int),
        warm_start=str(_get(config, "warm_start", "on")).lower() in ("on", "true", "yes", "1"),
        warm_processes=number("warm_processes", 4, int),
        warm_idle_timeout=number("warm_idle_timeout", 300.0),
        stats_interval=number("stats_interval", 30.0),
        max_runtime=number("max_runtime", 0.0) or None,
        stall_timeout=number("stall_timeout", 0.0) or None,
        cancel_timeout=number("cancel_timeout", 300.0),
        start_timeout=number("start_timeout", 120.0) or None,
        webhook_retry_hours=number("webhook_retry_hours", 24.0),
        webhook_timeout=number("webhook_timeout", 10.0),
        webhook_backoff=number("webhook_backoff", 10.0),
        webhook_backoff_max=number("webhook_backoff_max", 3600.0),
        crawl_users=_switch(config, "crawl_users", True),
        crawl_uid_range=uid_range(str(_get(config, "crawl_uid_range", "") or "20000-29999")),
        node_user=str(_get(config, "node_user", "") or "").strip(),
        crawls_dir=str(_get(config, "crawls_dir", "") or "crawls"),
        crawl_landlock=_switch(config, "crawl_landlock", True),
        crawl_paths=crawl_paths(str(_get(config, "crawl_paths", "") or "")),
    )
    for option in ("dead_to_keep", "tree_max_jobs"):
        if (getattr(result, option) or 0) < 0:
            raise ConfigurationError(f"'{option}' may not be negative")
    if result.database_pool_size < 1:
        raise ConfigurationError("'database_pool_size' must be at least 1")
    for option in ("max_request_bytes", "max_egg_bytes"):
        if getattr(result, option) < 1:
            raise ConfigurationError(f"'{option}' must be at least 1 (bytes of a request's body)")
    if result.stats_interval <= 0:
        raise ConfigurationError("'stats_interval' must be more than 0 (seconds)")
    for option in ("max_runtime", "stall_timeout", "start_timeout"):
        if (getattr(result, option) or 0) < 0:
            raise ConfigurationError(f"'{option}' may not be negative (seconds; 0 turns it off)")
    if result.cancel_timeout <= 0:
        raise ConfigurationError("'cancel_timeout' must be more than 0 seconds")
    for option in ("webhook_timeout", "webhook_backoff", "webhook_backoff_max"):
        if getattr(result, option) <= 0:
            raise ConfigurationError(f"'{option}' must be more than 0 seconds")
    if result.warm_processes < 1:
        raise ConfigurationError("'warm_processes' must be at least 1 (warm_start = off spawns every crawl cold)")
    if result.on_lease_lost == "stop" and result.stop_deadline <= result.heartbeat_interval:
        raise ConfigurationError(
            f"on_lease_lost = stop needs lease_seconds ({result.lease_seconds:g}) > two heartbeat intervals "
            f"({result.lease_margin:g}) + stop_timeout ({result.stop_timeout:g}) + one heartbeat interval: "
            "raise lease_seconds"
        )
    return result


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
