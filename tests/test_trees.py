"""Crawl trees end to end: three real nodes explore a generated site of unknown size, one job per section, each
page scheduling a child job per section it links to (example_project's ``explore``, project ``trees``), and a
``tree_summary`` job runs when the whole tree has ended.

The measures are the crawls' own records (runs.jsonl: each start with its arguments; ends.jsonl: each end;
summaries.jsonl: what the summary job read from tree.json), the rows, and the NOTIFY on the trees channel.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import time

import requests

from helpers import CLAIM_AT_START_ONLY, SiteServer, connect, ends, generate_site, query, runs, wait_for
from scrapyd_pgqueue.local.cluster import NODE_CONFIG
from scrapyd_pgqueue.store import TREES_CHANNEL

# The example project's scrapyd.cfg, with the trees project baked in next to example.
BASE_CONFIG = NODE_CONFIG.read_text().rstrip("\n") + "\ntrees = example.tree_settings\n"
CONFIG = {"max_proc": "3", "finished_to_keep": "1000"}


def start_tree_cluster(start_cluster, url):
    cluster = start_cluster(url, 3, base_config=BASE_CONFIG, **CONFIG)
    for node in cluster.nodes:  # `scrapy list` of the project now, not inside the timed part
        assert node.get("listspiders.json", project="trees")["spiders"] == ["explore", "tree_summary"]
    return cluster


def explore_runs(tmp_path) -> list[dict]:
    return [run for run in runs(tmp_path) if run["spider"] == "explore"]


def summaries(tmp_path) -> list[dict]:
    path = tmp_path / "records" / "summaries.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def schedule_root(node, site, summary_node=None):
    # The root holds its section's key in its tree: pages linking back home get the root's job id.
    fields = {"project": "trees", "spider": "explore", "jobid": "root", "site": site.url,
              "_unique_key": "section:0", "_unique_scope": "tree"}
    if summary_node is not None:
        fields.update(_on_complete="tree_summary", _on_complete_args=json.dumps({"node": summary_node.url}))
    answer = node.post("schedule.json", **fields)
    assert answer["status"] == "ok", answer
    return time.time()


@contextlib.contextmanager
def tree_notifications(url):
    """The payloads of NOTIFY scrapyd_pgqueue_trees heard on a connection of the test's own."""
    connection = connect(url)
    with connection.cursor() as cursor:
        cursor.execute(f"LISTEN {TREES_CHANNEL}")
    heard = []

    def poll():
        if select.select([connection], [], [], 0.2)[0]:
            connection.poll()
            heard.extend(json.loads(n.payload) for n in connection.notifies)
            connection.notifies.clear()
        return heard

    try:
        yield poll
    finally:
        connection.close()


def tree_rows(url):
    """(section, job, status, outcome, attempts, end_time epoch) of every explore job."""
    return query(url, "SELECT coalesce(message->>'section', '0'), job, status, outcome, attempts, extract(epoch FROM end_time) "
                      "FROM spider_job WHERE spider = 'explore' ORDER BY id")


def check_summary(url, tmp_path, sections: int):
    """The completion job ran once, after every crawl of the tree had ended; return (summary, its run)."""
    assert query(url, "SELECT count(*) FROM spider_job WHERE spider = 'tree_summary'") == [(1,)]
    [summary] = summaries(tmp_path)
    [run] = [run for run in runs(tmp_path) if run["spider"] == "tree_summary"]
    assert run["job"] == summary["job"] and run["args"]["tree"] == "root"
    explore_jobs = {run["job"] for run in explore_runs(tmp_path)}
    last_end = max(end["ended"] for end in ends(tmp_path) if end["job"] in explore_jobs)
    last_row_end = max(row[5] for row in tree_rows(url))
    assert run["started"] > last_end and run["started"] > float(last_row_end)
    answer = summary["answer"]
    assert answer == {**answer, "status": "ok", "root": "root", "done": True, "total": sections, "open": 0,
                      "states": {"finished": sections}, "completion_job": summary["job"]}
    return answer, run, last_end


