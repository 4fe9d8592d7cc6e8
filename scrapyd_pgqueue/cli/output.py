"""What every operator subcommand prints with: tables for people, JSON for scripts, times in local time, errors on
stderr; and the two look-ups they share (the cluster's store, a job's project)."""

from __future__ import annotations

import json
import sys

from scrapyd_pgqueue.services.answers import plain


def subcommand(parsers, database_url_argument, name: str, run, help_text: str):
    """One operator subcommand on ``parsers`` (argparse's subparsers): the database URL options, ``--json``, and the
    function that runs it."""
    parser = parsers.add_parser(name, help=help_text, description=help_text)
    database_url_argument(parser, required=True)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")
    parser.set_defaults(run=run)
    return parser


def print_listing(args, key: str, title: str, rows: list, headers: list[str], cells) -> int:
    """A list subcommand's answer: ``{key: rows}`` with --json, else its count under ``title`` and a table of
    ``cells(row)`` (nothing more when there is no row)."""
    if args.json:
        print_json({key: rows})
        return 0
    print(f"{title}: {len(rows)}")
    if rows:
        print(table(headers, [cells(row) for row in rows]))
    return 0


def all_jobs_store(args):
    from scrapyd_pgqueue.store import AllJobsStore

    return AllJobsStore.for_url(args.database_url)


def print_json(data) -> None:
    print(json.dumps(plain(data), indent=2, sort_keys=True))


def table(headers, rows) -> str:
    """Left-aligned columns, two spaces apart, under their headers (the headers alone for no rows)."""
    cells = [[str(header) for header in headers]]
    cells += [["" if value is None else str(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells)


def when(value) -> str:
    from scrapyd_pgqueue.store import local_time

    return "" if value is None else str(local_time(value).replace(microsecond=0))


def fail(message: str) -> int:
    print(f"scrapyd-pgqueue: {message}", file=sys.stderr)
    return 1


def resolve_project(store, args) -> str | None:
    if args.project:
        return args.project
    projects = store.projects_of_job(args.job)
    if len(projects) == 1:
        return projects[0]
    if not projects:
        fail(f"no job '{args.job}' in any project")
    else:
        fail(f"job id '{args.job}' exists in several projects ({', '.join(projects)}): give --project")
    return None
