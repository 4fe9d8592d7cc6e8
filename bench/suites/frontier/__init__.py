"""One crawl on many workers (``_workers=N``, the frontier) against its references, side by side in one run.

One real Scrapyd node (``max_proc`` 4, the example project baked in) on the bench's database, a generated site on
8 loopback hosts (``bench/site.py``: page i on host i mod 8, each page linking to 4 others), the example project's
``site`` spider. The site holds its home page until every worker's spider exists, so that a crawl is measured from
its first page, not from its workers' start-up. Measured:

* **one worker**: ``_workers=1`` (the frontier) against the same spider scheduled without ``_workers`` on the same
  node (Scrapy's own in-memory scheduler); pages answered at once;
* **four workers against scrapy-redis**: ``_workers=4`` against 4 ``scrapy runspider`` processes of the same
  spider on scrapy-redis (``redis_crawl.py``), same site; then each again with one worker SIGKILLed once the site
  has answered a third of its pages (ours: the worker's crawl process, not its node): pages of the site never
  requested;
* **four workers against one**: ``_workers=4`` against ``_workers=1``, every worker at ``CONCURRENT_REQUESTS=4``,
  pages answered after 200 ms.

Pages per second: from the first page parsed to the last, by the crawl's own records (pages.jsonl ``fetched``),
(pages - 1) / seconds; the median of the rounds. Also kept: gate opened to every worker ended (the end included,
scrapy-redis's idle close too). Each round runs every series once, in the same order.
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from typing import NamedTuple

from bench import report
from bench.context import Context
from bench.site import Site
from bench.stats import ratio
from bench.suites.frontier import ours, redis_crawl
from bench.suites.frontier.table import format_table, plot

SUMMARY = "one crawl on 1 and 4 workers (the frontier) against Scrapy's scheduler and scrapy-redis; a worker killed"
SERIES = ("scrapy_scheduler_1", "frontier_1", "scrapy_redis_4", "frontier_4", "scrapy_redis_4_killed",
          "frontier_4_killed", "frontier_1_slow", "frontier_4_slow")
REDIS_SERIES = ("scrapy_redis_4", "scrapy_redis_4_killed")

HOSTS = 8
WORKERS = 4
SLOW_DELAY = 0.2
SLOW_SETTINGS = {"CONCURRENT_REQUESTS": "4"}
SIZES = {"quick": {"pages": 300, "slow_pages": 200, "rounds": 1},
         "full": {"pages": 2000, "slow_pages": 1000, "rounds": 2}}
TARGETS = {"pages/s, frontier 1 worker / Scrapy's scheduler": 0.8,
           "pages/s, frontier 4 workers / scrapy-redis 4 workers": 1.0,
           "pages/s, frontier 4 workers / 1 worker, 200 ms pages": 3.0}

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]


def run(ctx: Context) -> dict:
    # Imported here: the cluster module pulls in the node's code, which the bench's other suites do not all need.
    from scrapyd_pgqueue.local.cluster import LocalCluster

    sizes = SIZES[ctx.profile.name]
    missing = redis_crawl.missing()
    record_dir = ctx.workdir / "frontier-records"
    cluster = LocalCluster(ctx.database_url, 1, directory=ctx.workdir / "frontier-cluster",
                           config={"max_proc": str(WORKERS), "poll_interval": "1", "finished_to_keep": "100000"},
                           env={"EXAMPLE_RECORD_DIR": str(record_dir)})
    runs: dict[str, list[dict]] = {name: [] for name in SERIES}
    cluster.start()
    try:
        node = cluster.nodes[0]
        with Site(20, HOSTS) as site:  # a warm-up crawl: the node's warm process, Postgres's caches
            ours.crawl(ctx.database_url, node, site, record_dir, 1, {})
        with contextlib.ExitStack() as stack:
            redis = None if missing else stack.enter_context(redis_crawl.RedisServer(ctx.workdir / "frontier-redis"))
            for round_ in range(sizes["rounds"]):
                _round(ctx, node, redis, record_dir, sizes, round_, runs)
    finally:
        cluster.stop()
    return _result(sizes, runs, missing)


class Crawl(NamedTuple):
    series: str
    pages: int
    delay: float
    workers: int | None  # None: a plain job on Scrapy's own scheduler
    settings: dict[str, str]
    kill_at: int | None = None
    redis: bool = False


def _plan(sizes: dict) -> list[tuple[Crawl, Crawl]]:
    """A round: pairs of crawls compared with each other."""
    pages, slow, kill_at = sizes["pages"], sizes["slow_pages"], sizes["pages"] // 3
    return [
        (Crawl("scrapy_scheduler_1", pages, 0.0, None, {}), Crawl("frontier_1", pages, 0.0, 1, {})),
        (Crawl("scrapy_redis_4", pages, 0.0, WORKERS, {}, redis=True), Crawl("frontier_4", pages, 0.0, WORKERS, {})),
        (Crawl("scrapy_redis_4_killed", pages, 0.0, WORKERS, {}, kill_at, redis=True),
         Crawl("frontier_4_killed", pages, 0.0, WORKERS, {}, kill_at)),
        (Crawl("frontier_1_slow", slow, SLOW_DELAY, 1, SLOW_SETTINGS),
         Crawl("frontier_4_slow", slow, SLOW_DELAY, WORKERS, SLOW_SETTINGS)),
    ]


def _round(ctx: Context, node, redis, record_dir: Path, sizes: dict, round_: int, runs: dict) -> None:
    """Every pair once; in odd rounds the second of each pair first, so that neither side always runs first."""
    for pair in _plan(sizes):
        for crawl in (reversed(pair) if round_ % 2 else pair):
            if crawl.redis and redis is None:
                continue
            with Site(crawl.pages, HOSTS, crawl.delay) as site:
                if crawl.redis:
                    directory = ctx.workdir / f"frontier-redis-{round_}-{crawl.series}"
                    result = redis_crawl.crawl(redis, site, crawl.workers, directory, crawl.settings, crawl.kill_at)
                else:
                    result = ours.crawl(ctx.database_url, node, site, record_dir, crawl.workers, crawl.settings,
                                        crawl.kill_at)
            runs[crawl.series].append(result)
            ctx.log(f"frontier: round {round_ + 1}: {crawl.series}: {report.number(result['pages_per_s'], 1)} "
                    f"pages/s, {result['never_fetched']} never fetched, {result['fetched_twice']} fetched twice")


def _median_rate(runs: list[dict], key: str = "pages_per_s") -> float | None:
    rates = [run[key] for run in runs if run[key] is not None]
    return statistics.median(rates) if rates else None


def _result(sizes: dict, runs: dict, missing: str | None) -> dict:
    series = {name: {"pages_per_s": _median_rate(found), "runs": found} for name, found in runs.items()}
    if missing:
        for name in REDIS_SERIES:
            series[name]["missing"] = missing
    rate = {name: data["pages_per_s"] for name, data in series.items()}
    ratios = {
        "pages/s, frontier 1 worker / Scrapy's scheduler": ratio(rate["frontier_1"], rate["scrapy_scheduler_1"]),
        "pages/s, frontier 4 workers / scrapy-redis 4 workers": ratio(rate["frontier_4"], rate["scrapy_redis_4"]),
        "pages/s, frontier 4 workers / 1 worker, 200 ms pages": ratio(rate["frontier_4_slow"],
                                                                     rate["frontier_1_slow"]),
        "pages/s, frontier 4 workers / 1 worker, pages at once": ratio(rate["frontier_4"], rate["frontier_1"]),
        "pages/s all workers fetching, frontier 4 / scrapy-redis 4": ratio(
            _median_rate(runs["frontier_4"], "all_fetching_pages_per_s"),
            _median_rate(runs["scrapy_redis_4"], "all_fetching_pages_per_s")),
    }
    lost = {name: max((run["never_fetched"] for run in runs[name]), default=None)
            for name in ("frontier_4_killed", "scrapy_redis_4_killed")}
    targets = [report.target(name, ratios[name], ">=", limit) for name, limit in TARGETS.items()]
    targets.append(report.target("pages never fetched, a frontier worker SIGKILLed", lost["frontier_4_killed"],
                                 "<=", 0, f"scrapy-redis: {report.number(lost['scrapy_redis_4_killed'])}"))
    notes = [
        f"{HOSTS} loopback hosts; pages/s from the first page parsed to the last (pages.jsonl), median of "
        f"{sizes['rounds']} round(s); the crawl starts once every worker's spider exists",
        "one node, max_proc 4, warm starts on; scrapy-redis workers are cold `scrapy runspider` processes (their "
        "start-up is not measured), SCHEDULER_PERSIST on, MAX_IDLE_TIME_BEFORE_CLOSE "
        f"{redis_crawl.MAX_IDLE_SECONDS} s",
        "all fetching: pages/s from the moment the last worker parsed its first page (- when one never did): an "
        "idle Scrapy engine asks its scheduler for work on its heartbeat, every 5 s, so scrapy-redis's idle workers "
        "join late (ours wakes its engine when a step brings requests)",
        "fetched twice, once each for Scrapy's scheduler and scrapy-redis: the home page, its start request being "
        "dont_filter, is fetched again from a link; the frontier stores start requests by fingerprint",
        f"killed: SIGKILL of one worker once the site answered {sizes['pages'] // 3} pages; never fetched = pages of "
        "the site never requested (the site's own count); the worst of the rounds",
    ]
    if missing:
        notes.append(missing)
    return {"parameters": {"hosts": HOSTS, "workers": WORKERS, "slow_delay_s": SLOW_DELAY,
                           "slow_settings": SLOW_SETTINGS, **sizes},
            "series": series, "ratios": ratios, "targets": targets, "notes": notes}
