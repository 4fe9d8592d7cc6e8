"""Node pools in the store, on a real Postgres: a node claims only the jobs whose required tags it all has, in
priority and FIFO order, never held up by jobs it cannot run; routes per spider; pools no live node can run."""

from __future__ import annotations

import collections

import pytest

from helpers import claim_in_processes, query
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store.pools import PoolStore
from scrapyd_pgqueue.tags import InvalidTagsError, parse_tags, pool_key


def enqueue(store, job, priority=0.0, tags=None, spider="s"):
    return store.enqueue("p", {"name": spider, "_job": job}, priority, JobOptions(tags=tags))


def claim(store, tags=(), limit=1, projects=None):
    return [job.job for job in store.claim_next_jobs(projects, limit, node="n", worker="w", tags=tags).jobs]


def test_tags_are_checked_sorted_and_deduplicated():
    assert parse_tags(" eu,browser, eu ") == ("browser", "eu")
    assert parse_tags(["gpu"]) == ("gpu",) and parse_tags("") == () and parse_tags([]) == ()
    assert pool_key(("eu", "browser")) == "browser,eu" and pool_key(()) == ""
    for bad in ("a b", "browser,", "-x", "x" * 64, ",".join(f"t{i}" for i in range(17)), 3, ["a", 1]):
        with pytest.raises(InvalidTagsError):
            parse_tags(bad)


@pytest.mark.parametrize("projects", [None, ["p"], ["p", "other"]])
def test_a_node_claims_only_what_it_may_run_in_priority_order_never_held_up(store, projects):
    # The best jobs require browser: a node without tags passes over them (no row of theirs read), in its order.
    for index in range(5):
        enqueue(store, f"browser-{index}", priority=10, tags=("browser",))
    enqueue(store, "plain-low", priority=-1)
    enqueue(store, "plain-first", priority=1)
    enqueue(store, "plain-second", priority=1)
    enqueue(store, "eu-browser", priority=5, tags=("eu", "browser"))
    assert claim(store, projects=projects) == ["plain-first"]
    assert claim(store, limit=5, projects=projects) == ["plain-second", "plain-low"]
    assert claim(store, projects=projects) == []
    # A browser node: its pool and pool '' merged by priority, then FIFO; the job that also requires eu stays.
    enqueue(store, "plain-top", priority=20)
    assert claim(store, ("browser", "gpu"), limit=3, projects=projects) == ["plain-top", "browser-0", "browser-1"]
    assert claim(store, ("browser",), limit=10, projects=projects) == ["browser-2", "browser-3", "browser-4"]
    assert claim(store, ("browser", "eu"), limit=10, projects=projects) == ["eu-browser"]


def test_the_untagged_one_project_claim_reads_only_pool_empty_of_the_project_index(store, database_url):
    enqueue(store, "plain")
    plan = "\n".join(row[0] for row in query(database_url, """
        EXPLAIN SELECT n.id FROM spider_job AS n
        WHERE n.status = 'pending' AND n.pool = '' AND n.project >= 'p' AND n.project <= 'p'
        ORDER BY n.pool, n.project, n.priority DESC, n.id LIMIT 1 FOR UPDATE SKIP LOCKED"""))
    assert "spider_job_pending_project_idx" in plan and "Sort" not in plan, plan


def test_a_route_sends_a_spider_without_tags_to_its_pool_and_own_tags_replace_it(store, database_url):
    pools = PoolStore.for_url(database_url)
    pools.set_route("p", "render", ("browser",))
    assert [(r.project, r.spider, r.tags) for r in pools.routes()] == [("p", "render", ["browser"])]
    enqueue(store, "routed", spider="render")
    enqueue(store, "own", spider="render", tags=("gpu",))
    enqueue(store, "anywhere", spider="render", tags=())
    enqueue(store, "other-spider")
    assert dict(query(database_url, "SELECT job, pool FROM spider_job")) == {
        "routed": "browser", "own": "gpu", "anywhere": "", "other-spider": ""}
    assert pools.remove_route("p", "render") and not pools.remove_route("p", "render")
    enqueue(store, "unrouted", spider="render")
    assert query(database_url, "SELECT pool FROM spider_job WHERE job = 'unrouted'") == [("",)]


def test_pools_no_live_node_can_run_are_unroutable_until_such_a_node_registers(store, database_url):
    pools = PoolStore.for_url(database_url)
    enqueue(store, "plain")
    enqueue(store, "gpu-1", tags=("gpu",))
    enqueue(store, "gpu-2", tags=("gpu",))
    enqueue(store, "browser", tags=("browser",))
    store.register_node(worker="w-browser", name="b", url=None, max_proc=1, tags=("browser", "eu"))
    assert [(pool.tags, pool.jobs) for pool in pools.unroutable(lease_seconds=30, cap=1000)] == [(["gpu"], 2)]
    store.register_node(worker="w-gpu", name="g", url=None, max_proc=1, tags=("gpu",))
    assert pools.unroutable(lease_seconds=30, cap=1000) == []
    store.stop_node("w-gpu")
    assert [pool.tags for pool in pools.unroutable(lease_seconds=30, cap=1000)] == [["gpu"]]


def test_sixteen_claimers_of_mixed_tags_claim_every_job_once_each_on_a_node_with_its_tags(store, database_url):
    required = [(), ("browser",), (), ("eu",), (), ("browser", "eu")]  # half of the jobs require tags
    jobs = {}
    for index in range(1200):
        jobs[f"job-{index}"] = set(required[index % len(required)])
        enqueue(store, f"job-{index}", priority=index % 7, tags=required[index % len(required)])
    node_tags = [(), ("browser",), ("eu",), ("browser", "eu")]
    per_claimer, _ = claim_in_processes(database_url, 16, "fork", largest_batch=3,
                                        tags_of=lambda index: node_tags[index % len(node_tags)])
    claims = collections.defaultdict(list)  # job -> tags of the claimers that got it
    for index, claimed in enumerate(per_claimer):
        for job, attempt in claimed:
            claims[job].append((set(node_tags[index % len(node_tags)]), attempt))
    assert {job: len(got) for job, got in claims.items()} == {job: 1 for job in jobs}
    assert all(jobs[job] <= got[0][0] and got[0][1] == 1 for job, got in claims.items())
