"""``scrapyd-pgqueue``: the operator's command."""

# This module registers every subcommand (each other module of cli/ holds a group of them, its own add_commands)
# and runs the one given; cluster, migrate and grant are here.

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from scrapyd_pgqueue.cli import config_file, health, queue, routes, schedules, trees, webhooks
from scrapyd_pgqueue.config import DATABASE_URL_VARIABLE


def database_url_argument(parser: argparse.ArgumentParser, required: bool) -> None:
    """The database URL: ``$SCRAPYD_DATABASE_URL``, or a file (``--database-url-file``), or ``--database-url`` (any
    user of the host sees a command line, in ps: a password there is for a throwaway database only)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--database-url", action=UrlOnCommandLine, default=os.environ.get(DATABASE_URL_VARIABLE),
                        help="postgresql://user@host:5432/db")
    source.add_argument("--database-url-file", dest="database_url", type=secret_file, metavar="FILE",
                        default=argparse.SUPPRESS, help="a file holding the URL (a mounted secret, for example)")
    parser.set_defaults(database_url_required=required)
    parser.epilog = f"The database URL comes from ${DATABASE_URL_VARIABLE} unless an option gives it."


class UrlOnCommandLine(argparse.Action):
    """``--database-url``, with a warning when the URL carries a password: ps shows it to every user of the host."""

    def __call__(self, parser, namespace, value, option_string=None):
        from sqlalchemy import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            has_password = bool(make_url(value).password)
        except ArgumentError:
            has_password = False  # the command's own error says what is wrong with it
        if has_password:
            print(f"scrapyd-pgqueue: warning: a password on the command line is visible to every user of this "
                  f"host (ps): put the URL in ${DATABASE_URL_VARIABLE} or a file (--database-url-file)",
                  file=sys.stderr)
        setattr(namespace, self.dest, value)


def secret_file(path: str) -> str:
    """The first line of a file (a URL or a password), for options that must not carry a secret themselves."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.readline().strip()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e.strerror}") from None


def non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds (0 or more): {value!r}")
    return number


def _interrupt(signum, frame):
    # From the first signal on, the clean-up runs to its end: a second Ctrl-C (impatient, or a terminal that sends
    # it again) would otherwise interrupt the stop with a traceback and leave nodes or the database behind.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt  # SIGTERM (docker stop, kill) stops the cluster like Ctrl-C


