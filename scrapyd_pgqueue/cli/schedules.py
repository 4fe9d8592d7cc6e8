"""The operator's schedules: ``scrapyd-pgqueue periodic add|list|remove|pause|resume`` and ``limit set|list|remove``.

Like the other operator commands they talk to the database directly (``store.ScheduleStore``): they work with every
node down, and the nodes see the change at once (a NOTIFY) or at their next look. Tables for people; ``--json``
for scripts. ``job_requests.periodic_job`` applies schedule.json's rules to a periodic job's spider arguments and
settings, here and in the HTTP services.
"""

from __future__ import annotations

from scrapyd_pgqueue.cli.output import fail, print_json, print_listing, subcommand, when
from scrapyd_pgqueue.job_rules.periodic_jobs import periodic_job

PERIODIC_HELP = "jobs fired on a schedule (cron or every N seconds) by whichever node is alive, once per due time"
LIMIT_HELP = "cluster-wide limits: at most N crawls of a spider at once on all nodes together"


def add_commands(commands, database_url_argument) -> None:
    """Register ``periodic`` and ``limit`` (each with its own subcommands) on the ``scrapyd-pgqueue`` parser."""

    def group(name, help_text):
        parser = commands.add_parser(name, help=help_text, description=help_text)
        return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")

    def action(actions, name, run, help_text):
        return subcommand(actions, database_url_argument, name, run, help_text)

    periodic = group("periodic", PERIODIC_HELP)
    add = action(periodic, "add", run_add, "add a periodic job")
    add.add_argument("name", metavar="NAME", help="the periodic job's name, unique in the cluster")
    add.add_argument("--project", required=True)
    add.add_argument("--spider", required=True)
    timing = add.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", metavar="EXPR", help="a cron expression, e.g. '0 3 * * *' (in --timezone)")
    timing.add_argument("--every", metavar="SECONDS", type=float, help="fire every SECONDS seconds")
    add.add_argument("--timezone", default="UTC", metavar="TZ", help="the cron expression's time zone (default UTC)")
    add.add_argument("--priority", type=float, default=0.0, help="each fired job's priority (default 0)")
    add.add_argument("-a", dest="args", action="append", default=[], metavar="ARG=VALUE", help="a spider argument")
    add.add_argument("-s", dest="settings", action="append", default=[], metavar="SETTING=VALUE",
                     help="a Scrapy setting of the crawl")
    add.add_argument("--overlap", choices=("skip", "queue"), default="skip",
                     help="skip (default): no firing while the previous fired job still waits or runs; queue: fire")
    add.add_argument("--max-runtime", type=float, metavar="SECONDS",
                     help="each fired job's _max_runtime: stopped past it, outcome timeout (default: the node's)")
    add.add_argument("--stall-timeout", type=float, metavar="SECONDS",
                     help="each fired job's _stall_timeout: stopped after SECONDS without a request, response or "
                          "item, outcome stalled (default: the node's)")
    add.add_argument("--tags", metavar="TAG,TAG",
                     help="each fired job's _tags: only nodes with all of them run it (default: the spider's route)")
    listing = action(periodic, "list", run_list, "list the periodic jobs")
    listing.add_argument("--project", help="only this project's")
    for name, run, help_text in (
        ("remove", run_remove, "remove a periodic job (jobs it fired stay)"),
        ("pause", run_pause, "stop firing a periodic job until resumed"),
        ("resume", run_resume, "fire a paused periodic job again, from its next due time"),
    ):
        action(periodic, name, run, help_text).add_argument("name", metavar="NAME")

    limit = group("limit", LIMIT_HELP)
    limit_set = action(limit, "set", run_limit_set, "limit a spider's crawls running at once in the cluster")
    limit_set.add_argument("project", metavar="PROJECT")
    limit_set.add_argument("spider", metavar="SPIDER")
    limit_set.add_argument("max_running", metavar="N", type=int)
    action(limit, "list", run_limit_list, "list the limits, with how many crawls of each spider run now")
    limit_remove = action(limit, "remove", run_limit_remove, "remove a spider's limit")
    limit_remove.add_argument("project", metavar="PROJECT")
    limit_remove.add_argument("spider", metavar="SPIDER")


