"""``scrapyd-pgqueue``: the operator's command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from scrapyd_pgqueue import admin
from scrapyd_pgqueue.config import DATABASE_URL_VARIABLE


def database_url_argument(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument(
        "--database-url",
        default=os.environ.get(DATABASE_URL_VARIABLE),
        required=required and not os.environ.get(DATABASE_URL_VARIABLE),
        help=f"postgresql://user:password@host:5432/db (default: ${DATABASE_URL_VARIABLE})",
    )


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (docker stop, kill) stops the cluster like Ctrl-C


def run_cluster(args: argparse.Namespace) -> int:
    """Start N Scrapyd nodes on loopback (and a throwaway Postgres when no URL is given) until Ctrl-C."""
    from scrapyd_pgqueue import db, devdb
    from scrapyd_pgqueue.cluster import LocalCluster

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
        config = {"max_proc": str(args.max_proc), "poll_interval": str(args.poll_interval)}
        cluster = LocalCluster(url, args.nodes, directory=args.directory, config=config)
        db.get_engine(url)  # migrate once, and fail early with a clear message
        cluster.start()
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
        # A second Ctrl-C must not cut the clean-up short and leave nodes or the database behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.remove()


def run_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the schema (nodes also do this on first use)."""
    from scrapyd_pgqueue import db

    db.get_engine(args.database_url)
    print(f"Schema of {db.describe(args.database_url)} is current.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrapyd-pgqueue", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    cluster = commands.add_parser("cluster", help="run a local cluster of Scrapyd nodes on one queue")
    database_url_argument(cluster, required=False)
    cluster.add_argument("--nodes", type=int, default=3, help="Scrapyd nodes to start (default 3)")
    cluster.add_argument("--max-proc", type=int, default=2, help="crawls at once per node (default 2)")
    cluster.add_argument("--poll-interval", type=float, default=5.0, help="seconds between polls (default 5)")
    cluster.add_argument("--directory", help="where node directories go (default: a new temporary directory)")
    cluster.set_defaults(run=run_cluster)

    migrate = commands.add_parser("migrate", help="create or upgrade the database schema")
    database_url_argument(migrate, required=True)
    migrate.set_defaults(run=run_migrate)

    admin.add_commands(commands, database_url_argument)  # status, requeue, cancel, prune
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from scrapyd_pgqueue.config import ConfigurationError
    from scrapyd_pgqueue.db import DatabaseError

    try:
        return args.run(args)
    except (ConfigurationError, DatabaseError) as e:
        print(f"scrapyd-pgqueue: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
