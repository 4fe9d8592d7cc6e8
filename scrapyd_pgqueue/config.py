"""Settings read from Scrapyd's ``Config`` and the environment, each option declared once.

Every option of a node is a field of ``Settings`` declared with ``option()``: its name, type, default (as written in
scrapyd.conf), environment variable and one line of help. ``settings()`` reads them; the reference page, the
commented ``scrapyd.cfg`` and ``scrapyd-pgqueue config`` are made from the same declarations (``OPTIONS``).
Options a node reads elsewhere (Scrapyd's own among them) are declared in ``NODE_OPTIONS``.

The environment wins over the config file: some Scrapyd code paths build ``Config(values={...})``, which reads no
file, and containers pass secrets through the environment.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from scrapyd_pgqueue.tags import InvalidTagsError, parse_tags

DATABASE_URL_VARIABLE = "SCRAPYD_DATABASE_URL"
NODE_NAME_VARIABLE = "SCRAPYD_NODE_NAME"
# Set by the node for each crawl: the path of the egg to run, or empty when the project has none.
EGG_FILE_VARIABLE = "SCRAPYD_PGQUEUE_EGG"
LEASE_LOST_ACTIONS = ("keep", "stop")

# Identifies this Scrapyd process: its row in scrapyd_node and the owner (lease holder) of the jobs it claims.
WORKER_ID = uuid.uuid4().hex


class ConfigurationError(RuntimeError):
    """The node's configuration cannot work; raised at start-up."""


@dataclass(frozen=True)
class Option:
    """One option as a user reads it: ``default`` as written in scrapyd.conf ("": unset), the environment
    ``variable`` that wins over the file, one line of ``help``, and the ``group`` it is listed under."""

    name: str
    default: str
    help: str
    group: str
    variable: str = ""
    parse: Callable[[str, str], typing.Any] | None = None  # (option, text) -> value; None: by the field's type
    scrapyd: bool = False  # Scrapyd's own option (its default is Scrapyd's), read by Scrapyd or by us


def option(default: str, help: str, group: str, *, variable: str = "", parse=None, repr: bool = True):
    """A field of ``Settings`` declared as an option (its name is the field's)."""
    return field(repr=repr, metadata={"option": Option("", default, help, group, variable, parse)})


# --- parsers: (option, text as written) -> value ----------------------------------------------------------------

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


def _url(name: str, url: str) -> str:
    """A database URL, or a ConfigurationError (which quotes none of it) when libpq may read it otherwise."""
    ambiguity = url_ambiguity(url)
    if ambiguity:
        raise ConfigurationError(f"the database URL of SCRAPYD_{name.upper()} or '{name}' is ambiguous: {ambiguity} "
                                 "(in scrapyd.conf, write each '%' as '%%')")
    return url


def _required_url(name: str, url: str) -> str:
    if not url:
        raise ConfigurationError(
            f"no database URL: set '{name}' in the [scrapyd] section of scrapyd.conf or the {DATABASE_URL_VARIABLE} "
            "environment variable (postgresql://user:password@host:5432/db)")
    return _url(name, url)


def _number(kind):
    def parse(name: str, text: str):
        try:
            return kind(text)
        except ValueError:
            raise ConfigurationError(f"'{name}' must be a number, not {text!r}") from None
    return parse


def _count(name: str, text: str) -> int:
    count = _number(int)(name, text)
    if count < 0:
        raise ConfigurationError(f"'{name}' must be 0 or more, not {text!r}")
    return count


def _switch(name: str, text: str) -> bool:
    value = text.lower()
    if value not in ("on", "off", "true", "false", "yes", "no", "1", "0"):
        raise ConfigurationError(f"'{name}' must be on or off, not {text!r}")
    return value in ("on", "true", "yes", "1")


def _seconds_or_off(name: str, text: str) -> float | None:
    """Seconds, where 0 (or unset) turns the limit off."""
    return (_number(float)(name, text) or None) if text else None


def _lease_lost(name: str, text: str) -> str:
    if text.lower() not in LEASE_LOST_ACTIONS:
        raise ConfigurationError(f"'{name}' must be one of {', '.join(LEASE_LOST_ACTIONS)}, not {text!r}")
    return text.lower()


def _tags(name: str, text: str) -> tuple[str, ...]:
    try:
        return parse_tags(text)
    except InvalidTagsError as e:
        raise ConfigurationError(f"SCRAPYD_{name.upper()} or '{name}': {e}") from None


