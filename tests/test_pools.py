"""Node pools end to end: real Scrapyd nodes with tags on one Postgres queue, jobs that require tags, routes per
spider, and work no live node can run, through real HTTP and real crawls.

What the crawls record (runs.jsonl: job, node, start) is the measure of where and how often each job ran.
"""

from __future__ import annotations

import collections
import json

import requests

from helpers import query, runs, wait_for
from scrapyd_pgqueue import cli

# One slot a node: each claim takes one job, so a node's start times (written when its crawl starts) are its claim
# order. With two, the two crawls of one claim start in either order.
NODE_CONFIG = {"max_proc": "1", "finished_to_keep": "1000"}
BROWSER_NODE = "node1"


def wait_for_runs(tmp_path, jobs, timeout=180):
    """Every job of ``jobs`` has started at least once: their runs by job id."""
    jobs = set(jobs)

    def started():
        by_job = collections.defaultdict(list)
        for run in runs(tmp_path):
            if run["job"] in jobs:
                by_job[run["job"]].append(run)
        return by_job if by_job.keys() == jobs else None

    return wait_for(started, timeout, f"{len(jobs)} jobs to start", interval=0.5)


def batch(node, jobs):
    answer = requests.post(f"{node.url}schedule_batch.json", timeout=30,
                           data=json.dumps({"project": "example", "jobs": jobs}),
                           headers={"Content-Type": "application/json"}).json()
    assert answer["status"] == "ok", answer
    return answer["jobids"]


def test_jobs_run_only_on_nodes_with_their_tags(database, start_cluster, tmp_path):
    url, admin_url = database
    cluster = start_cluster(url, 3, node_config={BROWSER_NODE: {"node_tags": "browser"}}, **NODE_CONFIG)
    plain_node = cluster.nodes[1]
    for node in cluster.nodes:  # scrapy list once per node, before the clock matters
        assert "sleeper" in node.get("listspiders.json", project="example")["spiders"]

    # 60 jobs at once (one batch: every node claims from the whole queue), a third requiring browser.
    jobs = [{"spider": "sleeper", "args": {"seconds": "0.1"}, "priority": (index * 7) % 11,
             **({"tags": ["browser"]} if index % 3 == 0 else {})} for index in range(60)]
    ids = batch(plain_node, jobs)
    required = {job_id: bool(job.get("tags")) for job_id, job in zip(ids, jobs)}
    priority = {job_id: job["priority"] for job_id, job in zip(ids, jobs)}
    by_job = wait_for_runs(tmp_path, ids)
    wait_for(lambda: query(admin_url, "SELECT count(*) FROM spider_job WHERE status <> 'terminated'") == [(0,)],
             120, "every job to end")
    assert {job: len(by_job[job]) for job in ids} == {job: 1 for job in ids}  # exactly once
    assert {by_job[job][0]["node"] for job in ids if required[job]} == {BROWSER_NODE}
    assert len({by_job[job][0]["node"] for job in ids if not required[job]}) >= 2  # the others anywhere
    # Priority order per node: each node claimed its jobs best first.
    claims = query(admin_url, "SELECT node, job FROM spider_job ORDER BY start_time, priority DESC, id")
    for node in cluster.nodes:
        order = [priority[job] for name, job in claims if name == node.name]
        assert order == sorted(order, reverse=True), (node.name, order)
    finished = {job["id"]: job["tags"] for job in plain_node.get("listjobs.json")["finished"]}
    assert {job: finished[job] for job in ids} == {job: ["browser"] if required[job] else [] for job in ids}

    # A routed spider, scheduled as ScrapydWeb does (project and spider, no option), runs on the browser node.
    assert cli.main(["route", "set", "example", "ticker", "--tags", "browser", "--database-url", admin_url]) == 0
    routed = [plain_node.post("schedule.json", project="example", spider="ticker", seconds="0")["jobid"]
              for _ in range(3)]
    assert {runs[0]["node"] for runs in wait_for_runs(tmp_path, routed).values()} == {BROWSER_NODE}
    assert plain_node.get("status.json", job=routed[0])["tags"] == ["browser"]
    # A periodic job with its own tags fires on any node; its jobs run on the browser node.
    added = plain_node.post("addperiodic.json", name="render", project="example", spider="sleeper", every="2",
                            _tags="browser", seconds="0", marker="periodic")
    assert added["status"] == "ok", added
    [fired] = wait_for(lambda: [run for run in runs(tmp_path) if run["args"].get("marker") == "periodic"], 60,
                       "the periodic job's firing")
    assert plain_node.post("delperiodic.json", name="render")["status"] == "ok"
    assert fired["node"] == BROWSER_NODE

    # Bad tags: Scrapyd's JSON error, nothing stored.
    answer = plain_node.post("schedule.json", project="example", spider="sleeper", _tags="gpu,no spaces")
    assert answer["status"] == "error" and "_tags: tag 'no spaces' is not valid" in answer["message"], answer

    # A job requiring a tag no node has waits, listed unroutable, and runs as soon as such a node joins.
    gpu_job = plain_node.post("schedule.json", project="example", spider="sleeper", seconds="0", _tags="gpu")["jobid"]
    [pending] = plain_node.get("listjobs.json")["pending"]
    assert (pending["id"], pending["tags"]) == (gpu_job, ["gpu"])
    status = wait_for(lambda: (s := plain_node.get("daemonstatus.json"))["unroutable"] and s, 10, "unroutable")
    assert (status["unroutable"], status["cluster"]["unroutable"]) == (1, 1)
    page = requests.get(f"{plain_node.url}jobs", timeout=30).text
    assert "unroutable" in page and gpu_job in page
    dashboard = requests.get(f"{plain_node.url}dashboard", timeout=30).text
    assert '<b id="unroutable-total">1</b>' in dashboard and "<td>browser</td>" in dashboard  # node1's tags
    metrics = requests.get(f"{plain_node.url}metrics", timeout=30).text
    assert 'scrapyd_pgqueue_unroutable_jobs{tags="gpu"} 1.0' in metrics, metrics
    assert f'scrapyd_pgqueue_node_info{{node="{plain_node.name}",tags=""}} 1.0' in metrics
    browser_metrics = requests.get(f"{cluster.nodes[0].url}metrics", timeout=30).text
    assert f'scrapyd_pgqueue_node_slots{{node="{BROWSER_NODE}",tags="browser"}} {float(NODE_CONFIG["max_proc"])}' in browser_metrics

    [gpu_node] = start_cluster(url, 1, name_prefix="gpu", node_tags="gpu", **NODE_CONFIG).nodes
    [run] = wait_for_runs(tmp_path, [gpu_job], timeout=60)[gpu_job]
    assert run["node"] == gpu_node.name
    assert plain_node.get("daemonstatus.json")["unroutable"] == 0
