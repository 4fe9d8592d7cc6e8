"""What the suites that run real nodes share: the spider's own record of its start, and batches over HTTP."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path


def spider_created(records: Path, job: str) -> float | None:
    """When the job's spider was created, from the example project's ``runs.jsonl`` (None until it is)."""
    try:
        lines = (records / "runs.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return None
    return next((run["started"] for run in map(json.loads, lines) if run["job"] == job), None)


def post_batch(node_url: str, batch: dict | bytes, timeout: float, suite: str) -> dict:
    """``schedule_batch.json`` with a JSON body (or its text, made beforehand); a refused batch stops the suite with
    the node's message."""
    body = batch if isinstance(batch, bytes) else json.dumps(batch).encode()
    request = urllib.request.Request(f"{node_url}schedule_batch.json", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.load(response)
    if answer.get("status") != "ok":
        raise RuntimeError(f"{suite}: schedule_batch.json refused a batch: {answer.get('message')}")
    return answer
