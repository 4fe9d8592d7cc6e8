"""Routes per spider: ``scrapyd-pgqueue route set|list|remove``.

A route sends the jobs of one spider scheduled without ``_tags`` (by clients that know nothing of tags: ScrapydWeb,
Gerapy, scrapyd-client) to the nodes with the route's tags. A job's own ``_tags`` replaces its spider's route.
Stored in the database (``store.pools.PoolStore``), for the whole cluster; read by every enqueue.
"""

from __future__ import annotations

import argparse
import functools

from scrapyd_pgqueue.cli.output import fail, print_json, print_listing, subcommand

ROUTE_HELP = "send a spider's jobs scheduled without _tags to the nodes with some tags"


def add_commands(commands, database_url_argument) -> None:
    """Register ``route`` and its subcommands on the ``scrapyd-pgqueue`` parser."""
    route = commands.add_parser("route", help=ROUTE_HELP, description=ROUTE_HELP)
    actions = route.add_subparsers(dest="route_command", required=True, metavar="COMMAND")
    action = functools.partial(subcommand, actions, database_url_argument)

    set_route = action("set", run_set, "route a spider's jobs to the nodes with all of --tags (replaces its route)")
    set_route.add_argument("project", metavar="PROJECT")
    set_route.add_argument("spider", metavar="SPIDER")
    set_route.add_argument("--tags", required=True, type=tag_list, metavar="TAG,TAG",
                           help="the tags a node needs to run the spider's jobs")
    listing = action("list", run_list, "list the routes")
    listing.add_argument("--project", help="only this project's")
    remove = action("remove", run_remove, "remove a spider's route (its jobs then run on any node)")
    remove.add_argument("project", metavar="PROJECT")
    remove.add_argument("spider", metavar="SPIDER")


def tag_list(value: str) -> tuple[str, ...]:
    from scrapyd_pgqueue.tags import InvalidTagsError, parse_tags

    try:
        tags = parse_tags(value)
    except InvalidTagsError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not tags:
        raise argparse.ArgumentTypeError("no tag given (route remove sends the spider's jobs anywhere)")
    return tags


def _store(args):
    from scrapyd_pgqueue.store.pools import PoolStore

    return PoolStore.for_url(args.database_url)


def run_set(args) -> int:
    from scrapyd_pgqueue.job_rules.checks import InvalidJobError

    try:
        _store(args).set_route(args.project, args.spider, args.tags)
    except InvalidJobError as e:
        return fail(str(e))
    if args.json:
        print_json({"project": args.project, "spider": args.spider, "tags": list(args.tags)})
    else:
        print(f"Jobs of {args.project}/{args.spider} scheduled without _tags run on nodes tagged "
              f"{', '.join(args.tags)}.")
    return 0


def run_list(args) -> int:
    return print_listing(args, "routes", "Routes", _store(args).routes(args.project), ["PROJECT", "SPIDER", "TAGS"],
                         lambda row: (row.project, row.spider, ",".join(row.tags)))


def run_remove(args) -> int:
    if not _store(args).remove_route(args.project, args.spider):
        return fail(f"no route for {args.project}/{args.spider}")
    if args.json:
        print_json({"project": args.project, "spider": args.spider, "removed": True})
    else:
        print(f"No route for {args.project}/{args.spider} any more: its jobs run on any node.")
    return 0