def test_every_section_is_crawled_once_and_the_summary_runs_once_after_the_last_crawl(database, start_cluster,
                                                                                        tmp_path):
    url, admin_url = database
    links = generate_site(seed=10, depth=3, fanout=4)  # 19 sections, 50 links
    cluster = start_tree_cluster(start_cluster, url)
    first, second, third = cluster.nodes
    with SiteServer(links) as site, tree_notifications(admin_url) as heard:
        started = schedule_root(first, site, summary_node=second)
        wait_for(lambda: summaries(tmp_path), 150, "the tree's summary")
        # The summary job's own row ends after its crawl: the NOTIFY came before it started.
        notices = wait_for(heard, 10, "the trees channel's NOTIFY")

    crawled = collections.Counter(run["args"].get("section", "0") for run in explore_runs(tmp_path))
    assert crawled == collections.Counter(set(links)), crawled  # every section, each once
    assert set(site.requests) == set(links) and max(site.requests.values()) == 1
    assert all(end["reason"] == "finished" for end in ends(tmp_path))
    answer, run, last_end = check_summary(admin_url, tmp_path, len(links))
    assert notices == [{"project": "trees", "root": "root", "root_id": notices[0]["root_id"]}]

    # What a client sees: a child's parent and root, the tree from any node.
    child = next(row for row in tree_rows(admin_url) if row[0] != "0")[1]
    status = third.get("status.json", job=child, project="trees")
    assert status["currstate"] == "finished" and status["root"] == "root" and status["parent"]
    assert third.get("status.json", job="root")["parent"] is None
    assert third.get("tree.json", project="trees", job=child)["outcomes"] == {"finished": len(links)}
    nodes = collections.Counter(run["node"] for run in explore_runs(tmp_path))
    print(f"\ntree of {len(links)} sections ({sum(map(len, links.values()))} links): {len(links)} crawls on "
          f"{dict(nodes)}; last crawl ended {last_end - started:.1f}s after the root's schedule; summary started "
          f"{run['started'] - last_end:.2f}s after the last end; tree.json: {answer['states']}")


def test_a_node_killed_in_the_middle_of_the_tree(database, start_cluster, tmp_path):
    """SIGKILL one node and its crawls (a machine gone) while it runs jobs of the tree: they are recovered and run
    again; every section still has one job, and the summary runs once, after the last crawl."""
    url, admin_url = database
    links = generate_site(seed=7, depth=4, fanout=2)  # 16 sections, 37 links
    cluster = start_tree_cluster(start_cluster, url)
    first, second, victim = cluster.nodes
    with SiteServer(links, delay=1.5) as site:  # crawls wait for their page: killed in the middle of it
        started = schedule_root(first, site, summary_node=second)

        def victim_busy():
            mine = {run["job"] for run in explore_runs(tmp_path) if run["node"] == victim.name}
            ended = {end["job"] for end in ends(tmp_path)}
            open_jobs = query(admin_url, "SELECT count(*) FROM spider_job WHERE spider = 'explore' "
                                         "AND status <> 'terminated'")[0][0]
            return len(mine - ended) >= 2 and open_jobs >= 4 and mine - ended

        killed_jobs = wait_for(victim_busy, 120, f"{victim.name} to run 2 crawls of the tree")
        os.killpg(victim.process.pid, signal.SIGKILL)  # the node and its crawls
        killed_at = time.time()
        victim.process.wait(10)
        wait_for(lambda: summaries(tmp_path), 150, "the tree's summary")

    rows = tree_rows(admin_url)
    jobs_by_section = collections.defaultdict(set)
    for section, job, *_ in rows:
        jobs_by_section[section].add(job)
    assert {s: len(j) for s, j in jobs_by_section.items()} == dict.fromkeys(links, 1)  # one job per section, ever
    assert all((status, outcome) == ("terminated", "finished") for _, _, status, outcome, _, _ in rows)
    recovered = {job for _, job, _, _, attempts, _ in rows if attempts > 1}
    assert killed_jobs <= recovered  # the killed crawls' jobs ran again elsewhere
    finished = collections.Counter(
        end["job"] for end in ends(tmp_path) if end["spider"] == "explore" and end["reason"] == "finished")
    assert set(finished) == {job for _, job, *_ in rows}  # every section's crawl completed
    runs_by_job = collections.Counter(run["job"] for run in explore_runs(tmp_path))
    again = {job for job, count in runs_by_job.items() if count > 1}
    assert again <= recovered and killed_jobs <= again
    # A job the killed node never ran finished once. One it ran may have finished twice: a crawl that ended just before
    # the kill, whose node died before recording it, runs again (at least once, as any queue with leases).
    on_victim = {run["job"] for run in explore_runs(tmp_path) if run["node"] == victim.name}
    assert all(count == 1 for job, count in finished.items() if job not in on_victim), finished
    answer, run, last_end = check_summary(admin_url, tmp_path, len(links))
    print(f"\ntree of {len(links)} sections, {victim.name} SIGKILLed {killed_at - started:.1f}s in with "
          f"{len(killed_jobs)} crawls of it running; {len(recovered)} jobs recovered and run again "
          f"({sum(runs_by_job.values())} crawls for {len(links)} sections); summary started "
          f"{run['started'] - last_end:.2f}s after the last end, {run['started'] - started:.1f}s after the root")