def uid_range(name: str, text: str) -> tuple[int, int]:
    """FIRST-LAST, uids above root's and the system's (1000 up), at least one."""
    first, _, last = text.partition("-")
    try:
        first_uid, last_uid = int(first), int(last)
    except ValueError:
        raise ConfigurationError(f"'{name}' must be FIRST-LAST (20000-29999), not {text!r}") from None
    if not 1000 <= first_uid <= last_uid < 2**31 - 1:
        raise ConfigurationError(f"'{name}' must run from 1000 up, first <= last, not {text!r}")
    return first_uid, last_uid


def _absolute_paths(name: str, text: str) -> tuple[str, ...]:
    paths = tuple(path.strip() for path in text.split(",") if path.strip())
    relative = [path for path in paths if not os.path.isabs(path)]
    if relative:
        raise ConfigurationError(f"'{name}' takes absolute paths, not {relative[0]!r}")
    return paths


_BY_TYPE = {"int": _number(int), "float": _number(float), "bool": _switch, "str": lambda name, text: text}


# --- the options -------------------------------------------------------------------------------------------------

DATABASE, NODE, LEASES, JOBS, CRAWLS, WATCHDOG, WARM, WEBHOOKS, BOUNDARY, SCRAPYD = (
    "Database", "Node", "Polling and leases", "Jobs", "Crawls", "Watchdog", "Warm starts", "Webhooks",
    "Crawl boundary", "Scrapyd's own")


