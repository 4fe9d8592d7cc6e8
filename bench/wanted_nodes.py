"""What ``scrapyd_pgqueue_wanted_nodes()`` costs a call (every scrape, every autoscaler poll) as the backlog grows.

    python -m bench.wanted_nodes [--url postgresql://postgres@127.0.0.1:5432/scratch] [backlogs...]

Without --url it runs on a throwaway server (the package's local Postgres). A database given must be empty: it is
migrated and filled. For each backlog (default 0, 10,000 and 1,000,000 pending jobs in 20 projects, plus RUNNING
ongoing jobs, a settled table: VACUUM ANALYZE), CALLS calls of each form (all the work, as /metrics and KEDA without
pools ask; a pool's, with tags) with each maximum of MAX_NODES, SLOTS_PER_NODE slots a node, are timed by the client
(a loopback round trip included, as a scraper or a scaler sees it), then one EXPLAIN (ANALYZE, BUFFERS) of all the
work up to 10,000 nodes is printed. Prints p50, p99 and the answer per backlog and call, with their ratio to the smallest backlog's.
"""

from __future__ import annotations

import argparse
import time

from bench import database
from bench.stats import percentile
from scrapyd_pgqueue.local import devdb

BACKLOGS = (0, 10_000, 1_000_000)
PROJECTS = [f"project{i}" for i in range(20)]
RUNNING = 2_000  # ongoing jobs: 500 nodes of 4 slots, all busy
CALLS = 50
SLOTS_PER_NODE = 4
MAX_NODES = (1_000, 10_000)  # 0008's bound, and the default since 0022: the waiting jobs read grow with it
WANTED_NODES = "SELECT scrapyd_pgqueue_wanted_nodes(%(slots)s, %(max_nodes)s)"
WANTED_NODES_BY_TAGS = "SELECT scrapyd_pgqueue_wanted_nodes(%(slots)s, ARRAY['browser'], %(max_nodes)s)"
CALLS_TIMED = [(f"({SLOTS_PER_NODE}{tags}, {maximum})", statement, maximum)
               for statement, tags in ((WANTED_NODES, ""), (WANTED_NODES_BY_TAGS, ", ARRAY['browser']"))
               for maximum in MAX_NODES]
MAKE_RUNNING = """
    UPDATE spider_job SET status = 'ongoing', node = 'node' || (id %% 1000), worker = 'w' || (id %% 1000),
           start_time = now(), attempts = 1
    WHERE id IN (SELECT id FROM spider_job ORDER BY id LIMIT %(running)s)
"""


def measure(url: str, backlog: int) -> dict:
    database.fill_spider_job(url, backlog + RUNNING, PROJECTS, "wanted")
    with database.admin_connection(url) as connection, connection.cursor() as cursor:
        cursor.execute(MAKE_RUNNING, {"running": RUNNING})
        cursor.execute("VACUUM ANALYZE spider_job")
        calls = {}
        for name, statement, maximum in CALLS_TIMED:
            timings, answers = [], set()
            for _ in range(CALLS):
                started = time.perf_counter()
                cursor.execute(statement, {"slots": SLOTS_PER_NODE, "max_nodes": maximum})
                answers.add(cursor.fetchone()[0])
                timings.append((time.perf_counter() - started) * 1000)
            calls[name] = {"p50_ms": percentile(timings, 0.5), "p99_ms": percentile(timings, 0.99),
                           "answers": sorted(answers)}
        name, statement, maximum = CALLS_TIMED[1]  # all the work, up to the default maximum
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, {"slots": SLOTS_PER_NODE, "max_nodes": maximum})
        plan = [f"{name}:", *(row[0] for row in cursor.fetchall())]
    return {"backlog": backlog, "calls": calls, "plan": plan}


def main(url: str, backlogs: tuple[int, ...]) -> None:
    database.prepare_schema(url)
    results = [measure(url, backlog) for backlog in backlogs]
    first = results[0]
    print(f"scrapyd_pgqueue_wanted_nodes, {RUNNING:,} running jobs, {CALLS} calls each, timed by the client:")
    for result in results:
        for name, timed in result["calls"].items():
            ratio = timed["p50_ms"] / max(first["calls"][name]["p50_ms"], 1e-3)
            print(f"  {result['backlog']:>9,} pending, {name:<28} p50 {timed['p50_ms']:.2f} ms, "
                  f"p99 {timed['p99_ms']:.2f} ms ({ratio:.1f}x the first), answer {timed['answers']}")
    print("\n".join(["", f"EXPLAIN at {results[-1]['backlog']:,} pending:", *results[-1]["plan"]]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.wanted_nodes", description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an empty database (default: a throwaway server)")
    parser.add_argument("backlogs", nargs="*", type=int, default=list(BACKLOGS))
    arguments = parser.parse_args()
    if arguments.url:
        main(arguments.url, tuple(arguments.backlogs))
    else:
        server = devdb.throwaway_postgres()
        try:
            main(server.url, tuple(arguments.backlogs))
        finally:
            server.remove()
