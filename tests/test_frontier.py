"""One crawl on many workers, end to end: real nodes run the example project's ``site`` spider as ``_workers=N`` jobs
sharing one frontier, over a generated site on loopback whose pages link to each other many times over.

The measures are the site's own count of requests per page, the crawls' records (pages.jsonl: which job fetched
which page; ends.jsonl: each worker's close and its reason), and the frontier's rows.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import signal
import time

import pytest
from scrapy import Request
from scrapy.utils.request import fingerprint

from helpers import SiteServer, connect, ends, query, runs, scrape, value, wait_for
from scrapyd_pgqueue.frontier import Scheduler

CONFIG = {"max_proc": "2", "finished_to_keep": "1000"}


def wide_site(pages: int) -> dict[str, list[str]]:
    """A site of ``pages`` pages, all reachable from page 0, each linked from several others: page i links to
    2i+1 and 2i+2 (a tree), to its parent and to one more page across the site."""
    return {str(i): [str(j) for j in (2 * i + 1, 2 * i + 2, i // 2, (7 * i + 3) % pages) if j < pages]
            for i in range(pages)}


@contextlib.contextmanager
def site_on_hosts(links: dict[str, list[str]], hosts: int, delay: float):
    """The site spread over ``hosts`` loopback addresses (127.0.0.2 and up), page i on host i mod ``hosts``: each a
    download slot of its own to a crawler. Yields the servers (the first serves the home page) and each page's count
    of requests, all hosts together."""
    urls: dict[int, str] = {}
    servers = [SiteServer(links, delay, host=f"127.0.0.{2 + h}",
                          locate=lambda page: f"{urls[int(page) % hosts]}/section/{page}") for h in range(hosts)]
    urls.update(enumerate(server.url for server in servers))
    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.enter_context(server)
        yield servers, lambda: sum((server.requests for server in servers), collections.Counter())


def pages(tmp_path) -> list[dict]:
    path = tmp_path / "records" / "pages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def terminated(url, jobs) -> bool:
    rows = query(url, "SELECT count(*) FROM spider_job WHERE job = ANY(%s) AND status = 'terminated'", (jobs,))
    return rows[0][0] == len(jobs)


def test_a_crawl_of_three_workers_fetches_every_page_once_and_all_close_finished(database_url, start_cluster,
                                                                                  tmp_path):
    links = wide_site(2000)
    cluster = start_cluster(database_url, 2, **CONFIG)
    with site_on_hosts(links, 4, delay=0.02) as (servers, requests):  # 4 hosts: 4 download slots
        answer = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="big",
                                       site=servers[0].url, _workers="3", _on_complete="sleeper",
                                       _on_complete_args=json.dumps({"seconds": "0", "role": "completion"}))
        assert answer["status"] == "ok", answer
        assert answer["jobid"] == "big" and answer["workers"] == ["big", "big-2", "big-3"]
        wait_for(lambda: terminated(database_url, answer["workers"]), 240, "the crawl's workers to end")
        [completion] = wait_for(lambda: [run for run in runs(tmp_path) if run["args"].get("role") == "completion"],
                                60, "the crawl's completion job to run")

    # Every page reachable from the home page fetched, none twice (the home page is each worker's start request,
    # stored once for the crawl), as the site counted them and as the crawls recorded them.
    assert set(requests()) == set(links) and set(requests().values()) == {1}, requests()
    fetched = collections.Counter(record["page"] for record in pages(tmp_path))
    assert fetched == collections.Counter(set(links))
    by_worker = collections.Counter(record["job"] for record in pages(tmp_path))
    assert len(by_worker) >= 2, by_worker  # the crawl was spread
    # The crawl's completion ran once, after its last page and its last worker.
    assert completion["started"] > max(record["fetched"] for record in pages(tmp_path))
    assert completion["started"] > max(end["ended"] for end in ends(tmp_path) if end["job"].startswith("big"))
    assert len([run for run in runs(tmp_path) if run["args"].get("role") == "completion"]) == 1
    # Each worker closed with finished, once the frontier had nothing ready or held.
    assert sorted((end["job"], end["reason"]) for end in ends(tmp_path) if end["job"].startswith("big")) == [
        ("big", "finished"), ("big-2", "finished"), ("big-3", "finished")]
    assert query(database_url, "SELECT status, count(*) FROM crawl_request GROUP BY status") == [
        ("done", len(links))]
    assert query(database_url, "SELECT job, outcome, crawl = (SELECT id FROM spider_job WHERE job = 'big') "
                               "FROM spider_job WHERE job LIKE 'big%%' ORDER BY job") == [
        ("big", "finished", True), ("big-2", "finished", True), ("big-3", "finished", True)]
    finished = cluster.nodes[1].get("listjobs.json", project="example")["finished"]
    assert sorted((entry["id"], entry["crawl"]) for entry in finished if entry["spider"] == "site") == [
        ("big", "big"), ("big-2", "big"), ("big-3", "big")]
    # Any node answers for the crawl: its frontier, the duplicates its workers dropped, each worker.
    view = cluster.nodes[1].get("crawl.json", project="example", crawl="big")
    links_found = sum(len(targets) for targets in links.values()) + 3  # every link, and each worker's start
    assert view == {**view, "status": "ok", "crawl": "big", "queued": 0, "in_flight": 0, "done": len(links),
                    "failed": 0, "duplicates": links_found - len(links)}
    assert 0 < view["pages_per_minute"] <= len(links)  # those done in the last minute
    # The crawl's stats are its workers' together; the nodes' counters add up to the crawl.
    assert view["stats"]["item_scraped_count"] == len(links)
    assert view["stats"]["downloader/response_count"] == len(links)
    scrapes = [scrape(node) for node in cluster.nodes]
    counted = {event: sum(value(samples, "scrapyd_pgqueue_frontier_requests_total", project="example", spider="site",
                                event=event) or 0 for samples in scrapes)
               for event in ("stored", "duplicate", "leased", "done", "failed")}
    assert counted == {"stored": len(links), "duplicate": links_found - len(links), "leased": len(links),
                       "done": len(links), "failed": 0}
    assert [(worker["id"], worker["state"], worker["outcome"]) for worker in view["workers"]] == [
        ("big", "finished", "finished"), ("big-2", "finished", "finished"), ("big-3", "finished", "finished")]
    assert cluster.nodes[1].get("crawl.json", project="example", crawl="big-2") == {
        "node_name": "node2", "status": "error", "message": "crawl 'big-2' not found in project 'example'"}


def test_a_worker_killed_mid_crawl_loses_no_page_and_only_what_it_held_is_fetched_again(database_url, start_cluster,
                                                                                        tmp_path):
    links = wide_site(300)
    cluster = start_cluster(database_url, 2, **CONFIG)  # 3 workers, 2 slots a node: each node runs one at least
    with site_on_hosts(links, 4, delay=0.3) as (servers, requests):
        answer = cluster.nodes[1].post("schedule.json", project="example", spider="site", jobid="big",
                                       site=servers[0].url, _workers="3")
        assert answer["status"] == "ok", answer
        wait_for(lambda: len(pages(tmp_path)) >= len(links) // 4, 60, "a quarter of the site")
        latest = pages(tmp_path)[-1]["node"]  # a node whose worker is fetching now
        victim = next(node for node in cluster.nodes if node.name == latest)
        os.killpg(victim.process.pid, signal.SIGKILL)  # the node and its crawls, with no goodbye
        wait_for(lambda: terminated(database_url, answer["workers"]), 180, "the crawl's workers to end")

    # No page lost; a page downloaded twice was held by a killed worker: its lease went back to the crawl when its
    # job was recovered (the frontier counts each request's leases), and a killed worker held a few at most.
    assert set(requests()) == set(links)
    assert set(collections.Counter(record["page"] for record in pages(tmp_path))) == set(links)
    leases = {bytes(fp): attempts for fp, attempts in query(database_url,
                                                            "SELECT fingerprint, attempts FROM crawl_request")}
    leased_again = {page for page in links
                    if leases[fingerprint(Request(f"{servers[int(page) % 4].url}/section/{page}"))] > 1}
    downloaded_again = {page for page, count in requests().items() if count > 1}
    assert leased_again, "the killed node's workers held no request"
    assert downloaded_again <= leased_again and max(requests().values()) <= 2, requests()
    assert len(leased_again) <= 2 * Scheduler.lease_size_for(16)  # what two killed workers could hold
    # Every worker ended finished: the killed ones ran again and rejoined the crawl (or found it done).
    assert query(database_url, "SELECT DISTINCT outcome FROM spider_job") == [("finished",)]
    assert query(database_url, "SELECT status, count(*) FROM crawl_request GROUP BY status") == [
        ("done", len(links))]


def test_a_cancelled_crawl_leaves_nothing_running_and_no_request_held(database_url, start_cluster, tmp_path):
    links = wide_site(300)
    cluster = start_cluster(database_url, 2, **CONFIG)
    with SiteServer(links, delay=1.0) as site:
        answer = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="big",
                                       site=site.url, _workers="3")
        wait_for(lambda: len(pages(tmp_path)) >= 5, 60, "the crawl to fetch pages")
        # While it runs, /metrics on any node has the crawl's gauges under its spider.
        samples = scrape(cluster.nodes[1])
        gauges = {name: value(samples, f"scrapyd_pgqueue_frontier_{name}", project="example", spider="site")
                  for name in ("crawls", "workers", "queued_requests", "in_flight_requests")}
        assert gauges["crawls"] == 1 and 1 <= gauges["workers"] <= 3, gauges
        assert gauges["queued_requests"] + gauges["in_flight_requests"] > 0, gauges
        cancel = cluster.nodes[1].post("cancel.json", project="example", job="big", _tree="1")
        assert cancel["status"] == "ok", cancel
        wait_for(lambda: terminated(database_url, answer["workers"]), 60, "every worker to end")
    assert query(database_url, "SELECT DISTINCT outcome FROM spider_job") == [("cancelled",)]
    assert len(pages(tmp_path)) < len(links)  # stopped before the end of the site
    # Nothing of the crawl is held by a worker; what was not fetched stays ready, never handed out again.
    statuses = dict(query(database_url, "SELECT status, count(*) FROM crawl_request GROUP BY status"))
    assert "leased" not in statuses and statuses["ready"] > 0, statuses
    assert value(scrape(cluster.nodes[0]), "scrapyd_pgqueue_frontier_crawls", project="example", spider="site") is None


def test_workers_out_of_range_or_not_a_number_are_refused_as_scrapyd_refuses(database_url, start_cluster):
    node, = start_cluster(database_url, 1, max_workers="4").nodes
    for workers, message in (("0", "workers must be at least 1, not 0"), ("5", "_workers must be at most 4 "
                             "(max_workers), not 5"), ("two", "workers must be an integer, not 'two'")):
        answer = node.post("schedule.json", project="example", spider="site", site="http://127.0.0.1:9",
                           _workers=workers)
        assert answer["status"] == "error" and message in answer["message"], answer
    batch = {"project": "example", "jobs": [{"spider": "site", "args": {"site": "http://127.0.0.1:9"}, "workers": 2}]}
    answer = node.post_json("schedule_batch.json", batch)
    assert answer["status"] == "error" and "unknown keys ['workers']" in answer["message"], answer
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(0,)]


def test_a_site_never_sees_more_requests_at_once_than_its_per_domain_setting_whatever_the_workers(
        database_url, start_cluster):
    links = wide_site(60)
    cluster = start_cluster(database_url, 2, **CONFIG)
    with SiteServer(links, delay=0.2) as site:
        answer = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="polite",
                                       site=site.url, _workers="3", setting="CONCURRENT_REQUESTS_PER_DOMAIN=2")
        assert answer["status"] == "ok", answer
        wait_for(lambda: terminated(database_url, answer["workers"]), 120, "the crawl's workers to end")
    assert set(site.requests) == set(links)
    assert site.most_at_once == 2  # 3 workers, each allowed 2 by Scrapy: the crawl's 2, measured by the site


def test_per_ip_concurrency_holds_for_the_whole_crawl_too(database_url, start_cluster):
    links = wide_site(60)
    cluster = start_cluster(database_url, 2, **CONFIG)
    with site_on_hosts(links, 2, delay=0.2) as (servers, requests):  # two addresses: two slots when keyed by IP
        answer = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="polite",
                                       site=servers[0].url, _workers="3", setting="CONCURRENT_REQUESTS_PER_IP=1")
        assert answer["status"] == "ok", answer
        wait_for(lambda: terminated(database_url, answer["workers"]), 120, "the crawl's workers to end")
    assert set(requests()) == set(links)
    assert [server.most_at_once for server in servers] == [1, 1]  # Scrapy's per-IP cap replaces the per-domain one


def test_a_site_sees_the_download_delay_between_any_two_requests_of_the_crawl_whatever_the_workers(
        database_url, start_cluster):
    links = {str(page): [] for page in range(9)}  # 9 start pages, all ready at once
    cluster = start_cluster(database_url, 2, **CONFIG)
    with SiteServer(links) as site:
        # One request at a time per worker: each worker holds one of the 9, and could fetch it at once.
        answer = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="slow", site=site.url,
                                       start_pages="9", _workers="3", setting=[
                                           "DOWNLOAD_DELAY=1", "RANDOMIZE_DOWNLOAD_DELAY=False", "CONCURRENT_REQUESTS=1"])
        assert answer["status"] == "ok", answer
        wait_for(lambda: terminated(database_url, answer["workers"]), 120, "the crawl's workers to end")
    assert set(site.requests) == set(links)
    gaps = [later - earlier for earlier, later in zip(site.arrivals, site.arrivals[1:])]
    print(f"seconds between requests: {[round(gap, 2) for gap in gaps]}")
    # 3 workers, each allowed one request a second by Scrapy: the crawl's one a second, as the site saw them (a lease
    # and its download are a step's round trip apart, a few tens of milliseconds either way).
    assert min(gaps) > 0.9, gaps


def test_a_request_that_fails_past_scrapy_s_retries_is_recorded_failed_with_its_error(database_url, start_cluster):
    links = {"0": ["1", "dead"], "1": ["0"], "dead": []}
    dead = "http://127.0.0.1:9/section/dead"  # nothing listens on the discard port: connection refused
    node, = start_cluster(database_url, 1, **CONFIG).nodes
    with SiteServer(links, locate=lambda page: dead if page == "dead" else f"/section/{page}") as site:
        answer = node.post("schedule.json", project="example", spider="site", jobid="failing", site=site.url,
                           _workers="1")
        wait_for(lambda: terminated(database_url, answer["workers"]), 60, "the crawl to end")
    view = node.get("crawl.json", project="example", crawl="failing")
    assert (view["done"], view["failed"], view["queued"], view["in_flight"]) == (2, 1, 0, 0), view
    [(error,)] = query(database_url, "SELECT error FROM crawl_request WHERE status = 'failed'")
    assert "ConnectionRefusedError: Connection was refused" in error, error
    assert view["workers"][0]["outcome"] == "finished"


def test_workers_that_join_a_running_crawl_share_its_frontier(database_url, start_cluster, tmp_path):
    links = wide_site(200)
    cluster = start_cluster(database_url, 2, **CONFIG, max_workers="3")
    with site_on_hosts(links, 4, delay=0.5) as (servers, requests):
        first = cluster.nodes[0].post("schedule.json", project="example", spider="site", jobid="big",
                                      site=servers[0].url, _workers="1")
        wait_for(lambda: len(pages(tmp_path)) >= 10, 60, "the crawl to fetch pages")
        joined = cluster.nodes[1].post("schedule.json", project="example", spider="site", _join="big",
                                       _workers="2")
        assert joined == {**joined, "status": "ok", "crawl": "big", "jobid": "big-2", "workers": ["big-2", "big-3"]}
        for refused, message in (({"_join": "nope"}, "crawl 'nope' not found in project 'example'"),
                                 ({"_join": "big"}, "crawl 'big' has 3 workers and may have at most 3"),
                                 ({"_join": "big", "spider": "quotes"}, "is a crawl of spider 'site', not 'quotes'")):
            answer = cluster.nodes[1].post("schedule.json", **{"project": "example", "spider": "site", **refused})
            assert answer["status"] == "error" and message in answer["message"], answer
        wait_for(lambda: terminated(database_url, first["workers"] + joined["workers"]), 120, "the crawl to end")
    assert set(requests()) == set(links) and set(requests().values()) == {1}
    fetched_by = collections.Counter(record["job"] for record in pages(tmp_path))
    assert fetched_by["big-2"] + fetched_by["big-3"] > 0, fetched_by  # the new workers took part
    assert [(worker["id"], worker["outcome"]) for worker in cluster.nodes[0].get(
        "crawl.json", project="example", crawl="big")["workers"]] == [
        ("big", "finished"), ("big-2", "finished"), ("big-3", "finished")]


def memory_of(pid: int) -> dict[str, int]:
    """A process's resident set now (VmRSS) and at its highest (VmHWM), in kB."""
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    return {field: int(status[field].split()[0]) for field in ("VmRSS", "VmHWM")}