def test_cancel_tree_leaves_nothing_of_the_tree_running_or_waiting(database, start_cluster, tmp_path):
    url, admin_url = database
    links = generate_site(seed=11, depth=4, fanout=4)  # 97 sections
    cluster = start_tree_cluster(start_cluster, url)
    first, second, third = cluster.nodes
    live = "SELECT count(*) FILTER (WHERE status = 'ongoing'), count(*) FILTER (WHERE status IN ('pending', " \
           "'delayed')) FROM spider_job WHERE spider = 'explore'"
    # Jobs ever claimed (a claim counts an attempt; a crawl's spawn, which may come after the cancel for a job
    # claimed before it, only sets start_time).
    claimed = "SELECT job FROM spider_job WHERE spider = 'explore' AND attempts > 0"
    with SiteServer(links, delay=2) as site:
        schedule_root(first, site)
        wait_for(lambda: (lambda running, waiting: running >= 3 and waiting >= 3)(*query(admin_url, live)[0]), 120,
                 "3 crawls of the tree running and 3 waiting")
        before = query(admin_url, live)[0]
        answer = second.post("cancel.json", project="trees", job="root", _tree="1")
        cancelled_at = time.time()
        claimed_by_the_cancel = {job for (job,) in query(admin_url, claimed)}
        assert answer["status"] == "ok" and answer["cancelled"] + answer["signalled"] >= 1, answer
        # A running job's row ends only once its node saw its crawl's process end: no row left waiting or running
        # means no crawl of the tree is left anywhere. (A crawl signalled while it was still starting never opens
        # its spider, so it has no end record of its own.)
        wait_for(lambda: query(admin_url, live)[0] == (0, 0), 90, "every crawl of the tree to end")
        ended_at = time.time()
        tree = third.get("tree.json", project="trees", job="root")

    assert query(admin_url, live)[0] == (0, 0)  # every crawl ended: nothing can schedule into the tree any more
    assert tree == {**tree, "done": True, "open": 0, "cancelled": True}
    assert tree["states"] == {"finished": tree["total"]} and tree["outcomes"].get("cancelled", 0) >= 1
    crawled = {run["args"].get("section", "0") for run in explore_runs(tmp_path)}
    assert len(crawled) < len(links)  # stopped before the end of the site
    # Nothing of the tree was claimed after the cancel (rows pruned since may be missing).
    assert {job for (job,) in query(admin_url, claimed)} <= claimed_by_the_cancel
    print(f"\ncancel of a tree of {tree['total']} jobs (site: {len(links)} sections) with {before[0]} running and "
          f"{before[1]} waiting: answer {answer}; the last crawl ended {ended_at - cancelled_at:.1f}s later; "
          f"outcomes {tree['outcomes']}; {len(crawled)} sections crawled")


def test_the_last_two_children_ending_at_the_same_instant_on_two_nodes_complete_the_tree_once(
    database, start_cluster, tmp_path
):
    """Over HTTP (_parent), with the example project's sleeper: the root ends first, then its two children end at
    the same instant on two nodes; the completion runs once, after both."""
    url, admin_url = database
    cluster = start_cluster(url, 3, max_proc="1", finished_to_keep="1000")
    first, second, third = cluster.nodes
    answer = first.post("schedule.json", project="example", spider="sleeper", jobid="root", seconds="2",
                        _on_complete="sleeper", _on_complete_args=json.dumps({"seconds": "0", "role": "completion"}))
    assert answer["status"] == "ok", answer
    wait_for(lambda: [run for run in runs(tmp_path) if run["job"] == "root"], 60, "the root to start")
    until = time.time() + 6  # both children start well before: each waits for the same instant
    for node, child in ((second, "left"), (third, "right")):
        answer = node.post("schedule.json", project="example", spider="sleeper", jobid=child, until=str(until),
                           _parent="root")
        assert answer["status"] == "ok", answer

    def completion_runs():
        return [run for run in runs(tmp_path) if run["args"].get("role") == "completion"]

    [completion] = wait_for(completion_runs, 60, "the completion job to run")
    children = {end["job"]: end for end in ends(tmp_path) if end["job"] in ("left", "right")}
    root_end = next(end for end in ends(tmp_path) if end["job"] == "root")
    assert root_end["ended"] < min(end["ended"] for end in children.values())  # the root ended first
    assert children["left"]["node"] != children["right"]["node"]
    spread = abs(children["left"]["ended"] - children["right"]["ended"])
    assert completion["started"] > max(end["ended"] for end in children.values())
    assert completion["args"]["tree"] == "root"
    rows = query(admin_url, "SELECT job FROM spider_job WHERE message->>'role' = 'completion'")
    assert len(rows) == 1 and len(completion_runs()) == 1
    print(f"\nchildren ended {spread * 1000:.0f} ms apart on {children['left']['node']} and "
          f"{children['right']['node']}; completion started "
          f"{completion['started'] - max(end['ended'] for end in children.values()):.2f}s after the last")


