"""The crawl API (scrapyd_pgqueue.crawl) on a real Postgres through the node's real crawl endpoint
(node/crawl_api.py): schedule() from a crawl's environment, and FollowUpPipeline in a real Scrapy crawl (a subprocess,
as a node starts one); the scope a crawl's token allows; the tree CLI over the same jobs.

End-to-end trees through real nodes are in test_trees.py.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import crawl_api_server, query
from scrapyd_pgqueue import cli, crawl
from scrapyd_pgqueue.crawl_process import crawl_node
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store import AllJobsStore, JobStore
from scrapyd_pgqueue.store.frontier import FrontierStore, NewRequest


def running_root(database_url) -> int:
    """Job "root" of project "p", running: its row id."""
    store = JobStore.for_url(database_url)  # migrates the schema, as the nodes do
    store.enqueue("p", {"name": "parent", "_job": "root"})
    [claimed] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
    return claimed.id


@contextlib.contextmanager
def crawl_of_root(database_url, tmp_path, monkeypatch, row_id, **settings):
    """This process as the crawl of job "root" of project "p", as its launch makes it: its node's endpoint and its
    token (the server's, which takes this process for the crawl)."""
    with crawl_api_server(database_url, "p", "root", row_id, tmp_path / "api", **settings) as server:
        monkeypatch.setenv(crawl.JOB_VARIABLE, "root")
        monkeypatch.setattr(crawl_node, "_schedulers", {})
        monkeypatch.setattr(crawl_node, "_node", (server.node, server.token))
        server.crawl_is(os.getpid())
        yield server


@pytest.fixture
def in_a_crawl(database_url, tmp_path, monkeypatch):
    with crawl_of_root(database_url, tmp_path, monkeypatch, running_root(database_url)) as env:
        yield env


def test_importing_the_crawl_api_costs_a_crawl_nothing():
    """No SQLAlchemy, psycopg2, store or Twisted reactor, ever (crawls must start fast, and hold no database)."""
    code = ("import sys, scrapyd_pgqueue.crawl; "
            "print([m for m in ('sqlalchemy', 'psycopg2', 'scrapyd_pgqueue.store', 'twisted.internet.reactor') "
            "if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_schedule_makes_children_of_the_running_crawl_with_tree_keys(database_url, in_a_crawl):
    first = crawl.schedule("page", {"url": "https://a/1"}, unique_key="a/1", priority=5, settings={"X": 1})
    again = crawl.schedule("page", {"url": "https://a/1"}, unique_key="a/1")
    other = crawl.schedule("page", {"url": "https://a/2"}, unique_key="a/2", delay=60)
    assert again == first != other
    rows = query(database_url, "SELECT job, parent, status, priority, retries, message FROM spider_job "
                               "WHERE parent IS NOT NULL ORDER BY id")
    assert [(job, parent, status) for job, parent, status, *_ in rows] == [
        (first, "root", "pending"), (other, "root", "delayed")]
    _, _, _, priority, retries, message = rows[0]
    assert (priority, retries) == (5, 2)  # the node's default_retries
    assert message == {"url": "https://a/1", "name": "page", "_job": first, "settings": {"X": "1"}}
    assert AllJobsStore.for_url(database_url).lineage(first, "p") == ("root", "root")
    assert {"sqlalchemy", "psycopg2", "scrapyd_pgqueue.store", "scrapyd_pgqueue.database"}.isdisjoint(
        crawl_imports_after_a_schedule(in_a_crawl))


def crawl_imports_after_a_schedule(server) -> set[str]:
    """The modules a crawl process (this environment, ``server``'s crawl) holds once it has scheduled a child."""
    code = ("import sys, scrapyd_pgqueue.crawl as c; from scrapyd_pgqueue.crawl_process import crawl_node; "
            "crawl_node.set_node(*sys.stdin.readline().split()); c.schedule('page', unique_key='imports'); "
            "print(' '.join(sys.modules))")
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server.crawl_is(process.pid)
    stdout, _ = process.communicate(f"{server.node} {server.token}\n", timeout=60)
    assert process.returncode == 0
    return set(stdout.split())


def test_bad_follow_ups_are_refused_with_the_reason_and_nothing_is_stored(database_url, in_a_crawl):
    with pytest.raises(ValueError, match="follow-up 1 \\(|follow-up 1: "):
        crawl.schedule_many([crawl.FollowUp("page"), crawl.FollowUp("page", {"name": "clash"})])
    with pytest.raises(ValueError, match="parent job 'nope' not found"):
        crawl.schedule("page", parent="nope")
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE parent IS NOT NULL") == [(0,)]


def test_a_crawl_schedules_into_its_own_project_only(database_url, in_a_crawl):
    with pytest.raises(TypeError, match="project"):
        crawl.schedule("page", project="other")
    with pytest.raises(TypeError, match="project"):
        crawl.schedule_many([crawl.FollowUp("page")], project="other")
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE project <> 'p'") == [(0,)]


@pytest.fixture
def in_a_crawl_with_a_cap_of_3(database_url, tmp_path, monkeypatch):
    """The crawl of root on a node whose tree_max_jobs is 3."""
    with crawl_of_root(database_url, tmp_path, monkeypatch, running_root(database_url), tree_max_jobs=3) as env:
        yield env


def test_a_tree_at_its_cap_refuses_the_next_follow_up_with_the_reason(database_url, in_a_crawl_with_a_cap_of_3):
    first = crawl.schedule_many([crawl.FollowUp("page", unique_key="a"), crawl.FollowUp("page", unique_key="b")])
    with pytest.raises(ValueError, match=r"the tree of root job 'root' has 3 jobs and may have at most 3 "
                                         r"\(tree_max_jobs\): 1 more refused"):
        crawl.schedule("page", unique_key="c")
    assert crawl.schedule("page", unique_key="a") == first[0]  # a key the tree has still answers
    view = AllJobsStore.for_url(database_url).tree("p", "root")
    assert (view.total, view.by_state) == (3, {"pending": 2, "running": 1})


def test_outside_a_crawl_schedule_says_what_is_missing(monkeypatch):
    monkeypatch.delenv(crawl.JOB_VARIABLE, raising=False)
    monkeypatch.setattr(crawl_node, "_node", (None, None))
    with pytest.raises(crawl.NotInACrawlError, match=r"no parent job \(SCRAPY_JOB\), node"):
        crawl.schedule("page")


def test_a_crawl_schedules_into_its_own_tree_only(database_url, in_a_crawl):
    """A parent of another tree of the project, or of another project, is refused; nothing is stored."""
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "parent", "_job": "stranger"})  # a root of another tree of p
    store.enqueue("q", {"name": "parent", "_job": "elsewhere"})  # a job of another project
    with pytest.raises(ValueError, match="parent job 'stranger' is not in the tree of job 'root'"):
        crawl.schedule("page", parent="stranger")
    with pytest.raises(ValueError, match="parent job 'elsewhere' not found in project 'p'"):
        crawl.schedule("page", parent="elsewhere")
    child = crawl.schedule("page")
    grandchild = crawl.schedule("page", parent=child)  # a job of its own tree
    assert query(database_url, "SELECT job, parent, project FROM spider_job WHERE parent IS NOT NULL ORDER BY id") \
        == [(child, "root", "p"), (grandchild, child, "p")]


