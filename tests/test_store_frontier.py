"""The frontier in the store, on a real Postgres: deduplication per crawl, leases in priority order that concurrent
workers never share, leases given back when a worker's job stops running, and a crawl that is open exactly while a
request is ready or held."""

from __future__ import annotations

import threading

from helpers import finish, query
from scrapyd_pgqueue.store import JobStore
from scrapyd_pgqueue.store.frontier import FrontierStore, NewRequest


def new(name: str, priority: int = 0, dont_filter: bool = False, slot: str = "example.com") -> NewRequest:
    return NewRequest(None if dont_filter else name.encode(), priority, slot, f"request {name}".encode())


def workers(database_url, count: int) -> list[int]:
    """``count`` running jobs of one crawl (the first is the crawl): their row ids."""
    store = JobStore.for_url(database_url)
    for n in range(count):
        store.enqueue("p", {"name": "big", "_job": f"worker-{n}"})
    claimed = store.claim_next_jobs(["p"], count, node="n", worker="w").jobs
    ids = sorted(job.id for job in claimed)
    query(database_url, "UPDATE spider_job SET crawl = %s WHERE id = ANY(%s)", (ids[0], ids))
    return ids


def names(step) -> list[str]:
    return [leased.request.decode().removeprefix("request ") for leased in step.leased]


def test_a_request_is_stored_once_per_crawl_unless_it_is_dont_filter(database_url):
    crawl, = workers(database_url, 1)
    frontier = FrontierStore.for_url(database_url)
    first = frontier.step(crawl, crawl, new=[new("a"), new("b"), new("a"), new("s", dont_filter=True)])
    assert (first.stored, first.duplicates) == (3, 1)  # a duplicate within one batch too
    again = frontier.step(crawl, crawl, new=[new("a"), new("b"), new("c"), new("s", dont_filter=True)])
    assert (again.stored, again.duplicates) == (2, 2)
    assert frontier.counts(crawl) == {"ready": 5, "leased": 0, "done": 0, "failed": 0}
    # Another crawl deduplicates on its own.
    other = JobStore.for_url(database_url).enqueue("p", {"name": "big", "_job": "other"}).id
    assert frontier.step(other, other, new=[new("a"), new("b")]).stored == 2


def test_leases_follow_priority_then_the_order_stored_and_are_never_shared(database_url):
    crawl, second = workers(database_url, 2)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(crawl, crawl, new=[new("low", -1), new("a"), new("high", 5), new("b"), new("c")])
    assert names(frontier.step(crawl, crawl, lease=3)) == ["high", "a", "b"]
    assert names(frontier.step(crawl, second, lease=3)) == ["c", "low"]
    assert frontier.counts(crawl)["leased"] == 5


def test_concurrent_workers_take_each_request_exactly_once(database_url):
    ids = workers(database_url, 4)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(ids[0], ids[0], new=[new(f"r{n}", n % 7) for n in range(600)])
    taken: dict[int, list[str]] = {worker: [] for worker in ids}
    together = threading.Barrier(len(ids))

    def work(worker):
        together.wait()
        step = frontier.step(ids[0], worker, lease=7)
        while step.leased:
            taken[worker] += names(step)
            step = frontier.step(ids[0], worker, done=[leased.id for leased in step.leased], lease=7)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [name for names_ in taken.values() for name in names_]
    assert sorted(everything) == sorted(f"r{n}" for n in range(600))  # each once, none lost
    assert sum(1 for names_ in taken.values() if names_) >= 2  # they did take from the crawl at the same time
    assert frontier.counts(ids[0]) == {"ready": 0, "leased": 0, "done": 600, "failed": 0}


def test_a_worker_whose_job_stops_running_gives_its_leases_back(database_url):
    crawl, second = workers(database_url, 2)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(crawl, crawl, new=[new("a"), new("b"), new("c")])
    held = frontier.step(crawl, second, lease=2)
    assert names(held) == ["a", "b"]
    # Its node stops and hands the job back (or dies and is recovered): the requests are the crawl's again.
    query(database_url, "UPDATE spider_job SET status = 'pending', worker = NULL WHERE id = %s", (second,))
    assert frontier.counts(crawl) == {"ready": 3, "leased": 0, "done": 0, "failed": 0}
    assert names(frontier.step(crawl, crawl, lease=5)) == ["a", "b", "c"]
    # A late acknowledgement of a request it no longer holds changes nothing.
    frontier.step(crawl, second, done=[leased.id for leased in held.leased])
    assert frontier.counts(crawl)["leased"] == 3