@dataclass(frozen=True)
class Settings:
    database_url: str = option(
        "", "The queue's database, postgresql://user:password@host:5432/db; its role should be a node role "
        "(scrapyd-pgqueue grant). Keep it in the environment: it holds a password.", DATABASE,
        variable=DATABASE_URL_VARIABLE, parse=_required_url, repr=False)
    listen_url: str = option(
        "", "Where the one LISTEN connection goes when database_url is a transaction pooler (PgBouncer): Postgres "
        "itself. Without it, behind a pooler, the node polls only.", DATABASE, variable="SCRAPYD_LISTEN_URL",
        parse=_url, repr=False)
    database_pool_size: int = option(
        "2", "Connections of the node's pool, no overflow; with the listener (which carries the lease) the node's "
        "budget is database_pool_size + 1.", DATABASE)
    database_timeout: float = option(
        "30", "Seconds any operation (a web request included) waits for the database before it answers an error.",
        DATABASE)
    vacuum_interval: float = option(
        "5", "Seconds between two VACUUMs of spider_job and the other tables the nodes churn (job_log, scrapyd_node, "
        "spider_tree, webhook_event, crawl_request, crawl_slot) by the nodes that finish crawls (cluster-wide), each "
        "when it has dead rows; needs the tables' owner; 0 leaves them to autovacuum.", DATABASE)
    node_name: str = option(
        "", "The node's name in listjobs.json, the pages and the metrics; unset: the host name.", NODE,
        variable=NODE_NAME_VARIABLE, parse=lambda name, text: text or socket.gethostname())
    node_tags: tuple[str, ...] = option(
        "", "The node's tags, comma-separated: it claims only jobs whose required tags (_tags, a spider's route) it "
        "all has.", NODE, variable="SCRAPYD_NODE_TAGS", parse=_tags)
    max_nodes: int = option(
        "10000", "The most nodes the scrapyd_pgqueue_wanted_nodes gauge of /metrics answers: your autoscaler's "
        "maximum replica count. The gauge reads waiting jobs up to that many nodes' worth.", NODE)
    poll_interval: float = option(
        "5", "Seconds between two polls of the queue: the floor under NOTIFY and delayed jobs' timers.", LEASES)
    listen_notify: bool = option(
        "on", "Whether the node listens for NOTIFY to start jobs at once; polling stays as the floor.", LEASES)
    listen_slots: int = option(
        "8", "How many nodes of the cluster LISTEN at once (the same on every node): a node takes a free slot while it "
        "wants work and gives it up when busy; the others poll. Before Postgres 19 each NOTIFY interrupts every "
        "listening session, so a few listeners keep schedule.json fast whatever the cluster's size; 0: every node "
        "polls.", LEASES, parse=_count)
    heartbeat_interval: float = option("5", "Seconds between two renewals of the node's lease.", LEASES)
    lease_seconds: float = option(
        "30", "Seconds without a heartbeat after which any live node recovers a node's running jobs.", LEASES)
    max_attempts: int = option(
        "3", "Claims of one job (its first run included) before recovery gives it up as lost.", LEASES)
    on_lease_lost: str = option(
        "keep", "What a node does with its crawls once it could not renew its lease for too long: keep them (a cut "
        "longer than the lease may run a job twice), or stop them before another node may take them over.", LEASES,
        parse=_lease_lost)
    stop_timeout: float = option(
        "5", "Seconds a stopping node (SIGTERM) lets its crawls run on before it hands their jobs back.", LEASES)
    finished_to_keep: int = option(
        "100", "Finished jobs kept for listjobs.json, for the whole cluster.", JOBS)
    dead_to_keep: int | None = option(
        "", "Dead jobs (out of retries) kept beside them, newest first; unset: every one, until requeued or pruned.",
        JOBS)
    tree_max_jobs: int = option(
        "100000", "Jobs a crawl tree may ever have, its root included: a child past it is refused; 0: no cap.", JOBS)
    max_workers: int = option(
        "64", "Workers one crawl may have (schedule.json's _workers, and those that join it with _join).", JOBS)
    default_retries: int = option("0", "Retries of a failed crawl when schedule.json gives no _retries.", JOBS)
    past_due_seconds: float = option(
        "60", "Seconds a pending job may wait to be claimed before the counts call it past due.", JOBS)
    listjobs_pending_limit: int = option(
        "1000", "Pending jobs listjobs.json returns when not given pending_limit: a huge backlog stays fast to list.",
        JOBS)
    log_max_bytes: int = option(
        "1048576", "Bytes of a finished job's log (its tail) stored in the database for every node to serve; 0: "
        "none.", JOBS)
    max_request_bytes: int = option(
        "8388608", "Bytes of a request's body, refused before it is read (Scrapyd's JSON error).", JOBS)
    max_egg_bytes: int = option("104857600", "Bytes of addversion.json's body, the egg.", JOBS)
    stats_interval: float = option(
        "30", "Seconds between two reports of a running crawl's stats to its node, and between two writes of them.",
        CRAWLS)
    max_runtime: float | None = option(
        "", "Seconds a crawl may run before the watchdog stops it (outcome timeout); a job's _max_runtime wins; "
        "unset or 0: off.", WATCHDOG, parse=_seconds_or_off)
    stall_timeout: float | None = option(
        "", "Seconds without a new request, response or item after which the watchdog stops a crawl (outcome "
        "stalled); a job's _stall_timeout wins; unset or 0: off.", WATCHDOG, parse=_seconds_or_off)
    cancel_timeout: float = option(
        "300", "Seconds a crawl asked to stop (cancel.json, the watchdog) may live on before it is SIGKILLed.",
        WATCHDOG)
    start_timeout: float | None = option(
        "120", "Seconds a crawl's spider may take to open before the crawl is killed and its job handed back; 0: "
        "off.", WATCHDOG, parse=_seconds_or_off)
    warm_start: bool = option(
        "on", "Crawls forked from a warm process per project version instead of a new Python each.", WARM)
    warm_processes: int = option(
        "4", "Warm processes a node keeps, the least recently used retired first.", WARM)
    warm_idle_timeout: float = option("300", "Seconds an unused warm process lives on.", WARM)
    webhook_retry_hours: float = option(
        "24", "Hours a webhook event is retried before it is given up.", WEBHOOKS)
    webhook_timeout: float = option(
        "10", "Seconds one delivery may take; no answer in time, or not a 2xx, is a failed attempt.", WEBHOOKS)
    webhook_backoff: float = option(
        "10", "Seconds before the first retry of an event, doubled each attempt (with jitter).", WEBHOOKS)
    webhook_backoff_max: float = option("3600", "The longest delay between two attempts, seconds.", WEBHOOKS)
    crawl_users: bool = option(
        "on", "A node started as root runs each project's crawls under a uid of its own, and itself as node_user; "
        "off: crawls run as the node's user (one trust domain).", BOUNDARY)
    crawl_uid_range: tuple[int, int] = option(
        "20000-29999", "The uids projects get (assigned once in the database: the same on every node), FIRST-LAST.",
        BOUNDARY, parse=uid_range)
    node_user: str = option(
        "", "The user a root-started node drops to (a name or uid); unset: the working directory's owner, else the "
        "uid just below crawl_uid_range.", BOUNDARY)
    crawls_dir: str = option(
        "crawls", "Where each crawl gets a fresh directory of its own (its working directory and HOME), under one "
        "per project.", BOUNDARY)
    crawl_landlock: bool = option(
        "on", "Crawls restrict their own file access with Landlock where the kernel has it: they write only to "
        "their own directory, log, items and crawl_paths.", BOUNDARY)
    crawl_paths: tuple[str, ...] = option(
        "", "Absolute paths, comma-separated, that crawls may also write to (directories your spiders write to).",
        BOUNDARY, parse=_absolute_paths)

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


