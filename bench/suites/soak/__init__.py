"""Soak: issue 47's operator soak, repeated. Three real nodes run for minutes under a steady feed while one of them
is SIGKILLed and restarted on a period; the promises are checked from the crawls' own records.

Its own Postgres with **autovacuum off** (as in the issue): the churned tables stay small only by the nodes' VACUUMs.
Three nodes of ``LocalCluster`` with the repository's ``scrapyd.cfg`` (warm starts on, ``max_proc`` 4,
``finished_to_keep`` 100), the example project's ``sleeper`` spider. Then, for ``seconds``:

* a feeder (``feeder.py``) posts ``schedule.json`` at ``rate`` jobs/s to a random node in rotation: short sleeps
  (0.2-1.5 s); some ``_run_at`` 2-8 s ahead; some with one of 6 ``_unique_key``s (and delayed, so some find a
  waiting job with their key); some cancelled (``cancel.json``) while they wait; some 5 s crawls cancelled 0.1-2.5 s
  after their answer (running or still starting);
* every ``restart_every`` seconds the next node is taken out of the rotation, SIGKILLed alone (its crawls orphaned),
  started again and put back when ``daemonstatus.json`` answers (``servers.py``);
* every ``sample_every`` seconds: bytes, live and dead rows of spider_job, job_log, scrapyd_node; connections per
  node; each node's RSS (``sampler.py``).

Then the feed stops, every job is waited for, and ``figures.py`` reads: the crawls' records (``runs.jsonl``, one line
per spider created; ``ends.jsonl``, one per close) for exactly-once; every call's time, per minute, minutes with a
restart apart; the slowest calls against the restarts; Traceback / KeyboardInterrupt / Process died lines in the
nodes' logs. ``BENCH_SOAK_SECONDS`` overrides the length (a shorter full soak when time is short).
"""

from __future__ import annotations

import contextlib
import os
import time

from bench.context import Context
from bench.suites.soak.feeder import Feeder
from bench.suites.soak.figures import figures, targets
from bench.suites.soak.sampler import Sampler
from bench.suites.soak.servers import POSTGRES_SETTINGS, Chaos, SoakPostgres
from bench.suites.soak.table import format_table, plot

SUMMARY = "issue 47's soak: 3 real nodes, 4 jobs/s with delays, unique keys and cancels, a node SIGKILLed every 3 min"
SERIES = ("soak",)
NODES = 3
SIZES = {"quick": {"seconds": 50.0, "rate": 4.0, "restart_every": 30.0, "sample_every": 10.0},
         "full": {"seconds": 900.0, "rate": 4.0, "restart_every": 180.0, "sample_every": 60.0}}
DRAIN_SECONDS = 240.0
SEED = 47

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]


def run(ctx: Context) -> dict:
    # Imported here: the cluster module pulls in the node's code, which the bench's other suites do not all need.
    from scrapyd_pgqueue.local.cluster import LocalCluster

    sizes = dict(SIZES[ctx.profile.name])
    if os.environ.get("BENCH_SOAK_SECONDS"):
        sizes["seconds"] = float(os.environ["BENCH_SOAK_SECONDS"])
    records = ctx.workdir / "soak-records"
    postgres = SoakPostgres()
    cluster = sampler = chaos = None
    try:
        postgres.start()
        settings = {name: postgres.setting(name) for name in ("autovacuum", "server_version")}
        ctx.log(f"soak: Postgres {settings['server_version']}, autovacuum {settings['autovacuum']}; "
                f"starting {NODES} nodes")
        cluster = LocalCluster(postgres.url, NODES, directory=ctx.workdir / "soak-cluster",
                               env={"EXAMPLE_RECORD_DIR": str(records)})
        cluster.start(120)
        _warm_up(ctx, cluster, postgres)
        sampler = Sampler(postgres.admin_db_url, cluster, sizes["sample_every"])
        feeder = Feeder(cluster.nodes, sizes["rate"], SEED, ctx.log)
        started = time.time()
        sampler.start()
        chaos = Chaos(cluster, feeder, sizes["restart_every"], time.monotonic() + sizes["seconds"], ctx.log)
        chaos.start()
        ctx.log(f"soak: feeding {sizes['rate']:g} jobs/s for {sizes['seconds']:g} s, a node restarted every "
                f"{sizes['restart_every']:g} s")
        feeder.feed(sizes["seconds"])
        fed = time.time()
        chaos.stopping.set()
        chaos.join(180)
        ctx.log(f"soak: fed {len(feeder.jobs)} jobs; waiting for every job to end")
        drained = _drain(postgres, DRAIN_SECONDS)
        time.sleep(2)  # the last closes' records, the last finishes' VACUUMs
        sampler.stop()
        ended = time.time()
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stopping.set()
        if cluster is not None:
            ctx.log("soak: stopping the nodes")
            cluster.stop()
        postgres.remove()
    result = figures(cluster, feeder, chaos, sampler, records, started, fed, ended)
    result["drain"] = drained
    return {
        "parameters": {**sizes, "nodes": NODES, "seed": SEED, "postgres": {**POSTGRES_SETTINGS, **settings},
                       "node_config": "repository scrapyd.cfg (warm_start on, max_proc 4, finished_to_keep 100, "
                                      "vacuum_interval 5)"},
        "series": {"soak": result},
        "ratios": {},
        "targets": targets(result),
        "notes": [
            "exactly-once from the crawls' own records: runs.jsonl (a line per spider created) and ends.jsonl",
            "schedule.json p50/p99 per minute of the feed; a minute 'with a restart' holds a node's SIGKILL or its "
            "ready again; the restarted node is out of the feeder's rotation from before its kill to its ready",
            "sizes: pg_total_relation_size; dead rows: pg_stat_user_tables.n_dead_tup (cumulative statistics)",
        ],
    }


def _warm_up(ctx: Context, cluster, postgres) -> None:
    """A crawl per node before the clock starts: warm processes, connections and caches as a running cluster has."""
    for number, node in enumerate(cluster.nodes):
        node.post("schedule.json", project="example", spider="sleeper", jobid=f"warmup-{number}", seconds="0.1",
                  timeout=120)  # the first schedule on a fresh database lists the spiders: slow when loaded
    if not _drain(postgres, 120)["done"]:
        raise RuntimeError(f"soak: warm-up crawls did not end:\n{cluster.nodes[0].log_tail(20)}")
    ctx.log("soak: warm-up crawls ended")


def _drain(postgres, timeout: float) -> dict:
    """Until no job is delayed, pending or running (the feed's last delayed jobs and cancels included)."""
    from bench.servers import connect

    started = time.monotonic()
    with contextlib.closing(connect(postgres.admin_db_url)) as connection, connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT count(*) FROM spider_job WHERE status <> 'terminated'")
            (open_jobs,) = cursor.fetchone()
            if open_jobs == 0 or time.monotonic() - started > timeout:
                return {"done": open_jobs == 0, "open_jobs": open_jobs, "seconds": time.monotonic() - started}
            time.sleep(0.5)