def test_a_crawl_is_open_while_a_request_is_ready_or_held_and_its_last_step_closes_it(database_url):
    crawl, second = workers(database_url, 2)
    frontier = FrontierStore.for_url(database_url)
    assert frontier.step(crawl, crawl, new=[new("a")]).crawl_open
    held = frontier.step(crawl, second, lease=1)
    idle = frontier.step(crawl, crawl, lease=1)
    assert idle.leased == [] and idle.crawl_open  # nothing to take, but another worker holds one
    # The worker's output is stored with its acknowledgement: the crawl never looks done in between.
    step = frontier.step(crawl, second, new=[new("b")], done=[held.leased[0].id], lease=0)
    assert step.crawl_open
    last = frontier.step(crawl, crawl, lease=1)
    assert names(last) == ["b"]
    assert not frontier.step(crawl, crawl, done=[last.leased[0].id]).crawl_open


def test_a_failed_request_keeps_its_error_and_the_frontier_goes_with_its_crawl(database_url):
    crawl, = workers(database_url, 1)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(crawl, crawl, new=[new("a"), new("b")])
    a, b = frontier.step(crawl, crawl, lease=2).leased
    frontier.step(crawl, crawl, done=[a.id], failed=[(b.id, "TimeoutError: took longer than 180.0 seconds")])
    assert query(database_url, "SELECT convert_from(fingerprint, 'UTF8'), status, error, request IS NULL "
                               "FROM crawl_request ORDER BY id") \
        == [("a", "done", None, True), ("b", "failed", "TimeoutError: took longer than 180.0 seconds", False)]
    query(database_url, "DELETE FROM spider_job WHERE id = %s", (crawl,))
    assert query(database_url, "SELECT count(*) FROM crawl_request") == [(0,)]


def test_a_download_slot_never_has_more_requests_held_than_its_cap_in_the_whole_crawl(database_url):
    crawl, second = workers(database_url, 2)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(crawl, crawl, new=[new(f"{host}{n}", slot=host) for n in range(4) for host in ("a", "b")])
    first = frontier.step(crawl, crawl, lease=10, per_slot=2)
    assert names(first) == ["a0", "b0", "a1", "b1"]  # in order, two of each host
    assert frontier.step(crawl, second, lease=10, per_slot=2).leased == []  # the crawl holds the cap: none more
    frontier.step(crawl, crawl, done=[first.leased[0].id])
    assert names(frontier.step(crawl, second, lease=10, per_slot=2)) == ["a2"]  # one freed, one taken


def test_with_a_delay_a_download_slot_gives_one_request_per_delay_to_the_whole_crawl(database_url):
    crawl, second = workers(database_url, 2)
    frontier = FrontierStore.for_url(database_url)
    frontier.step(crawl, crawl, new=[new(f"{host}{n}", slot=host) for n in range(3) for host in ("a", "b")])
    assert names(frontier.step(crawl, crawl, lease=10, delay=60)) == ["a0", "b0"]  # one of each slot
    assert frontier.step(crawl, second, lease=10, delay=60).leased == []  # both slots wait a minute, for every worker
    query(database_url, "UPDATE crawl_slot SET next_lease_time = now() WHERE slot = 'b'")  # b's minute is over
    assert names(frontier.step(crawl, second, lease=10, delay=60)) == ["b1"]
    # The delay is the crawl's: the queue's deletion of its first row takes its slots' times with it.
    query(database_url, "DELETE FROM spider_job WHERE id = %s", (crawl,))
    assert query(database_url, "SELECT count(*) FROM crawl_slot") == [(0,)]


def test_a_crawl_s_first_row_is_kept_with_its_frontier_while_another_worker_runs(database_url):
    store = JobStore.for_url(database_url)
    for n in range(2):
        store.enqueue("p", {"name": "big", "_job": f"worker-{n}"})
    first, second = sorted(store.claim_next_jobs(["p"], 2, node="n", worker="w").jobs, key=lambda job: job.id)
    query(database_url, "UPDATE spider_job SET crawl = %s WHERE id = ANY(%s)", (first.id, [first.id, second.id]))
    FrontierStore.for_url(database_url).step(first.id, second.id, new=[new("a")])
    finish(store, first, outcome="cancelled", worker="w")  # the crawl's first worker ends early; the second still crawls

    assert store.prune_terminated(keep=0) == 0  # no finished job kept, yet the crawl's first row stays
    assert query(database_url, "SELECT count(*) FROM crawl_request") == [(1,)]
    finish(store, second, worker="w")
    assert store.prune_terminated(keep=0) == 2  # both, and the crawl's frontier with them
    assert query(database_url, "SELECT count(*) FROM crawl_request") == [(0,)]
