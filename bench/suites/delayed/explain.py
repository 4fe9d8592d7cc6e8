"""The claim under EXPLAIN (ANALYZE, BUFFERS), rolled back: the buffers it read, per index."""

from __future__ import annotations

import uuid

from bench import database
from bench.suites.delayed.settings import PROJECT_WITHOUT_DELAYED, PROJECTS


def explain_claims(url: str) -> dict:
    """The claim of one project and of the five, each statement it runs explained (ANALYZE, BUFFERS), rolled back:
    what it read."""
    from scrapyd_pgqueue.store import queue as store
    from scrapyd_pgqueue.store.base import NOTIFY_CHANNEL

    statement = store.CLAIM_NEXT_JOBS
    params = {"limit": 1, "node": "bench-delayed-explain", "worker": uuid.uuid4().hex,
              "channel": NOTIFY_CHANNEL}
    explained = {}
    for name, projects in EXPLAINED:
        connection = database.connect(url)
        try:
            plans = database.explain_nested(connection, statement, {**params, "projects": projects})
        finally:
            connection.rollback()  # ANALYZE ran the claim: give the job back
            connection.close()
        explained[name] = summarise_plans(plans)
    return explained


EXPLAINED = (  # name, the claim's :projects
    ("claim_project", [PROJECTS[0]]),
    ("claim_projects", list(PROJECTS)),
    ("claim_project_without_delayed", [PROJECT_WITHOUT_DELAYED]),
)


def summarise_plans(plans: list[dict]) -> dict:
    """What the claim's statements read, together (the last plan is the call itself: its time is the claim's)."""
    *inner, outer = plans
    nodes = []
    for document in inner:
        _walk(document["Plan"], nodes)
    return {
        "execution_ms": outer["Plan"].get("Actual Total Time"),
        "shared_hit": sum(document["Plan"].get("Shared Hit Blocks", 0) for document in inner),
        "shared_read": sum(document["Plan"].get("Shared Read Blocks", 0) for document in inner),
        "statements": len(inner),
        # Per node that reads spider_job or one of its indexes (an index scan's buffers include its heap fetches).
        "scans": nodes,
    }


def _walk(node: dict, out: list) -> None:
    if node.get("Relation Name") or node.get("Index Name"):
        out.append({
            "node": node["Node Type"],
            "relation": node.get("Relation Name"),
            "index": node.get("Index Name"),
            "rows": node.get("Actual Rows"),
            "loops": node.get("Actual Loops"),
            "shared_hit": node.get("Shared Hit Blocks", 0),
            "shared_read": node.get("Shared Read Blocks", 0),
            "cte": node.get("Subplan Name"),
        })
    for child in node.get("Plans", []):
        _walk(child, out)


DELAYED_INDEXES = ("spider_job_delayed_idx", "spider_job_delayed_project_idx")  # all projects; one project


def _delayed_index_blocks(explained: dict) -> int:
    return sum(scan["shared_hit"] + scan["shared_read"] for scan in explained["scans"]
               if scan["index"] in DELAYED_INDEXES)
