"""``scrapyd-pgqueue health [--ready]``: the node's health checks, for Docker's HEALTHCHECK and Kubernetes' exec
probes. Exit 0 when healthy, 1 when not, with the reason on stderr.

Liveness (the default) asks the node's ``alive.json``, which the reactor answers without touching the database:
a stalled database does not fail it, so an orchestrator does not restart healthy nodes (and kill their crawls)
during a stall. Readiness (``--ready``) asks ``daemonstatus.json``, "ok" only when the node reaches the database.

The node is asked on loopback at its port (``SCRAPYD_HTTP_PORT``, else ``http_port`` of the configuration files
Scrapyd reads, else 6800), with the basic auth credentials Scrapyd itself uses (``SCRAPYD_USERNAME`` and
``SCRAPYD_PASSWORD``, else ``username`` and ``password`` of the configuration): never on the command line.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.request

LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}  # a wildcard bind answers on loopback


def add_command(commands) -> None:
    """Register ``health`` on the ``scrapyd-pgqueue`` parser's subparsers."""
    text = "check this host's node: alive (default), or ready (--ready: it reaches the database)"
    parser = commands.add_parser("health", help=text, description=text)
    parser.add_argument("--ready", action="store_true",
                        help="ask daemonstatus.json: healthy only when its status is ok (it reaches the database)")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds to wait for the answer (default 4)")
    parser.set_defaults(run=run_health)


def node_url(config) -> str:
    bind = os.environ.get("SCRAPYD_BIND_ADDRESS") or config.get("bind_address", "127.0.0.1")
    port = os.environ.get("SCRAPYD_HTTP_PORT") or config.get("http_port", "6800")
    return f"http://{LOOPBACK.get(bind, bind)}:{port}/"


def credentials(config) -> tuple[str, str]:
    return (os.environ.get("SCRAPYD_USERNAME") or config.get("username", ""),
            os.environ.get("SCRAPYD_PASSWORD") or config.get("password", ""))


def run_health(args) -> int:
    from scrapyd.config import Config

    config = Config()
    endpoint = "daemonstatus.json" if args.ready else "alive.json"
    request = urllib.request.Request(node_url(config) + endpoint)
    username, password = credentials(config)
    if username and password:  # Scrapyd asks for credentials only when both are set
        token = base64.b64encode(f"{username}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            answer = json.load(response)
    except (OSError, ValueError) as e:  # refused, timed out, an HTTP error (401), not JSON
        print(f"scrapyd-pgqueue health: {endpoint}: {e}", file=sys.stderr)
        return 1
    if answer.get("status") != "ok":
        print(f"scrapyd-pgqueue health: {endpoint}: {answer.get('message', answer)}", file=sys.stderr)
        return 1
    print(json.dumps(answer))
    return 0
