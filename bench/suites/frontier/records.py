"""What a crawl's own records say, the same for both systems: the example spider's ``runs.jsonl`` (a worker's spider
created) and ``pages.jsonl`` (each page parsed: by which worker, when), and the site's count of requests per page."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from pathlib import Path

from bench.crawls import spider_created
from bench.site import Site

# After the last worker's spider exists, before the home page is answered: its scheduler opens (ours starts
# stepping), so that every worker is there when the crawl begins.
SETTLE_SECONDS = 0.5


def pages(record_dir: Path, jobs: list[str]) -> list[dict]:
    try:
        lines = (record_dir / "pages.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    wanted = set(jobs)
    return [record for record in map(json.loads, lines) if record["job"] in wanted]


def wait_created(record_dir: Path, jobs: list[str], failure: Callable[[], str | None], timeout: float) -> None:
    """Until every worker's spider exists; ``failure()`` says why it never will (a worker gone), None while it may."""
    deadline = time.monotonic() + timeout
    while not all(spider_created(record_dir, job) is not None for job in jobs):
        reason = failure()
        if reason is not None or time.monotonic() > deadline:
            raise RuntimeError(f"frontier: workers not started: {reason or 'timeout'}")
        time.sleep(0.05)
    time.sleep(SETTLE_SECONDS)


def wait_and_pick_victim(site: Site, kill_at: int, record_dir: Path, jobs: list[str], timeout: float) -> str:
    """Once the site has answered ``kill_at`` pages: the worker that parsed the latest page (one fetching now)."""
    deadline = time.monotonic() + timeout
    while site.fetched() < kill_at:
        if time.monotonic() > deadline:
            raise RuntimeError(f"frontier: the crawl did not reach {kill_at} pages")
        time.sleep(0.01)
    latest = pages(record_dir, jobs)
    return latest[-1]["job"] if latest else jobs[0]


def summary(site: Site, record_dir: Path, jobs: list[str], opened: float, ended: float, victim: str | None) -> dict:
    """Pages per second from the first page parsed to the last (pages.jsonl ``fetched``), and what the site saw."""
    parsed = pages(record_dir, jobs)
    times = sorted(record["fetched"] for record in parsed)
    span = times[-1] - times[0] if len(times) > 1 else None
    return {
        "workers": len(jobs),
        "site_pages": len(site.links),
        "pages_parsed": len(parsed),
        "never_fetched": site.never_fetched(),
        "fetched_twice": sum(1 for count in site.requests.values() if count > 1),
        "pages_per_s": (len(times) - 1) / span if span else None,
        "all_fetching_pages_per_s": _all_fetching_rate(parsed, jobs),
        "first_to_last_s": span,
        "gate_to_end_s": ended - opened,
        "by_worker": dict(collections.Counter(record["job"] for record in parsed)),
        "killed": victim,
    }


def _all_fetching_rate(parsed: list[dict], jobs: list[str]) -> float | None:
    """Pages per second once every worker has parsed a page (its first page to the crawl's last): the crawl's rate
    with all its workers at work. None if a worker never parsed one."""
    firsts = {}
    for record in parsed:
        firsts[record["job"]] = min(record["fetched"], firsts.get(record["job"], record["fetched"]))
    if len(firsts) < len(jobs):
        return None
    since = max(firsts.values())
    times = [record["fetched"] for record in parsed if record["fetched"] >= since]
    span = max(times) - since
    return (len(times) - 1) / span if span > 0 else None
