"""Tick stats: what the running crawls' stats cost the node's tick, the one statement a node sends per heartbeat.

Each crawl reports Scrapy's stats to its node; the node's tick (``JobStore.node_tick``, the lease thread's statement)
carries the stats that changed, as one JSON parameter, and writes them on the running jobs' rows. Measured side by
side in one run, on one table: the tick of a node running N jobs with the stats of all N changed (every job's item
count moves each tick: the worst case, every crawl reporting at every tick), against the same tick with none (what
it sends between two ``stats_interval``s, and what an idle node sends), alternated tick by tick. The stats dict is
a real crawl's shape (``SAMPLE_STATS``, ~50 keys, ~2 KB as JSON).

Per tick: its time (client round trip), the WAL it wrote, and whether the row updates were HOT (no index entry
written: the ``stats`` column is in no index), from ``pg_stat_user_tables`` once the backend flushed its counts.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from bench import database, report
from bench.context import Context
from bench.stats import ratio, summarise_ms

SUMMARY = "the node's tick with N running jobs' stats against the same tick with none"
SERIES = ("ticks",)

RUNNING = {"quick": (4, 16), "full": (4, 16, 64)}
ROUNDS = {"quick": 40, "full": 300}  # ticks of each kind per N
FINISHED_ROWS = 10_000  # terminated rows around the running ones, as a node keeps (finished_to_keep)
PROJECT = "tickstats"

SAMPLE_STATS = {
    "downloader/request_bytes": 1_862_213, "downloader/request_count": 4_211,
    "downloader/request_method_count/GET": 4_211,
    "downloader/response_bytes": 98_122_003, "downloader/response_count": 4_198,
    "downloader/response_status_count/200": 4_102, "downloader/response_status_count/301": 61,
    "downloader/response_status_count/404": 35, "downloader/exception_count": 13,
    "downloader/exception_type_count/twisted.internet.error.TimeoutError": 13, "dupefilter/filtered": 9_902,
    "elapsed_time_seconds": 1843.219902, "httpcompression/response_bytes": 401_223_761,
    "httpcompression/response_count": 4_102, "item_scraped_count": 0, "items_per_minute": 131.4,
    "log_count/DEBUG": 8_409, "log_count/ERROR": 3, "log_count/INFO": 42, "log_count/WARNING": 7,
    "memusage/max": 187_133_952, "memusage/startup": 71_213_056, "request_depth_max": 12,
    "response_received_count": 4_198, "responses_per_minute": 136.7, "retry/count": 26,
    "retry/max_reached": 3, "retry/reason_count/twisted.internet.error.TimeoutError": 26,
    "scheduler/dequeued": 4_211, "scheduler/dequeued/memory": 4_211, "scheduler/enqueued": 4_214,
    "scheduler/enqueued/memory": 4_214, "spider_exceptions/KeyError": 2, "start_time": "2026-11-27T14:31:07.118402",
    "feedexport/success_count/FileFeedStorage": 1, "robotstxt/request_count": 3, "robotstxt/response_count": 3,
    "robotstxt/response_status_count/200": 3, "offsite/domains": 4, "offsite/filtered": 311,
    "urllength/request_ignored_count": 1, "httperror/response_ignored_count": 35,
    "httperror/response_ignored_status_count/404": 35, "finish_reason": None,
}


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.store import JobStore

    rounds = ROUNDS.get(ctx.profile.name, ROUNDS["full"])
    store = JobStore.for_url(ctx.database_url)
    points = []
    for running in RUNNING.get(ctx.profile.name, RUNNING["full"]):
        ctx.log(f"tickstats: {running} running jobs, {rounds} ticks with their stats and {rounds} without")
        worker, claims = _running_jobs(ctx.database_url, store, running)
        points.append({"running": running, **_measure(ctx.database_url, store, worker, claims, rounds)})
    per_job = {point["running"]: ratio(point["with_stats"]["p50_ms"] - point["without_stats"]["p50_ms"],
                                       point["running"]) for point in points}
    return {
        "parameters": {"rounds": rounds, "finished_rows": FINISHED_ROWS,
                       "stats_json_bytes": len(_stats_json(SAMPLE_STATS)), "stats_keys": len(SAMPLE_STATS)},
        "series": {"ticks": {"points": points}},
        "ratios": {f"with / without stats, {p['running']} running (p50)": ratio(
            p["with_stats"]["p50_ms"], p["without_stats"]["p50_ms"]) for p in points},
        "targets": [],
        "notes": ["p50 ms added per running job's stats: " + ", ".join(
            f"{running} jobs {value:.3f}" for running, value in per_job.items())],
    }


def _stats_json(stats: dict) -> str:
    import json

    return json.dumps(stats, separators=(",", ":"))


def _running_jobs(url: str, store, running: int):
    """A registered node running ``running`` jobs among FINISHED_ROWS kept finished ones."""
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(database.TRUNCATE_SPIDER_JOB)
        cursor.execute("""
            INSERT INTO spider_job (project, spider, job, message, status, outcome, created_time, start_time,
                                    end_time, stats)
            SELECT %(project)s, 'spider', 'done-' || i, '{"name": "spider"}', 'terminated', 'finished', now(), now(),
                   now(), %(stats)s
            FROM generate_series(1, %(rows)s) AS i
        """, {"project": PROJECT, "rows": FINISHED_ROWS, "stats": _stats_json(SAMPLE_STATS)})
    worker = uuid.uuid4().hex
    store.register_node(worker=worker, name="bench-tickstats", url=None, max_proc=running)
    for number in range(running):
        store.enqueue(PROJECT, {"name": "spider", "_job": f"running-{number}"})
    claims = store.claim_next_jobs([PROJECT], running, node="bench-tickstats", worker=worker).jobs
    assert len(claims) == running, f"claimed {len(claims)} of {running}"
    database.vacuum(url)
    return worker, claims


def _tick(store, worker, claims, stats):
    import datetime

    return store.node_tick(worker=worker, lease_seconds=30, max_attempts=3, recover=False, release=False,
                           known_ids=[claimed.id for claimed in claims], claimed_before=datetime.datetime.now(),
                           prompt_seconds=10, stats=stats)


def _measure(url: str, store, worker: str, claims, rounds: int) -> dict:
    """Ticks with every claim's stats changed and ticks with none, alternated; time, WAL and HOT updates of each."""
    durations = {"with_stats": [], "without_stats": []}
    wal = {"with_stats": 0, "without_stats": 0}
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        connection.autocommit = True
        updates_before = _updates(cursor)
        for number in range(rounds):
            for kind in ("with_stats", "without_stats"):
                stats = [(claimed, {**SAMPLE_STATS, "item_scraped_count": number}) for claimed in claims] \
                    if kind == "with_stats" else []
                cursor.execute("SELECT pg_current_wal_insert_lsn()")
                (before,) = cursor.fetchone()
                started = time.perf_counter()
                tick = _tick(store, worker, claims, stats)
                durations[kind].append(time.perf_counter() - started)
                cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (before,))
                wal[kind] += int(cursor.fetchone()[0])
                assert tick.stats_written == len(stats), tick
        time.sleep(1.1)  # the tick's backend reports its counts at its next commit a second after the last
        _tick(store, worker, claims, [])
        time.sleep(0.2)
        updated, hot = (after - before for after, before in zip(_updates(cursor), updates_before))
    return {
        **{kind: {**summarise_ms(values), "wal_bytes_per_tick": wal[kind] / rounds}
           for kind, values in durations.items()},
        "rows_updated": updated, "hot_updates": hot,
    }


