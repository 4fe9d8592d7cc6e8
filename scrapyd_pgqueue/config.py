"""Settings read from Scrapyd's ``Config`` and the environment.

The environment wins over the config file: some Scrapyd code paths build ``Config(values={...})``, which
reads no file, and containers pass secrets through the environment.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field

DATABASE_URL_OPTION = "database_url"
DATABASE_URL_VARIABLE = "SCRAPYD_DATABASE_URL"
NODE_NAME_VARIABLE = "SCRAPYD_NODE_NAME"

# Identifies this Scrapyd process: its row in scrapyd_node and the owner (lease holder) of the jobs it claims.
WORKER_ID = uuid.uuid4().hex


class ConfigurationError(RuntimeError):
    """The node's configuration cannot work; raised at start-up."""


@dataclass(frozen=True)
class Settings:
    database_url: str = field(repr=False)  # holds the password: never in a log line
    node_name: str
    finished_to_keep: int = 100
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
    return url


def node_name(config=None) -> str:
    # Scrapyd's own Root uses config "node_name" with the host name as default: agree with it.
    return os.environ.get(NODE_NAME_VARIABLE) or _get(config, "node_name", "") or socket.gethostname()


def settings(config=None) -> Settings:
    def number(option, default, kind=float):
        value = _get(config, option, "")
        try:
            return kind(value) if value != "" else default
        except ValueError as e:
            raise ConfigurationError(f"'{option}' must be a number, not {value!r}") from e

    return Settings(
        database_url=database_url(config),
        node_name=node_name(config),
        finished_to_keep=number("finished_to_keep", 100, int),
        lease_seconds=number("lease_seconds", 30.0),
        heartbeat_interval=number("heartbeat_interval", 5.0),
        max_attempts=number("max_attempts", 3, int),
        listen_notify=str(_get(config, "listen_notify", "on")).lower() not in ("off", "false", "no", "0"),
        stop_timeout=number("stop_timeout", 5.0),
        listjobs_pending_limit=number("listjobs_pending_limit", 1000, int),
        log_max_bytes=number("log_max_bytes", 1024 * 1024, int),
    )