def test_a_worker_s_memory_is_the_same_with_100k_requests_queued_as_with_1k(database_url, start_cluster):
    node, = start_cluster(database_url, 1, **CONFIG, warm_start="off").nodes  # two crawls that start alike
    memory = {}
    # A site of 100k pages that answer slowly: each crawl stays at its start while its start requests are stored.
    with SiteServer({str(page): [] for page in range(100_000)}, delay=2.0) as site, \
            contextlib.closing(connect(database_url)) as locker:
        for starts, outage in ((1_000, 0), (100_000, 20)):
            job = f"starts{starts}"
            # For 100k, the frontier is slow at first (its table locked for 20 s, as a busy database would be): the
            # spider yields its start requests far faster than they can be stored.
            with locker.cursor() as cursor:
                cursor.execute("BEGIN; LOCK TABLE crawl_request IN SHARE MODE" if outage else "BEGIN")
                answer = node.post("schedule.json", project="example", spider="site", jobid=job, site=site.url,
                                   start_pages=str(starts), _workers="1")
                assert answer["status"] == "ok", answer
                if outage:
                    wait_for(lambda: query(database_url, "SELECT count(*) FROM pg_locks WHERE NOT granted "
                                                         "AND relation = 'crawl_request'::regclass")[0][0] > 0,
                             60, "the worker's first step to wait on the lock")
                    time.sleep(outage)  # the outage's length, not a wait for an event
                cursor.execute("ROLLBACK")

            def stored():
                view = node.get("crawl.json", project="example", crawl=job)
                return view["status"] == "ok" and view["queued"] + view["in_flight"] + view["done"] == starts

            wait_for(stored, 240, f"the {starts} start requests to be stored")
            [(pid,)] = query(database_url, "SELECT pid FROM spider_job WHERE job = %s", (job,))
            memory[starts] = memory_of(pid)
            assert node.post("cancel.json", project="example", job=job)["status"] == "ok"
            wait_for(lambda: terminated(database_url, [job]), 60, "the crawl to end")
    print(f"worker memory, kB: {memory}")
    # The spider yielded every start request at once; the worker held a step's worth at a time, never the crawl's.
    assert memory[100_000]["VmHWM"] <= 1.1 * memory[1_000]["VmHWM"], memory
    assert memory[100_000]["VmRSS"] <= 1.1 * memory[1_000]["VmRSS"], memory


def test_a_request_that_cannot_be_stored_fails_at_enqueue_naming_it():
    import threading as unpicklable

    from scrapy import Spider

    from scrapyd_pgqueue.crawl_process.frontier_outputs import stored_request

    class Site(Spider):
        name = "site"

        def parse(self, response):
            pass

    spider = Site()
    assert pickle.loads(stored_request(Request("http://a/1", callback=spider.parse), spider))["url"] == "http://a/1"
    for request in (Request("http://a/2", callback=lambda response: None),
                    Request("http://a/3", meta={"lock": unpicklable.Lock()})):
        with pytest.raises(ValueError, match=rf"<GET {request.url}> cannot be stored in the frontier: .*callbacks "
                                             "must be methods of the spider, meta values picklable"):
            stored_request(request, spider)
