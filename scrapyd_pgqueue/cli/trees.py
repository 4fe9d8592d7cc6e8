"""``scrapyd-pgqueue tree JOB``: a crawl tree at a glance (its counts, whether it is done, its newest failures).

Like the other operator commands it talks to the database directly (``store.AllJobsStore``); ``--json`` prints
what ``tree.json`` answers (``answers.tree_answer``, shared with the web service).
"""

from __future__ import annotations

from scrapyd_pgqueue.cli.output import all_jobs_store, fail, print_json, resolve_project, table, when
from scrapyd_pgqueue.services.answers import FAILURES_SHOWN, find_tree, tree_answer

TREE_HELP = "show a crawl tree: its jobs by state and outcome, whether it is done, its newest failures"


def add_commands(commands, database_url_argument) -> None:
    parser = commands.add_parser("tree", help=TREE_HELP, description=TREE_HELP)
    database_url_argument(parser, required=True)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (tree.json's answer)")
    parser.add_argument("job", metavar="JOB", help="a job of the tree (its root, or any job in it)")
    parser.add_argument("--project", help="the job's project (needed only when several projects have this id)")
    parser.add_argument("--failures", type=int, default=FAILURES_SHOWN, metavar="N",
                        help=f"newest failures shown (default {FAILURES_SHOWN})")
    parser.set_defaults(run=run_tree)


def run_tree(args) -> int:
    store = all_jobs_store(args)
    project = resolve_project(store, args)
    if project is None:
        return 1
    view = find_tree(store, project, args.job, args.failures)
    if view is None:
        return fail(f"no job '{args.job}' in project '{project}'")
    answer = tree_answer(view, args.failures)
    if args.json:
        print_json(answer)
        return 0
    state = "done" if view.done else f"open: {view.open} job{'s' if view.open != 1 else ''} not ended"
    state += " (cancelled)" if view.cancelled else ""
    print(f"Tree {view.root} of project {project}: {view.total} job{'s' if view.total != 1 else ''}, {state}")
    print(f"Started {when(view.start_time) or '-'}, ended {when(view.end_time) or '-'}")
    if view.by_state:
        print("\n" + table(["STATE", "JOBS"], sorted(view.by_state.items())))
    if view.by_outcome:
        print("\n" + table(["OUTCOME", "JOBS"], sorted(view.by_outcome.items())))
    if view.completion_job:
        print(f"\nCompletion job: {view.completion_job}")
    if answer["failures"]:
        print(f"\nNewest failures ({len(answer['failures'])}):")
        print(table(
            ["JOB", "SPIDER", "OUTCOME", "NODE", "ATTEMPTS", "ENDED", "REASON"],
            [(row.job, row.spider, row.outcome, row.node, row.attempts, when(row.end_time), row.reason)
             for row in view.failures[: max(args.failures, 0)]],
        ))
    return 0
