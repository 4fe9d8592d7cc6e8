"""Crawl trees in the store, on a real Postgres: exact completion, keys unique in a tree, cancel, a done tree
staying done.

End-to-end trees through real nodes and crawls are in test_trees.py.
"""

from __future__ import annotations

import datetime
import threading

import pytest

from helpers import connect, query, wait_for
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store import AllJobsStore, JobStore
from scrapyd_pgqueue.store.statuses import FAILED


def claim_all(store, worker="w"):
    return store.claim_next_jobs(["p"], 100, node="n", worker=worker).jobs


def finish(store, claimed, outcome="finished", worker="w"):
    now = datetime.datetime.now()
    store.finish_job(project="p", spider=claimed.message["name"], job=claimed.job, start_time=now, end_time=now,
                     outcome=outcome, claimed=claimed, worker=worker)


def commit_once_waited_for(url, holding, thread, what):
    """Commit the transaction ``holding`` keeps open once another session waits for one of its locks (``thread``'s
    statement), then let ``thread`` finish."""
    try:
        wait_for(lambda: query(url, "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                                    "AND wait_event_type = 'Lock'"), 30, what)
    finally:
        holding.commit()
        holding.close()
        thread.join()


def children(parent, *keys):
    """Jobs found by ``parent``, one per key (a key found twice is two schedules of it)."""
    return [({"name": "page", "_job": f"{parent}-{key}-{n}"}, 0, JobOptions(parent=parent, unique_key=key,
                                                                             unique_scope="tree"))
            for n, key in enumerate(keys)]


def completions(url):
    return query(url, "SELECT job, message->>'tree' FROM spider_job WHERE spider = 'summary'")


def test_the_completion_job_is_enqueued_once_when_the_last_two_jobs_end_at_the_same_instant(database_url):
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
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
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
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
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a", "b", "c"))
    [running, *_] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
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


def test_a_child_being_scheduled_while_its_tree_is_cancelled_is_cancelled_too(database_url):
    """A batch of children holds its tree's row (as every enqueue into a tree does) in a transaction this test keeps
    open; the cancel waits for it and, once the children commit, cancels them: none is left for a node to claim."""
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"})
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a"))
    scheduling = connect(database_url)
    scheduling.autocommit = False
    with scheduling.cursor() as cursor:
        cursor.execute("SELECT root_id FROM spider_tree WHERE root_id = %s FOR NO KEY UPDATE", (root.id,))
        cursor.execute("INSERT INTO spider_job (project, spider, job, message, created_time, parent_id, tree_id) "
                       "SELECT project, 'page', 'late', message, now(), id, id FROM spider_job WHERE id = %s",
                       (root.id,))
    answers = []
    thread = threading.Thread(target=lambda: answers.append(cluster.cancel_tree("p", "r")))
    thread.start()
    commit_once_waited_for(database_url, scheduling, thread, "the cancel to wait for the tree")
    assert answers == [{"cancelled": 2, "signalled": 1}]  # the child a and the late one; the root
    assert query(database_url, "SELECT status, outcome FROM spider_job WHERE job = 'late'") == [
        ("terminated", "cancelled")
    ]
    assert claim_all(store) == []


def test_a_roots_tree_scoped_key_is_taken_in_the_tree_it_starts(database_url):
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    home = JobOptions(unique_key="home", unique_scope="tree")
    root = store.enqueue("p", {"name": "root", "_job": "r"}, options=home)
    assert root.existing is False
    [claimed] = claim_all(store)
    # A page deep in the tree links back to the start page: the root has it, no new job.
    [child] = store.enqueue_many("p", children("r", "a"))
    back = store.enqueue_many("p", children(child.job, "home") + children("r", "home"))
    assert [(e.job, e.existing) for e in back] == [("r", True), ("r", True)]
    assert query(database_url, "SELECT job FROM spider_job ORDER BY id") == [("r",), ("r-a-0",)]
    # Another root with the same key starts a tree of its own, where the key is its own.
    other = store.enqueue("p", {"name": "root", "_job": "r2"}, options=home)
    assert store.enqueue_many("p", children("r2", "home"))[0].job == "r2" and other.existing is False
    tree = cluster.tree("p", "r")
    assert (tree.total, tree.open, tree.completion_job) == (2, 2, None)  # no _on_complete: none
    for job in [claimed, *claim_all(store)]:  # r, then r-a-0 and r2
        finish(store, job)
    assert cluster.tree("p", "r").done and cluster.tree("p", "r2").done


def test_a_tree_past_its_cap_refuses_the_next_child_and_goes_on(database_url):
    capped = JobStore(JobStore.for_url(database_url).engine, tree_max_jobs=3)
    capped.enqueue("p", {"name": "root", "_job": "r"})
    capped.enqueue("p", {"name": "root", "_job": "other"})
    capped.enqueue_many("p", children("r", "a"))
    with pytest.raises(InvalidJobError, match=r"the tree of root job 'r' has 2 jobs and may have at most 3 "
                                              r"\(tree_max_jobs\): 2 more refused \(1 would fit\)"):
        capped.enqueue_many("p", children("r", "b", "c"))  # all or none
    assert capped.enqueue_many("p", children("r", "a", "b"))[0].existing  # a known key costs no room
    with pytest.raises(InvalidJobError, match="'r' has 3 jobs and may have at most 3"):
        capped.enqueue_many("p", children("r-b-1", "d"))  # from any job of the tree
    # The tree goes on; other trees are not touched; the refused keys are free.
    assert capped.enqueue_many("p", children("other", "b", "c"))[1].existing is False
    [tree] = query(database_url, "SELECT total, open_jobs FROM spider_tree WHERE root_job = 'r'")
    assert tree == (3, 3)
    assert query(database_url, "SELECT count(*) FROM spider_tree_key AS k JOIN spider_tree AS t "
                               "ON t.root_id = k.tree_id WHERE t.root_job = 'r'") == [(2,)]
    for claimed in claim_all(capped):
        finish(capped, claimed)
    assert AllJobsStore.for_url(database_url).tree("p", "r").done


def test_two_schedules_at_once_into_a_tree_with_room_for_one_store_one(database_url):
    capped = JobStore(JobStore.for_url(database_url).engine, tree_max_jobs=3)
    for attempt in range(10):
        root = f"r{attempt}"
        capped.enqueue("p", {"name": "root", "_job": root})
        capped.enqueue_many("p", children(root, "a"))  # 2 jobs: room for one more
        barrier = threading.Barrier(2)
        outcomes = []

        def schedule(key):
            barrier.wait()
            try:
                capped.enqueue_many("p", children(root, key))
                outcomes.append("stored")
            except InvalidJobError:
                outcomes.append("refused")

        threads = [threading.Thread(target=schedule, args=(key,)) for key in ("b", "c")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes) == ["refused", "stored"]
        assert query(database_url, "SELECT total FROM spider_tree WHERE root_job = %s", (root,)) == [(3,)]


DONE = r"the tree of root job 'r' is done \(its last job ended, its _on_complete job '\w+' enqueued\) and takes no new job"


def test_a_done_tree_refuses_new_children_and_stays_done(database_url):
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a"))
    finish(store, root)
    [child] = claim_all(store)
    finish(store, child)
    done = cluster.tree("p", "r")
    assert done.done and done.completion_job
    with pytest.raises(InvalidJobError, match=DONE + ": 1 refused; schedule without a parent"):
        store.enqueue("p", {"name": "page", "_job": "late"}, options=JobOptions(parent="r"))
    with pytest.raises(InvalidJobError, match=DONE + ": 2 refused"):  # from any job of the tree, all or none
        store.enqueue_many("p", children("r-a-0", "b", "c"))
    assert store.enqueue_many("p", children("r", "a"))[0].existing  # a key the tree has: its job, nothing new
    assert query(database_url, "SELECT job FROM spider_job WHERE job IN ('late', 'r-a-0-b-0', 'r-a-0-c-1')") == []
    assert cluster.tree("p", "r") == done  # done, counted and completed as before
    assert len(completions(database_url)) == 1
    store.enqueue("p", {"name": "page", "_job": "late"})  # outside the tree, as the error says


def test_a_child_scheduled_while_its_tree_completes_waits_and_is_refused(database_url):
    """The tree's last job ends in a transaction this test holds open (the status change its trigger counts: the
    tree is done and its completion enqueued, not yet committed); a child scheduled then waits for the tree's row
    and, once the end commits, is refused, never counted into a tree that already ran its completion."""
    store, cluster = JobStore.for_url(database_url), AllJobsStore.for_url(database_url)
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = claim_all(store)
    store.enqueue_many("p", children("r", "a"))
    finish(store, root)
    claim_all(store)
    ending = connect(database_url)
    ending.autocommit = False
    with ending.cursor() as cursor:
        cursor.execute("UPDATE spider_job SET status = 'terminated', outcome = 'finished', end_time = now() "
                       "WHERE job = 'r-a-0'")
    outcomes = []

    def schedule():
        try:
            outcomes.append(store.enqueue("p", {"name": "page", "_job": "late"}, options=JobOptions(parent="r")))
        except InvalidJobError as e:
            outcomes.append(str(e))

    thread = threading.Thread(target=schedule)
    thread.start()
    commit_once_waited_for(database_url, ending, thread, "the schedule to wait for the tree")
    [outcome] = outcomes
    assert isinstance(outcome, str) and outcome.startswith("the tree of root job 'r' is done"), outcome
    tree = cluster.tree("p", "r")
    assert (tree.done, tree.total) == (True, 2) and len(completions(database_url)) == 1
    assert query(database_url, "SELECT job FROM spider_job WHERE job = 'late'") == []


def test_a_tree_s_completion_job_goes_where_its_spider_s_route_sends_it(database_url):
    store = JobStore.for_url(database_url)
    query(database_url, "INSERT INTO spider_route (project, spider, pool) VALUES ('p', 'summary', 'browser')")
    store.enqueue("p", {"name": "root", "_job": "r"}, options=JobOptions(on_complete="summary"))
    [root] = claim_all(store)
    finish(store, root)
    assert query(database_url, "SELECT spider, pool FROM spider_job WHERE status = 'pending'") == [
        ("summary", "browser")]