def test_a_forged_token_schedules_nothing(database_url, in_a_crawl, monkeypatch):
    monkeypatch.setattr(crawl_node, "_node", (in_a_crawl.node, in_a_crawl.token[:-4] + "AAAA"))
    with pytest.raises(crawl.NotInACrawlError, match="unknown token: not a crawl running on this node"):
        crawl.schedule("page")
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE parent IS NOT NULL") == [(0,)]


def test_a_crawl_s_token_from_another_process_schedules_nothing(database_url, in_a_crawl):
    """A token read from a crawl (its memory, a log) is worth nothing elsewhere: the node checks the caller's pid."""
    code = ("import sys; from scrapyd_pgqueue.crawl_process import crawl_node; crawl_node.set_node(*sys.argv[1:]); "
            "import scrapyd_pgqueue.crawl as c; c.schedule('page')")
    result = subprocess.run([sys.executable, "-c", code, in_a_crawl.node, in_a_crawl.token],
                            env={**os.environ, crawl.JOB_VARIABLE: "root"}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "is not the calling process's" in result.stderr, result.stderr[-2000:]
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE parent IS NOT NULL") == [(0,)]


def test_a_request_over_the_nodes_body_limit_is_refused_with_the_reason(database_url, in_a_crawl):
    with pytest.raises(ValueError, match=r"takes at most 1048576 \(max_request_bytes\)"):
        crawl.schedule("page", {"blob": "x" * 2 * 1024 * 1024})
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE parent IS NOT NULL") == [(0,)]


def test_a_database_that_is_away_stores_nothing_and_says_so(stoppable_database, tmp_path, monkeypatch):
    url, _, server = stoppable_database
    with crawl_of_root(url, tmp_path, monkeypatch, running_root(url), database_timeout=3):
        server.stop()
        try:
            with pytest.raises(crawl.NodeUnavailableError, match=r"\(503\)"):
                crawl.schedule("page")
        finally:
            server.start()
        child = crawl.schedule("page")
    assert query(url, "SELECT job FROM spider_job WHERE parent = 'root'") == [(child,)]


PIPELINE_SPIDER = """\
import os, sys
import scrapy
from scrapyd_pgqueue.crawl import FollowUp
from scrapyd_pgqueue.crawl_process import crawl_node

crawl_node.set_node(*sys.stdin.readline().split())  # as its launch would: once the node knows this process

class Spider(scrapy.Spider):
    name = "{name}"
    custom_settings = {{"ITEM_PIPELINES": {{"scrapyd_pgqueue.crawl.FollowUpPipeline": 100}},
                       "FOLLOW_UP_BATCH_SIZE": {batch_size}, "LOG_LEVEL": "INFO", "TELNETCONSOLE_ENABLED": False}}

    async def start(self):
        yield scrapy.Request("data:text/plain,{name}", dont_filter=True)

    def parse(self, response):
{parse}
    def closed(self, reason):
        print("STATS " + __import__("json").dumps(
            {{k: v for k, v in self.crawler.stats.get_stats().items() if k.startswith({stats!r})}}))
"""


def pipeline_spider(name: str, batch_size: int, parse: str, stats: tuple[str, ...] = ("followup",)) -> str:
    """The source of a spider whose ``parse`` (its body) yields follow-ups through the FollowUpPipeline, and which
    prints the stats starting with ``stats`` when it closes."""
    body = textwrap.indent(textwrap.dedent(parse).strip("\n"), " " * 8) + "\n"
    return PIPELINE_SPIDER.format(name=name, batch_size=batch_size, parse=body, stats=stats)


def run_spider(server, tmp_path, source: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``scrapy runspider`` of ``source`` as the crawl of job root (``server``'s): the finished process and the stats it
    printed."""
    (tmp_path / "spider.py").write_text(source)
    process = subprocess.Popen([sys.executable, "-m", "scrapy", "runspider", "spider.py", "-a", "_job=root", *args],
                               cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    server.crawl_is(process.pid)
    stdout, stderr = process.communicate(f"{server.node} {server.token}\n", timeout=120)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    [stats] = [json.loads(line[6:]) for line in result.stdout.splitlines() if line.startswith("STATS ")]
    return result, stats


SPIDER = pipeline_spider("links", 500, """
    for n in range(1200):
        # 600 pages, each found twice; a plain item passes through
        yield FollowUp("page", {"n": str(n % 600)}, unique_key=f"page-{n % 600}")
    yield {"plain": "item"}
""", stats=("followup", "item"))


def test_the_pipeline_stores_follow_ups_in_batches_before_the_crawl_ends(database_url, in_a_crawl, tmp_path):
    result, stats = run_spider(in_a_crawl, tmp_path, SPIDER, "-o", "items.jsonl")
    assert stats["followup/scheduled"] == 600 and stats["followup/known"] == 600
    assert stats["item_dropped_count"] == 1200 and stats["item_scraped_count"] == 1
    assert [json.loads(line) for line in (tmp_path / "items.jsonl").read_text().splitlines()] == [{"plain": "item"}]
    rows = query(database_url, "SELECT count(*), count(DISTINCT message->>'n'), min(parent), max(parent) "
                               "FROM spider_job WHERE parent IS NOT NULL")
    assert rows == [(600, 600, "root", "root")]
    assert in_a_crawl.token not in result.stderr  # no token in its log

    # The tree as people and scripts see it: the root still running, 600 children pending.
    view = AllJobsStore.for_url(database_url).tree("p", "root")
    assert (view.total, view.open, view.done, view.by_state) == (601, 601, False, {"pending": 600, "running": 1})


REFUSING_SPIDER = pipeline_spider("refused", 10, """
    pages = [FollowUp("page", {"n": str(n)}, unique_key=f"page-{n}") for n in range(25)]
    # First batch of 10: a job id already live, and one job id twice; the second batch: a key held by a
    # waiting job with on_conflict="error"; the last: the first refused one's tree key, found again.
    pages[3:3] = [FollowUp("page", {"n": "taken"}, unique_key="found-again", jobid="taken")]
    pages[6:6] = [FollowUp("page", {"n": "twin-1"}, jobid="twin"), FollowUp("page", {"n": "twin-2"}, jobid="twin")]
    pages[12:12] = [FollowUp("page", {"n": "held"}, unique_key="held", unique_scope="waiting",
                             on_conflict="error")]
    yield from pages
    yield FollowUp("page", {"n": "again"}, unique_key="found-again")
""")


def test_a_follow_up_the_database_refuses_loses_only_itself(database_url, in_a_crawl, tmp_path):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "page", "_job": "taken"})  # a live job id
    store.enqueue("p", {"name": "page", "_job": "holder"}, options=JobOptions(unique_key="held"))  # a waiting key
    result, stats = run_spider(in_a_crawl, tmp_path, REFUSING_SPIDER)
    assert stats == {"followup/scheduled": 27, "followup/known": 0, "followup/refused": 3}
    for reason in ("Follow-up job taken of spider page refused: job id 'taken' is already pending or running",
                   "Follow-up job twin of spider page refused: job id 'twin' is already pending or running",
                   "spider page refused: unique_key 'held' is held by waiting job 'holder'"):
        assert result.stderr.count(reason) == 1, result.stderr[-3000:]
    children = query(database_url, "SELECT message->>'n' FROM spider_job WHERE parent = 'root'")
    assert sorted(n for n, in children) == sorted([*map(str, range(25)), "twin-1", "again"])
    assert query(database_url, "SELECT message->>'n' FROM spider_job WHERE job IN ('taken', 'holder')") == [
        (None,), (None,)]  # the jobs that were there are untouched


def test_the_tree_command(database_url, in_a_crawl, capsys):
    child = crawl.schedule("page", unique_key="k")
    assert cli.main(["tree", child, "--json", "--database-url", database_url]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer == {**answer, "root": "root", "project": "p", "total": 2, "open": 2, "done": False,
                      "states": {"pending": 1, "running": 1}, "failures": [], "cancelled": False}
    assert cli.main(["tree", "root", "--database-url", database_url]) == 0
    out = capsys.readouterr().out
    assert "Tree root of project p: 2 jobs, open: 2 jobs not ended" in out and "running" in out
    assert cli.main(["tree", "nope", "--project", "p", "--database-url", database_url]) == 1


def test_a_child_carries_its_own_watchdog_limits(database_url, in_a_crawl):
    bounded = crawl.schedule("page", max_runtime=30, stall_timeout=5)
    [other] = crawl.schedule_many([crawl.FollowUp("page", max_runtime=60)])
    assert query(database_url, "SELECT job, max_runtime, stall_timeout FROM spider_job WHERE parent = 'root' "
                               "ORDER BY id") == [(bounded, 30.0, 5.0), (other, 60.0, None)]
    with pytest.raises(ValueError, match="max_runtime must be more than 0"):
        crawl.schedule("page", max_runtime=0)


def test_a_child_carries_its_own_tags_or_else_its_spider_s_route(database_url, in_a_crawl):
    query(database_url, "INSERT INTO spider_route (project, spider, pool) VALUES ('p', 'page', 'browser')")
    tagged = crawl.schedule("page", tags=["gpu", "eu"])
    [routed, anywhere] = crawl.schedule_many([crawl.FollowUp("page"), crawl.FollowUp("page", tags="")])
    assert query(database_url, "SELECT job, pool FROM spider_job WHERE parent = 'root' ORDER BY id") == [
        (tagged, "eu,gpu"), (routed, "browser"), (anywhere, "")]
    with pytest.raises(ValueError, match="_tags: tag 'a b' is not valid"):
        crawl.schedule("page", tags="a b")


def frontier_request(name: str) -> dict:
    encoded = base64.b64encode(name.encode()).decode()
    return {"fingerprint": encoded, "priority": 0, "slot": "a", "request": encoded}


def test_a_frontier_step_reaches_its_own_crawl_only(database_url, in_a_crawl, monkeypatch):
    # Another crawl of another project, with a request ready.
    other = JobStore.for_url(database_url).enqueue("q", {"name": "big", "_job": "other"}).id
    query(database_url, "UPDATE spider_job SET crawl = id WHERE id = %s", (other,))
    FrontierStore.for_url(database_url).step(other, other, new=[NewRequest(b"x", 0, "a", b"secret request")])
    [(other_request,)] = query(database_url, "SELECT id FROM crawl_request WHERE crawl = %s", (other,))

    # This crawl (a job using the frontier is its own crawl) stores and leases its own requests, never the other's,
    # and cannot finish the other crawl's request by naming it.
    step = crawl_node.frontier_step({"new": [frontier_request("mine")], "done": [other_request], "lease": 5})
    assert [base64.b64decode(leased["request"]) for leased in step["leased"]] == [b"mine"]
    assert query(database_url, "SELECT status FROM crawl_request WHERE id = %s", (other_request,)) == [("ready",)]
    # A forged token is refused, and so is a real token sent by another process than its crawl's.
    monkeypatch.setattr(crawl_node, "_node", (in_a_crawl.node, in_a_crawl.token[:-4] + "AAAA"))
    with pytest.raises(crawl_node.NotInACrawlError, match="unknown token"):
        crawl_node.frontier_step({"lease": 5})
    code = ("import sys; from scrapyd_pgqueue.crawl_process import crawl_node; crawl_node.set_node(*sys.argv[1:]); "
            "crawl_node.frontier_step({'lease': 5})")
    result = subprocess.run([sys.executable, "-c", code, in_a_crawl.node, in_a_crawl.token], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "is not the calling process's" in result.stderr, result.stderr[-2000:]
    assert query(database_url, "SELECT count(*) FROM crawl_request WHERE status = 'leased'") == [(1,)]


def test_a_malformed_frontier_step_is_refused_with_its_reason(in_a_crawl):
    for body, reason in (({"lease": -1}, "lease must be an integer from 0 to 1000"),
                         ({"per_slot": "8"}, "per_slot must be an integer from 1 to 1000"),
                         ({"delay": "1"}, "delay must be a number of seconds from 0 to 3600"),
                         ({"delay": 7200}, "delay must be a number of seconds from 0 to 3600"),
                         ({"done": ["1"]}, "done must be a list of request ids"),
                         ({"new": [{"fingerprint": None}]}, "new: each request needs fingerprint, priority, slot")):
        with pytest.raises(crawl_node.NotInACrawlError, match=re.escape(f"(400): {reason}")):
            crawl_node.frontier_step(body)