def run_cluster(args: argparse.Namespace) -> int:
    """Start N Scrapyd nodes on loopback (and a throwaway Postgres when no URL is given) until Ctrl-C."""
    from scrapyd_pgqueue.database import db
    from scrapyd_pgqueue.local import devdb
    from scrapyd_pgqueue.local.cluster import LocalCluster

    # SIGINT explicitly too: a shell starts background jobs with SIGINT ignored, and Python keeps it ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    server = cluster = None
    try:
        url = args.database_url
        if not url:
            print("No database URL given: starting a throwaway Postgres ...", flush=True)
            server = devdb.throwaway_postgres()
            url = server.url
        config = {"max_proc": str(args.max_proc)}
        if args.poll_interval is not None:
            config["poll_interval"] = str(args.poll_interval)
        cluster = LocalCluster(url, args.nodes, directory=args.directory, config=config)
        if cluster.crawls_as_root:
            print(f"Warning: {cluster.crawls_as_root}", file=sys.stderr, flush=True)
        db.get_engine(url)  # migrate once, and fail early with a clear message
        cluster.start()
        for node in cluster.nodes:
            node.wait_serving()
        print(f"Database: {db.describe(url)}{' (throwaway)' if server else ''}")
        for node in cluster.nodes:
            print(f"  {node.name}: {node.url}   (log: {node.logfile})")
        print("Schedule on any node, for example:")
        print(f"  curl {cluster.nodes[0].url}schedule.json -d project=example -d spider=quotes")
        print("Ctrl-C stops every node" + (" and the database." if server else "."), flush=True)
        while all(node.process.poll() is None for node in cluster.nodes):
            time.sleep(1)
        print("A node exited; stopping the cluster.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopping ...", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # ended otherwise than by a signal: the same clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.remove()


def run_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the schema (nodes also do this on first use)."""
    from scrapyd_pgqueue.database import db

    db.get_engine(args.database_url)
    print(f"Schema of {db.describe(args.database_url)} is current.")
    return 0


def run_grant(args: argparse.Namespace) -> int:
    """Create or upgrade the schema, then create the node role (or bring its rights to a node's): idempotent."""
    from scrapyd_pgqueue.database import db, roles

    password = args.password or os.environ.get(roles.NODE_PASSWORD_VARIABLE)
    limits = roles.RoleLimits(args.lock_timeout, args.statement_timeout, args.idle_in_transaction_session_timeout,
                              args.connection_limit)
    try:
        granted = roles.grant_node_role(db.get_engine(args.database_url), args.role, password, limits)
    except db.DatabaseError as e:
        if "permission denied" not in str(e):
            raise
        raise db.DatabaseError(f"{e}: run grant as the schema's owner; creating a role or setting its password "
                               "needs CREATEROLE (or a superuser)") from None
    where = db.describe(args.database_url)
    print(f"Role {args.role} may use the queue in {where} as a node, and nothing more"
          f"{'' if password else ' (password unchanged)'}.")
    for warning in granted.warnings:
        print(f"scrapyd-pgqueue: warning: {warning}", file=sys.stderr)
    for risk in granted.risks:
        print(f"scrapyd-pgqueue: but {risk}: revoke that (docs/how-to/security.md)", file=sys.stderr)
    return 1 if granted.risks else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrapyd-pgqueue", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    cluster = commands.add_parser("cluster", help="run a local cluster of Scrapyd nodes on one queue")
    database_url_argument(cluster, required=False)
    cluster.add_argument("--nodes", type=int, default=3, help="Scrapyd nodes to start (default 3)")
    cluster.add_argument("--max-proc", type=int, default=2, help="crawls at once per node (default 2)")
    cluster.add_argument("--poll-interval", type=float,
                         help="seconds between polls (default: the poll_interval option's)")
    cluster.add_argument("--directory", help="where node directories go (default: a new temporary directory)")
    cluster.set_defaults(run=run_cluster)

    migrate = commands.add_parser("migrate", help="create or upgrade the database schema")
    database_url_argument(migrate, required=True)
    migrate.set_defaults(run=run_migrate)

    grant = commands.add_parser(
        "grant", help="create the nodes' database role with exactly a node's rights (run as the schema's owner)")
    database_url_argument(grant, required=True)
    grant.add_argument("role", metavar="ROLE", help="the node role, created if missing (for example scrapyd_node)")
    grant.add_argument("--password-file", dest="password", type=secret_file, metavar="FILE",
                       help="a file holding the role's password (default: $SCRAPYD_NODE_PASSWORD; neither: unchanged)")
    from scrapyd_pgqueue.database.roles import OTHER_ROLES_CONNECTIONS, RoleLimits

    for option, setting in (("--lock-timeout", "lock_timeout"), ("--statement-timeout", "statement_timeout"),
                            ("--idle-in-transaction-timeout", "idle_in_transaction_session_timeout")):
        grant.add_argument(option, dest=setting, type=non_negative, metavar="SECONDS",
                           help=f"the role's {setting} (0: none; default {RoleLimits.DEFAULTS[setting]:g}, set only "
                                "when the role has none)")
    grant.add_argument("--connection-limit", type=int, metavar="N",
                       help="the role's CONNECTION LIMIT (-1: none, until a grant without this option sets the "
                            f"default: max_connections less the reserved ones and {OTHER_ROLES_CONNECTIONS} for other "
                            "roles, set only when the role has none)")
    grant.set_defaults(run=run_grant)

    queue.add_commands(commands, database_url_argument)  # status, requeue, cancel, enqueue, prune
    schedules.add_commands(commands, database_url_argument)  # periodic add|list|..., limit set|list|remove
    trees.add_commands(commands, database_url_argument)  # tree JOB
    routes.add_commands(commands, database_url_argument)  # route set|list|remove
    webhooks.add_commands(commands, database_url_argument, secret_file)  # webhook add|list|remove
    health.add_command(commands)  # health [--ready]: the node's liveness and readiness checks
    config_file.add_command(commands)  # config: a complete scrapyd.conf, every option's default and help
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "database_url_required", False) and not args.database_url:
        parser.error(f"{args.command}: give the database URL in ${DATABASE_URL_VARIABLE} or --database-url-file")
    from scrapyd_pgqueue.config import ConfigurationError
    from scrapyd_pgqueue.database.db import DatabaseError

    try:
        return args.run(args)
    except (ConfigurationError, DatabaseError) as e:
        print(f"scrapyd-pgqueue: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
