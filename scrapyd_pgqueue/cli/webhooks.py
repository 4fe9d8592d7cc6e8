"""The operator's webhooks: ``scrapyd-pgqueue webhook add|list|remove``.

Stored in the database (``store.WebhookStore``), for the whole cluster: every node delivers their events. The
secret is read from a file (never a command line), and no output shows it.
"""

from __future__ import annotations

import argparse
import functools
import urllib.parse

from scrapyd_pgqueue.cli.output import fail, print_json, print_listing, subcommand, when
from scrapyd_pgqueue.store.webhooks import EVENTS, FORMATS

WEBHOOK_HELP = "post to a URL when a job fails or ends, a crawl tree completes, or a periodic job skips a firing"


def add_commands(commands, database_url_argument, secret_file) -> None:
    """Register ``webhook`` and its subcommands on the ``scrapyd-pgqueue`` parser."""
    webhook = commands.add_parser("webhook", help=WEBHOOK_HELP, description=WEBHOOK_HELP)
    actions = webhook.add_subparsers(dest="webhook_command", required=True, metavar="COMMAND")

    action = functools.partial(subcommand, actions, database_url_argument)

    add = action("add", run_add, "add a webhook")
    add.add_argument("url", metavar="URL", type=webhook_url, help="where to POST (http or https)")
    add.add_argument("--on", dest="events", required=True, type=event_list, metavar="EVENTS",
                     help=f"comma-separated, of: {', '.join(EVENTS)} (ended: a job ended, whatever its outcome)")
    add.add_argument("--project", help="only this project's events (default: every project's)")
    add.add_argument("--secret-file", dest="secret", type=secret_file, metavar="FILE",
                     help="a file holding the secret that signs each body (X-Scrapyd-Pgqueue-Signature)")
    add.add_argument("--format", choices=FORMATS, default="json",
                     help="json (default): the event; slack: {\"text\": ...} for a Slack incoming webhook")
    action("list", run_list, "list the webhooks, with their deliveries, failures and last error")
    remove = action("remove", run_remove, "remove a webhook (its undelivered events go with it)")
    remove.add_argument("id", metavar="ID", type=int)


def webhook_url(value: str) -> str:
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise argparse.ArgumentTypeError(f"not an http or https URL: {value!r}")
    return value


def event_list(value: str) -> list[str]:
    events = [event.strip() for event in value.split(",") if event.strip()]
    unknown = [event for event in events if event not in EVENTS]
    if unknown or not events:
        raise argparse.ArgumentTypeError(f"unknown event {unknown[0]!r}" if unknown else "no event given")
    return sorted(set(events), key=EVENTS.index)


def _store(args):
    from scrapyd_pgqueue.store.webhooks import WebhookStore

    return WebhookStore.for_url(args.database_url)


def run_add(args) -> int:
    if args.secret == "":
        return fail("the secret file is empty (its first line is the secret)")
    webhook_id = _store(args).add_webhook(args.url, args.events, args.project, args.format, args.secret)
    if args.json:
        print_json({"id": webhook_id})
    else:
        print(f"Webhook {webhook_id} added: {', '.join(args.events)}"
              f"{f' of project {args.project}' if args.project else ''}, {args.format}"
              f"{', signed' if args.secret else ''}.")
    return 0


def run_list(args) -> int:
    return print_listing(
        args, "webhooks", "Webhooks", _store(args).list_webhooks(),
        ["ID", "URL", "EVENTS", "PROJECT", "FORMAT", "SIGNED", "DELIVERED", "FAILED", "WAITING", "LAST ERROR"],
        lambda row: [row.id, row.url, ",".join(row.events), row.project or "(all)", row.format,
                     "yes" if row.signed else "no", row.deliveries, row.failures, row.waiting,
                     f"{when(row.last_error_time)} {row.last_error}" if row.last_error else ""],
    )


def run_remove(args) -> int:
    from scrapyd_pgqueue.store.webhooks import WebhookNotFoundError

    try:
        _store(args).remove_webhook(args.id)
    except WebhookNotFoundError as e:
        return fail(str(e))
    if args.json:
        print_json({"removed": args.id})
    else:
        print(f"Webhook {args.id} removed.")
    return 0
