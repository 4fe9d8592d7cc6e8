"""What the JSON services and the operator command's ``--json`` answer alike: plain JSON values, a crawl tree's
answer (``tree.json`` and ``scrapyd-pgqueue tree --json``). Both layers import it; it imports neither."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

# Failures shown by default (newest first).
FAILURES_SHOWN = 10


def plain(value):
    """A value as JSON can hold it."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if dataclasses.is_dataclass(value):
        return {key: plain(item) for key, item in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def find_tree(store, project: str, job: str, failures: int = FAILURES_SHOWN):
    """The TreeView of the tree ``job`` belongs to (its root's), or None when the project has no such job."""
    return store.tree(project, job, failures=max(failures, 0))


def tree_answer(view, failures: int = FAILURES_SHOWN) -> dict[str, Any]:
    """tree.json's answer (without Scrapyd's node_name and status): plain JSON values, times in ISO 8601."""
    return plain({
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