def _updates(cursor) -> tuple[int, int]:
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'spider_job'")
    return cursor.fetchone()


def format_table(result: dict) -> str:
    rows = []
    for point in result["series"]["ticks"]["points"]:
        for kind in ("without_stats", "with_stats"):
            figures = point[kind]
            rows.append([str(point["running"]), kind.replace("_", " "), report.number(figures["p50_ms"], 3),
                         report.number(figures["p99_ms"], 3), report.number(figures["wal_bytes_per_tick"]),
                         f"{point['hot_updates']:,} of {point['rows_updated']:,}" if kind == "with_stats" else ""])
    parameters = result["parameters"]
    return report.table_text(result, [
        report.heading("Tick stats"),
        f"the node's tick (one statement per heartbeat) with the changed stats of N running jobs (~"
        f"{parameters['stats_json_bytes']:,} bytes, {parameters['stats_keys']} keys each) against none, alternated, "
        f"{parameters['rounds']} of each; {parameters['finished_rows']:,} kept finished jobs with stats",
        report.format_rows(["running", "tick", "p50 ms", "p99 ms", "WAL bytes/tick", "HOT updates"], rows),
        *result["notes"],
        "",
    ])


def plot(result: dict, directory: Path) -> list[Path]:
    return []  # a few rows: the table says it