# Options a node reads elsewhere than ``settings()``: Scrapyd's own (default: Scrapyd's), and the web gate's.
NODE_OPTIONS = (
    Option("application", "", "The one line that makes a Scrapyd node a cluster node: "
           "scrapyd_pgqueue.application.", SCRAPYD, scrapyd=True),
    Option("bind_address", "", "The address the node listens on; beyond loopback it refuses to start without a "
           "username and password.", SCRAPYD, variable="SCRAPYD_BIND_ADDRESS", scrapyd=True),
    Option("http_port", "", "The node's HTTP port.", SCRAPYD, variable="SCRAPYD_HTTP_PORT", scrapyd=True),
    Option("username", "", "Basic authentication's user for the API and the pages.", SCRAPYD,
           variable="SCRAPYD_USERNAME", scrapyd=True),
    Option("password", "", "Basic authentication's password; keep it in the environment.", SCRAPYD,
           variable="SCRAPYD_PASSWORD", scrapyd=True),
    Option("readonly_username", "", "A second user, with username and password, that may read the pages, the logs "
           "and the services that only read, and write nothing.", NODE, variable="SCRAPYD_READONLY_USERNAME"),
    Option("readonly_password", "", "The read-only user's password; keep it in the environment.", NODE,
           variable="SCRAPYD_READONLY_PASSWORD"),
    Option("node_url", "", "The URL this node is reached at, shown in the pages and webhooks' bodies; unset: "
           "http://<host name>:<http_port>/.", NODE, variable="SCRAPYD_NODE_URL"),
    Option("max_proc", "", "Crawls at once on this node; the cluster's capacity is the sum over nodes.", SCRAPYD,
           scrapyd=True),
    Option("logs_dir", "", "Where crawls write their logs, one directory per project.", SCRAPYD, scrapyd=True),
    Option("items_dir", "", "Where crawls write their items (a feed per job); unset: no feed.", SCRAPYD,
           scrapyd=True),
    Option("eggs_dir", "", "Where the node caches the eggs it fetched from the database.", SCRAPYD, scrapyd=True),
    Option("dbs_dir", "", "Scrapyd's directory for its per-node queues (unused by the shared queue).", SCRAPYD,
           scrapyd=True),
)


def _declared(spec: dataclasses.Field) -> Option:
    return dataclasses.replace(spec.metadata["option"], name=spec.name)


# Every option, Scrapyd's own first.
OPTIONS: tuple[Option, ...] = (*NODE_OPTIONS, *(_declared(spec) for spec in dataclasses.fields(Settings)))


def _get(config, option, default=None):
    if config is None:
        return default
    return config.get(option, default)


def _value(config, spec: dataclasses.Field, kind: str):
    declared = spec.metadata["option"]
    given = (os.environ.get(declared.variable) if declared.variable else None) or _get(config, spec.name, "")
    text = str(given if given is not None else "").strip() or declared.default
    if declared.parse is not None:
        return declared.parse(spec.name, text)
    optional = kind.endswith(" | None")
    if optional and text == "":
        return None
    return _BY_TYPE[kind.removesuffix(" | None")](spec.name, text)


def database_url(config=None) -> str:
    """The database URL alone (a crawl's egg storage needs no other setting)."""
    spec = next(spec for spec in dataclasses.fields(Settings) if spec.name == "database_url")
    return _value(config, spec, "str")


def settings(config=None) -> Settings:
    """The node's settings from ``config`` (Scrapyd's Config, or any mapping with ``get``) and the environment;
    ConfigurationError says what cannot work."""
    result = Settings(**{spec.name: _value(config, spec, spec.type) for spec in dataclasses.fields(Settings)})
    for name in ("dead_to_keep", "tree_max_jobs", "max_runtime", "stall_timeout", "start_timeout"):
        if (getattr(result, name) or 0) < 0:
            raise ConfigurationError(f"'{name}' may not be negative")
    for name in ("database_pool_size", "warm_processes", "max_request_bytes", "max_egg_bytes", "max_workers",
                 "max_nodes"):
        if getattr(result, name) < 1:
            raise ConfigurationError(f"'{name}' must be at least 1")
    for name in ("stats_interval", "cancel_timeout", "webhook_timeout", "webhook_backoff", "webhook_backoff_max"):
        if getattr(result, name) <= 0:
            raise ConfigurationError(f"'{name}' must be more than 0 seconds")
    if result.on_lease_lost == "stop" and result.stop_deadline <= result.heartbeat_interval:
        raise ConfigurationError(
            f"on_lease_lost = stop needs lease_seconds ({result.lease_seconds:g}) > two heartbeat intervals "
            f"({result.lease_margin:g}) + stop_timeout ({result.stop_timeout:g}) + one heartbeat interval: "
            "raise lease_seconds"
        )
    return result
