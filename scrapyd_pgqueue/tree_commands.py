"""``scrapyd-pgqueue tree JOB``: a crawl tree at a glance (its counts, whether it is done, its newest failures).

Like the other operator commands it talks to the database directly (``store.ClusterStore``); ``--json`` prints
what ``tree.json`` answers. ``tree_answer`` is that answer, shared with the web service (``tree_services``).
"""

from __future__ import annotations

from typing import Any

from scrapyd_pgqueue import admin

TREE_HELP = "show a crawl tree: its jobs by state and outcome, whether it is done, its newest failures"
# Failures shown by default (newest first).
FAILURES_SHOWN = 10


def add_commands(commands, database_url_argument) -> None:
    parser = commands.add_parser("tree", help=TREE_HELP, description=TREE_HELP)
    database_url_argument(parser, required=True)
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (tree.json's answer)")
    parser.add_argument("job", metavar="JOB", help="a job of the tree (its root, or any job in it)")
    parser.add_argument("--project", help="the job's project (needed only when several projects have this id)")
    parser.add_argument("--failures", type=int, default=FAILURES_SHOWN, metavar="N",
                        help=f"newest failures shown (default {FAILURES_SHOWN})")
    parser.set_defaults(run=run_tree)


def find_tree(store, project: str, job: str, failures: int = FAILURES_SHOWN):
    """The TreeView of the tree ``job`` belongs to (its root's), or None when the project has no such job."""
    return store.tree(project, job, failures=max(failures, 0))


def tree_answer(view, failures: int = FAILURES_SHOWN) -> dict[str, Any]:
    """tree.json's answer (without Scrapyd's node_name and status): plain JSON values, times in ISO 8601."""
    return admin._plain({
        "project": view.project,
        "root": view.root,
        "total": view.total,
        "open": view.open,
        "done": view.done,
        "states": dict(view.by_state),
        "outcomes": dict(view.by_outcome),
        "start_time": view.start_time,
        "end_time": view.end_time,
        "completion_job": view.completion_job,
        "cancelled": view.cancelled,
        "failures": [
            {
                "id": row.job,
                "spider": row.spider,
                "outcome": row.outcome,
                "reason": row.reason,
                "exit_code": row.exit_code,
                "node_name": row.node,
                "attempts": row.attempts,
                "start_time": row.start_time,
                "end_time": row.end_time,
            }
            for row in view.failures[: max(failures, 0)]
        ],
    })


def run_tree(args) -> int:
    store = admin._store(args)
    project = admin._resolve_project(store, args)
    if project is None:
        return 1
    view = find_tree(store, project, args.job, args.failures)
    if view is None:
        return admin._fail(f"no job '{args.job}' in project '{project}'")
    answer = tree_answer(view, args.failures)
    if args.json:
        admin._print_json(answer)
        return 0
    state = "done" if view.done else f"open: {view.open} job{'s' if view.open != 1 else ''} not ended"
    state += " (cancelled)" if view.cancelled else ""
    print(f"Tree {view.root} of project {project}: {view.total} job{'s' if view.total != 1 else ''}, {state}")
    print(f"Started {admin._when(view.start_time) or '-'}, ended {admin._when(view.end_time) or '-'}")
    if view.by_state:
        print("\n" + admin.table(["STATE", "JOBS"], sorted(view.by_state.items())))
    if view.by_outcome:
        print("\n" + admin.table(["OUTCOME", "JOBS"], sorted(view.by_outcome.items())))
    if view.completion_job:
        print(f"\nCompletion job: {view.completion_job}")
    if answer["failures"]:
        print(f"\nNewest failures ({len(answer['failures'])}):")
        print(admin.table(
            ["JOB", "SPIDER", "OUTCOME", "NODE", "ATTEMPTS", "ENDED", "REASON"],
            [(row.job, row.spider, row.outcome, row.node, row.attempts, admin._when(row.end_time), row.reason)
             for row in view.failures[: max(args.failures, 0)]],
        ))
    return 0
