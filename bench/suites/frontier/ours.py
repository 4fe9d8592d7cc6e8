"""Our side: the example project's ``site`` spider scheduled on a real node, with ``_workers=N`` (the frontier) or
without (Scrapy's own in-memory scheduler, the reference of one worker)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from bench import database
from bench.site import Site
from bench.suites.frontier import records

DEADLINE = 600.0


def crawl(database_url: str, node, site: Site, record_dir: Path, workers: int | None, settings: dict[str, str],
          kill_at: int | None = None) -> dict:
    """One crawl of ``site``: ``workers`` None is a plain job (Scrapy's scheduler), else a crawl of that many
    workers; ``kill_at``: SIGKILL one worker's crawl process (not the node) once the site answered that many pages."""
    job = f"fr-{uuid.uuid4().hex[:10]}"
    params = {"project": "example", "spider": "site", "jobid": job, "site": site.home}
    if workers is not None:
        params["_workers"] = str(workers)
    if settings:
        params["setting"] = [f"{name}={value}" for name, value in settings.items()]
    answer = node.post("schedule.json", **params)
    if answer.get("status") != "ok":
        raise RuntimeError(f"frontier: schedule.json refused: {answer}")
    jobs = answer.get("workers", [job])
    records.wait_created(record_dir, jobs, lambda: _ended_early(database_url, node, jobs), DEADLINE)
    opened = time.time()
    site.open_gate()
    victim = None
    if kill_at is not None:
        victim = records.wait_and_pick_victim(site, kill_at, record_dir, jobs, DEADLINE)
        os.kill(_pid(database_url, victim), signal.SIGKILL)
    _wait_terminated(database_url, node, jobs)
    result = records.summary(site, record_dir, jobs, opened, time.time(), victim)
    result["outcomes"] = _outcomes(database_url, jobs)
    if workers is not None:
        view = node.get("crawl.json", project="example", crawl=job)
        result["frontier"] = {key: view.get(key) for key in ("done", "failed", "queued", "in_flight", "duplicates")}
    return result


def _query(database_url: str, statement: str, jobs: list[str]) -> list[tuple]:
    with database.admin_connection(database_url) as connection, connection.cursor() as cursor:
        cursor.execute(statement, (jobs,))
        return cursor.fetchall()


def _ended_early(database_url: str, node, jobs: list[str]) -> str | None:
    rows = _query(database_url, "SELECT job, outcome FROM spider_job WHERE job = ANY(%s) AND status = 'terminated'",
                  jobs)
    if not rows:
        return None
    log = node.directory / "logs" / "example" / "site" / f"{rows[0][0]}.log"
    tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else [node.log_tail(20)]
    return f"jobs ended before the crawl began: {rows}\n" + "\n".join(tail)


def _pid(database_url: str, job: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        rows = _query(database_url, "SELECT pid FROM spider_job WHERE job = ANY(%s) AND pid IS NOT NULL", [job])
        if rows:
            return rows[0][0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"frontier: no pid for job {job}")
        time.sleep(0.02)


def _wait_terminated(database_url: str, node, jobs: list[str]) -> None:
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = _query(database_url, "SELECT count(*) FROM spider_job WHERE job = ANY(%s) AND status = 'terminated'",
                      jobs)
        if rows[0][0] == len(jobs):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"frontier: jobs {jobs} did not end:\n{node.log_tail(15)}")
        time.sleep(0.05)


def _outcomes(database_url: str, jobs: list[str]) -> dict[str, str]:
    return dict(_query(database_url, "SELECT job, outcome FROM spider_job WHERE job = ANY(%s)", jobs))
