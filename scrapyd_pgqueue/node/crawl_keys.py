"""A crawl holds no keys: what the node keeps out of its crawls' environments, and out of their reach.

A spider is untrusted code, run under its project's user or, where the node cannot switch users, under the node's
(``node/spawner.py``). Scrapyd copies the node's whole environment into every crawl and every ``scrapy list``; the
node's environment holds the database URL (with its password), the HTTP password and, under the chart,
``DATABASE_PASSWORD``. ``crawl_environment`` is the one decision of what a crawl may see: the cluster's secret
variables go by name, and any variable whose value holds one of the node's secret values goes too (a Secret mounted
under a name of the operator's choosing); so are ``PYTHONPATH`` entries that are not absolute (an empty or relative
one would put the crawl's working directory on ``sys.path``). The node itself is made not dumpable at start
(``crawl_process/not_dumpable.py``), so a crawl of the same user cannot read ``/proc/<node>/environ`` or attach to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit

# Variables that hold the cluster's keys, whatever their value.
SECRET_VARIABLES = frozenset({
    "SCRAPYD_DATABASE_URL", "SCRAPYD_PGQUEUE_DATABASE_URL", "SCRAPYD_LISTEN_URL", "SCRAPYD_USERNAME",
    "SCRAPYD_PASSWORD", "SCRAPYD_READONLY_USERNAME", "SCRAPYD_READONLY_PASSWORD", "DATABASE_PASSWORD", "PGPASSWORD",
    "PGPASSFILE", "PGSERVICEFILE",
})
# A secret value shorter than this is matched whole only: as a substring it would take PATH and friends with it.
SUBSTRING_MINIMUM = 6


def node_secrets(config, settings) -> set[str]:
    """The node's secret values: its database URLs and their passwords, its HTTP passwords (Scrapyd reads the
    environment first, then the config)."""
    secrets = set()
    for url in (settings.database_url, settings.listen_url):
        if url:
            secrets.add(url)
            password = _password(url)
            if password:
                secrets.update({password, unquote(password)})
    for variable, option in (("SCRAPYD_PASSWORD", "password"), ("SCRAPYD_READONLY_PASSWORD", "readonly_password")):
        secrets.add(os.environ.get(variable) or config.get(option, ""))
    secrets.discard("")
    return secrets


def _password(url: str) -> str:
    try:
        return urlsplit(url).password or ""
    except ValueError:
        return ""


def crawl_environment(environment: Mapping[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """``environment`` without the cluster's secret variables and without any variable whose value holds a secret."""
    secrets = [secret for secret in secrets if secret]
    long = [secret for secret in secrets if len(secret) >= SUBSTRING_MINIMUM]
    short = {secret for secret in secrets if len(secret) < SUBSTRING_MINIMUM}
    kept = {
        name: value for name, value in environment.items()
        if name not in SECRET_VARIABLES and value not in short and not any(secret in value for secret in long)
    }
    if "PYTHONPATH" in kept:
        kept["PYTHONPATH"] = os.pathsep.join(path for path in kept["PYTHONPATH"].split(os.pathsep) if os.path.isabs(path))
    return kept
