"""Crawl trees in the store, on a real Postgres: exact completion, keys unique in a tree, cancel.

End-to-end trees through real nodes and crawls are in test_trees.py.
"""

from __future__ import annotations

import datetime
import threading

import pytest

from scrapyd_pgqueue.models import FAILED
from scrapyd_pgqueue.store import ClusterStore, InvalidJobError, JobOptions, JobStore
from helpers import query


def claim_all(store, worker="w"):
    return store.claim(["p"], 100, node="n", worker=worker).jobs


def finish(store, claimed, outcome="finished", worker="w"):
    now = datetime.datetime.now()
    store.finish_job(project="p", spider=claimed.message["name"], job=claimed.job, start_time=now, end_time=now,
                     outcome=outcome, claimed=claimed, worker=worker)


def children(parent, *keys):
    """Jobs found by ``parent``, one per key (a key found twice is two schedules of it)."""
    return [({"name": "page", "_job": f"{parent}-{key}-{n}"}, 0, JobOptions(parent=parent, unique_key=key,
                                                                             unique_scope="tree"))
            for n, key in enumerate(keys)]


def completions(url):
    return query(url, "SELECT job, message->>'tree' FROM spider_job WHERE spider = 'summary'")


def test_the_completion_job_is_enqueued_once_when_the_last_two_jobs_end_at_the_same_instant(database_url):
    store, cluster = JobStore.for_url(database_url), ClusterStore.for_url(database_url)
    for attempt in range(10):
        root = f"root{attempt}"
        store.enqueue("p", {"name": "root", "_job": root}, options=JobOptions(on_complete="summary"))
        [root_claim] = claim_all(store)
        store.enqueue_many("p", children(root, "a", "b"))
        finish(store, root_claim)
        last_two = claim_all(store)
        barrier = threading.Barrier(2)

        def end(claimed):
            barrier.wait()
            finish(store, claimed)

        threads = [threading.Thread(target=end, args=(claimed,)) for claimed in last_two]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        tree = cluster.tree("p", root)
        assert (tree.done, tree.total, tree.open) == (True, 3, 0)
        [summary] = claim_all(store)
        assert summary.job == tree.completion_job and summary.message["tree"] == root
        finish(store, summary)
    assert len(completions(database_url)) == 10


def test_the_root_keeps_its_tree_open_until_its_own_crawl_ends(database_url):
    store, cluster = JobStore.for_url(database_url), ClusterStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary",
                                                                      on_complete_args={"label": "x"}))
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a"))
    [child] = claim_all(store)
    finish(store, child, outcome=FAILED)  # every descendant ended, the root still runs: not done
    tree = cluster.tree("p", "r")
    assert not tree.done and tree.open == 1 and [job.job for job in tree.failures] == ["r-a-0"]
    assert completions(database_url) == []
    finish(store, root)
    assert cluster.tree("p", "r").done and len(completions(database_url)) == 1
    assert cluster.lineage("r-a-0", "p") == ("r", "r") and cluster.lineage("r") == (None, "r")


def test_a_key_is_scheduled_once_in_a_tree_even_after_its_job_was_crawled_and_pruned(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"})
    [root] = claim_all(store)
    first = store.enqueue_many("p", children("r", "s1", "s2", "s1"))  # s1 found twice on one page
    assert [(e.job, e.existing) for e in first] == [("r-s1-0", False), ("r-s2-1", False), ("r-s1-0", True)]
    for claimed in claim_all(store):
        finish(store, claimed)
    store.prune_terminated(0)
    again = store.enqueue("p", {"name": "page", "_job": "late"},
                          options=JobOptions(parent="r", unique_key="s2", unique_scope="tree"))
    assert (again.job, again.existing) == ("r-s2-1", True)
    other_tree = store.enqueue("p", {"name": "root", "_job": "r2"})
    assert other_tree.existing is False
    with pytest.raises(InvalidJobError, match="parent job 'nope' not found"):
        store.enqueue("p", {"name": "page", "_job": "orphan"}, options=JobOptions(parent="nope"))
    finish(store, root)


def test_cancelling_a_tree_leaves_nothing_of_it_waiting_or_running(database_url):
    store, cluster = JobStore.for_url(database_url), ClusterStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a", "b", "c"))
    [running, *_] = store.claim(["p"], 1, node="n", worker="w").jobs
    assert cluster.cancel_tree("p", "r") == {"cancelled": 2, "signalled": 2}  # b, c; the root and a
    late = store.enqueue_many("p", children(running.job, "d"))  # a running child spawns on its way out
    assert query(database_url, "SELECT status, outcome FROM spider_job WHERE job = %s", (late[0].job,)) == [
        ("terminated", "cancelled")
    ]
    for claimed in (root, running):
        finish(store, claimed, outcome="cancelled")
    tree = cluster.tree("p", "r")
    assert tree.done and tree.cancelled and tree.by_state == {"finished": 5}
    assert claim_all(store) == [] and tree.completion_job is None  # a cancelled tree's completion never runs
