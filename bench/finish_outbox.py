"""What the webhooks' outbox costs the statement that finishes a job: the store's FINISH_JOB with its trigger
(spider_job_ended, which writes an ended job's events) against the same statement with the session's triggers off
(session_replication_role = replica: a superuser's setting), alternating in runs of 50 on the same kind of rows, server side
(``EXPLAIN (ANALYZE)``: planning and execution, no client or network noise), with no hook, with one hook that does
not want the event, and with one that does (then an event row is written).

    python -m bench.finish_outbox [--url postgresql://postgres@127.0.0.1:5432/scratch] [--jobs 3000]

Without --url it runs on a throwaway server. A database given must be empty; it is migrated and filled. Prints the
median and 90th percentile of planning and execution per case, microseconds.
"""

from __future__ import annotations

import argparse
import datetime
import statistics

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.store import JobStore, finishing
from scrapyd_pgqueue.store.webhooks import WebhookStore

TRIGGERS = {"with the outbox trigger": "origin", "without": "replica"}  # session_replication_role
BLOCK = 50  # finishes in a row of one case
HOOKS = {"no hook": [], "a hook for other events": [["tree_done"]], "a hook for this event": [["ended"]]}


def finish_times(url: str, jobs: int) -> dict[str, list[tuple[float, float]]]:
    """{case: [(planning ms, execution ms)]} for ``jobs`` finishes of each statement, alternating."""
    store = JobStore.for_url(url)
    store.enqueue_many("bench", [({"name": "s", "_job": f"outbox-{i}"}, 0.0) for i in range(2 * jobs)])
    claimed = []
    while batch := store.claim_next_jobs(["bench"], 500, node="n", worker="w").jobs:
        claimed += batch
    now = datetime.datetime.now(datetime.timezone.utc)
    times: dict[str, list[tuple[float, float]]] = {case: [] for case in TRIGGERS}
    explained = text("EXPLAIN (ANALYZE, FORMAT JSON) " + finishing.FINISH_JOB.text)
    with db.autocommit(db.get_engine(url)) as connection:
        for i, job in enumerate(claimed):
            # In runs of BLOCK: a change of session_replication_role empties the session's plan cache (the trigger's
            # cached plan with it), which a finish never pays.
            case = list(TRIGGERS)[i // BLOCK % 2]
            if i % BLOCK == 0:
                connection.execute(text("SELECT set_config('session_replication_role', :role, false)"),
                                   {"role": TRIGGERS[case]})
            params = {"id": job.id, "attempt": job.attempt, "worker": "w", "outcome": "finished", "exit_code": 0,
                      "reason": "", "pid": 1, "node": "n", "project": "bench", "job": job.job, "stats": None,
                      "start_time": now, "end_time": now}
            plan = connection.execute(explained, params).scalar()[0]
            times[case].append((plan["Planning Time"], plan["Execution Time"]))
        connection.execute(text("SELECT set_config('session_replication_role', 'origin', false)"))
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.finish_outbox", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an empty database (default: a throwaway server)")
    parser.add_argument("--jobs", type=int, default=3000, help="finishes per statement and case (default 3000)")
    args = parser.parse_args(argv)
    server = None if args.url else devdb.throwaway_postgres()
    url = args.url or server.url
    try:
        hooks = WebhookStore.for_url(url)
        print(f"{'case':<26} {'statement':<22} {'plan p50':>9} {'plan p90':>9} {'exec p50':>9} {'exec p90':>9}")
        for case, events in HOOKS.items():
            for hook in hooks.list_webhooks():
                hooks.remove_webhook(hook.id)
            for wanted in events:
                hooks.add_webhook("http://127.0.0.1:9/", wanted, None, "json", None)
            for statement, pairs in finish_times(url, args.jobs).items():
                planning, execution = ([1000 * pair[k] for pair in pairs] for k in (0, 1))
                print(f"{case:<26} {statement:<22} {statistics.median(planning):>9.0f} "
                      f"{statistics.quantiles(planning, n=10)[-1]:>9.0f} {statistics.median(execution):>9.0f} "
                      f"{statistics.quantiles(execution, n=10)[-1]:>9.0f}")
    finally:
        if server is not None:
            server.remove()


if __name__ == "__main__":
    main()