def test_a_tree_at_its_cap_refuses_the_next_child_over_http_and_ends_as_usual(database, start_cluster):
    """tree_max_jobs = 3 on the node: the fourth job of a tree is refused with the reason, at schedule.json and
    schedule_batch.json; a key the tree has (the root's own) still answers; other trees are not touched. The node
    scheduled through runs nothing (a done tree would refuse children for that reason first); another runs the
    tree once it is scheduled."""
    url, admin_url = database
    (node,) = start_cluster(url, 1, tree_max_jobs="3", **CLAIM_AT_START_ONLY).nodes
    sleeper = {"project": "example", "spider": "sleeper", "seconds": "0"}
    assert node.post("schedule.json", **sleeper, jobid="root", _unique_key="home",
                     _unique_scope="tree")["status"] == "ok"
    for child, parent in (("a", "root"), ("b", "a")):
        assert node.post("schedule.json", **sleeper, jobid=child, _parent=parent)["status"] == "ok"
    reason = ("the tree of root job 'root' has 3 jobs and may have at most 3 (tree_max_jobs): 1 more refused "
              "(0 would fit)")
    assert node.post("schedule.json", **sleeper, jobid="c", _parent="b") == {
        "status": "error", "message": reason, "node_name": "node1"}
    batch = requests.post(f"{node.url}schedule_batch.json", timeout=30, json=
                          {"project": "example", "jobs": [{"spider": "sleeper", "jobid": "d", "parent": "root"}]})
    assert batch.json() == {"status": "error", "message": reason, "node_name": "node1"}
    # The start page, linked back to from deep in the tree: the root's job id, no new job.
    assert node.post("schedule.json", **sleeper, _parent="b", _unique_key="home", _unique_scope="tree") == {
        "status": "ok", "jobid": "root", "existing": True, "node_name": "node1"}
    assert node.post("schedule.json", **sleeper, jobid="other-child", _parent="other")["message"] == (
        "parent job 'other' not found in project 'example'")
    assert node.post("schedule.json", **sleeper, jobid="other")["status"] == "ok"
    assert node.post("schedule.json", **sleeper, jobid="other-child", _parent="other")["status"] == "ok"

    start_cluster(url, 1, name_prefix="runner", tree_max_jobs="3")
    tree = wait_for(lambda: (t := node.get("tree.json", project="example", job="root"))["done"] and t, 60,
                    "the capped tree to end")
    assert (tree["total"], tree["outcomes"]) == (3, {"finished": 3})
    assert query(admin_url, "SELECT job FROM spider_job WHERE job IN ('c', 'd')") == []


def test_a_done_tree_refuses_a_child_over_http_and_stays_done(database, start_cluster):
    """A child scheduled (schedule.json, schedule_batch.json) into a tree that completed and ran its _on_complete is
    refused with the reason naming the tree; nothing of it is stored, and the tree stays done."""
    url, admin_url = database
    (node,) = start_cluster(url, 1).nodes
    sleeper = {"project": "example", "spider": "sleeper", "seconds": "0"}
    assert node.post("schedule.json", **sleeper, jobid="root", _on_complete="sleeper")["status"] == "ok"

    def completed():
        tree = node.get("tree.json", project="example", job="root")
        return tree["done"] and tree["completion_job"] in {job["id"] for job in node.get("listjobs.json")["finished"]} \
            and tree

    tree = wait_for(completed, 60, "the tree to end and its completion to run")
    reason = (f"the tree of root job 'root' is done (its last job ended, its _on_complete job "
              f"'{tree['completion_job']}' enqueued) and takes no new job: 1 refused; schedule without a parent to "
              f"run outside any tree")
    assert node.post("schedule.json", **sleeper, jobid="late", _parent="root") == {
        "status": "error", "message": reason, "node_name": "node1"}
    batch = requests.post(f"{node.url}schedule_batch.json", timeout=30, json=
                          {"project": "example", "jobs": [{"spider": "sleeper", "jobid": "late", "parent": "root"}]})
    assert batch.json() == {"status": "error", "message": reason, "node_name": "node1"}
    assert query(admin_url, "SELECT job FROM spider_job WHERE job = 'late'") == []
    assert node.get("tree.json", project="example", job="root") == tree