def _store(args):
    from scrapyd_pgqueue.store import ScheduleStore

    return ScheduleStore.for_url(args.database_url)


def _pairs(what: str, given: list[str]) -> dict[str, str]:
    """NAME=VALUE options as a dict; ValueError naming a malformed one."""
    pairs = {}
    for item in given:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise ValueError(f"{what} must be NAME=VALUE, not {item!r}")
        pairs[name] = value
    return pairs


def _schedule(row) -> str:
    return f"cron '{row.cron}' {row.timezone}" if row.cron is not None else f"every {row.every_seconds:g}s"


# --- periodic ----------------------------------------------------------------------------------------------------


def run_add(args) -> int:
    from scrapyd_pgqueue.job_rules.job_requests import RefusedJob
    from scrapyd_pgqueue.job_rules.timing import InvalidScheduleError
    from scrapyd_pgqueue.store import DuplicateScheduleError

    try:
        job = periodic_job(
            args.name, args.project, args.spider, cron=args.cron, every=args.every, timezone=args.timezone,
            priority=args.priority, args=_pairs("-a", args.args), settings=_pairs("-s", args.settings),
            overlap=args.overlap, max_runtime=args.max_runtime, stall_timeout=args.stall_timeout, tags=args.tags,
        )
        due = _store(args).add_periodic(job)
    except (ValueError, RefusedJob, InvalidScheduleError, DuplicateScheduleError) as e:
        return fail(str(e))
    if args.json:
        print_json({"name": args.name, "next_fire_time": due})
    else:
        print(f"Periodic job {args.name} added: {args.project}/{args.spider}, first due {when(due)}.")
    return 0


def run_list(args) -> int:
    return print_listing(
        args, "periodic", "Periodic jobs", _store(args).list_periodic(args.project),
        ["NAME", "PROJECT", "SPIDER", "SCHEDULE", "OVERLAP", "STATE", "NEXT", "LAST JOB", "LAST STATUS", "FIRED",
         "SKIPPED"],
        lambda r: (r.name, r.project, r.spider, _schedule(r), r.overlap, "paused" if r.paused else "active",
                   when(r.next_fire_time), r.last_job, r.last_status, r.fired, r.skipped),
    )


def run_remove(args) -> int:
    return _change(args, "remove_periodic", "removed", {"removed": True})


def run_pause(args) -> int:
    return _change(args, "pause_periodic", "paused", {"paused": True})


def run_resume(args) -> int:
    return _change(args, "resume_periodic", "active", {"paused": False})


def _change(args, operation: str, state: str, answer: dict) -> int:
    from scrapyd_pgqueue.store import ScheduleNotFoundError

    try:
        due = getattr(_store(args), operation)(args.name)
    except ScheduleNotFoundError as e:
        return fail(str(e))
    if due is not None:
        answer = {**answer, "next_fire_time": due}
    if args.json:
        print_json({"name": args.name, **answer})
    else:
        print(f"Periodic job {args.name} {state}{f', next due {when(due)}' if due is not None else ''}.")
    return 0


# --- limit -------------------------------------------------------------------------------------------------------


def run_limit_set(args) -> int:
    from scrapyd_pgqueue.job_rules.timing import InvalidScheduleError

    try:
        _store(args).set_limit(args.project, args.spider, args.max_running)
    except InvalidScheduleError as e:
        return fail(str(e))
    if args.json:
        print_json({"project": args.project, "spider": args.spider, "max_running": args.max_running})
    else:
        print(f"At most {args.max_running} crawls of {args.project}/{args.spider} at once in the cluster.")
    return 0


def run_limit_list(args) -> int:
    return print_listing(args, "limits", "Limits", _store(args).list_limits(),
                         ["PROJECT", "SPIDER", "MAX RUNNING", "RUNNING"],
                         lambda row: (row.project, row.spider, row.max_running, row.running))


def run_limit_remove(args) -> int:
    from scrapyd_pgqueue.store import ScheduleNotFoundError

    try:
        _store(args).remove_limit(args.project, args.spider)
    except ScheduleNotFoundError as e:
        return fail(str(e))
    if args.json:
        print_json({"project": args.project, "spider": args.spider, "removed": True})
    else:
        print(f"No limit on {args.project}/{args.spider} any more.")
    return 0
