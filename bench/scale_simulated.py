"""The scale suite's simulated series alone, at the steps given, poll-only or with listen slots.

    python -m bench.scale_simulated [--steps 10,1000] [--listen-slots 8 [--slot-retry 1]] [--output results.json]

The series of ``python -m bench --suites scale`` (``bench/suites/scale/simulated_nodes.py``, full sizes: poll 1 s,
heartbeat 5 s, 20 jobs/s fed, 30 s windows, PgBouncer pool 20, 8 processes x 16 threads), without the 100 real nodes
before it: ``scale._simulate(ctx, dataclasses.replace(scale.SIZES["full"], sim_steps=steps))``. Poll-only by
default (the nodes reach Postgres through PgBouncer alone, as nodes without ``listen_url``); ``--listen-slots N``
gives every simulated node a session straight to Postgres as well (``listen_url``), on which it takes one of the N
listen slots while it wants work, trying once per ``--slot-retry`` seconds (default: the poll interval, as a node
does) and LISTENing while it holds one (``bench/suites/scale/slots.py``). Prints each step's figures and writes
them, with the load averages before and after, as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from bench.context import FULL, Context
from bench.suites.scale.settings import SIZES
from bench.suites.scale.simulated_nodes import _simulate


def _row(point: dict) -> list[str]:
    nodes = point["nodes"]
    bouncer = point["pgbouncer"]
    cores = point["cpu_cores"]
    operations = point["operations"]
    tries_added = (point["transactions"] + operations.get("take_listen_slot", 0)) / point["window_seconds"]
    return [
        f"nodes                                         {nodes:,}",
        f"server transactions/s (pg_stat_database)      {point['transactions_per_second']:,.0f}",
        f"  per node per second                         {point['transactions_per_second'] / nodes:.2f}",
        f"PgBouncer client transactions/s               {bouncer['client_transactions_per_second']:,.0f}",
        f"  per node per second                         {bouncer['client_transactions_per_second'] / nodes:.2f}",
        f"server transactions per client transaction    {bouncer['server_per_client_transaction']:.2f}",
        f"statements on direct sessions/s               {point['direct_statements_per_second']:,.0f}",
        # A backend that touches no table (a session that only tries for a slot) never reports its transactions to
        # pg_stat_database: its tries are added here (holders report theirs when they read a notification).
        f"  server transactions/s with the slot tries    {tries_added:,.0f}",
        f"backends peak (PgBouncer's / direct)          {point['backends_peak']} "
        f"({point['pgbouncer_backends_peak']} / {point['direct_backends_peak']})",
        f"PgBouncer clients peak / waiting peak         {point['pgbouncer_clients_peak']} / "
        f"{point['pgbouncer_clients_waiting_peak']}",
        f"claim p50 / p99 (ms)                          {point['claim_ms']['p50']:.2f} / "
        f"{point['claim_ms']['p99']:.1f}",
        f"heartbeat p50 / p99 (ms)                      {point['heartbeat_ms']['p50']:.2f} / "
        f"{point['heartbeat_ms']['p99']:.1f}",
        f"PgBouncer mean xact / wait (ms)               {bouncer['xact_ms_mean']:.2f} / {bouncer['wait_ms_mean']:.2f}",
        f"claim ticks / heartbeats run per due          {point['ticks_run_per_due']:.1%} / "
        f"{point['heartbeats_run_per_due']:.1%}",
        f"errors (window / adding)                      {point['errors']} / {point['errors_adding']}",
        f"CPU cores sim / postgres / pgbouncer / machine {cores.get('simulator', 0):.2f} / "
        f"{cores.get('postgres', 0):.2f} / {cores.get('pgbouncer', 0):.2f} / {cores.get('machine_busy', 0):.2f}",
        f"listen slot holders (nodes) / heard           {point['listen_slot_holders']} "
        f"({point['listen_slot_holders_distinct_nodes']}) / {point['notifications_heard']}",
        f"jobs enqueued / claimed / finished            {point['enqueued']} / {point['jobs_claimed']} / "
        f"{point['jobs_finished']}; pending at end {point['pending_at_end']}",
        "operations/s: " + ", ".join(f"{kind} {count / point['window_seconds']:,.1f}"
                                     for kind, count in sorted(operations.items())),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_simulated", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="10,1000", help="simulated nodes at each step (default 10,1000)")
    parser.add_argument("--listen-slots", type=int, default=0, help="listen slots (0: poll-only, no direct sessions)")
    parser.add_argument("--slot-retry", type=float, default=None, help="seconds between a node's slot tries")
    parser.add_argument("--settle", type=float, default=None, help="seconds between a step's nodes and its window "
                        "(default: the suite's 11 s)")
    parser.add_argument("--output", type=Path, default=None, help="the JSON file (default: a temporary one)")
    args = parser.parse_args(argv)
    sizes = dataclasses.replace(SIZES["full"], sim_steps=tuple(int(step) for step in args.steps.split(",")))
    if args.settle is not None:
        sizes = dataclasses.replace(sizes, sim_settle_seconds=args.settle)
    load_before = os.getloadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-scale-sim-") as workdir:
        ctx = Context(database_url="", profile=FULL, workdir=Path(workdir))
        result = _simulate(ctx, sizes, listen_slots=args.listen_slots, slot_retry=args.slot_retry)
    result.update(load_average_before=load_before, load_average_after=os.getloadavg(),
                  seconds=time.time() - started, sizes=dataclasses.asdict(sizes))
    output = args.output or Path(tempfile.mkstemp(prefix="scale-simulated-", suffix=".json")[1])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1, default=str))
    for point in result["points"]:
        print("\n".join(_row(point)), end="\n\n")
    if result["failure"]:
        print(f"failed at step {result['failure']['step']}: {result['failure']['error']}")
    print(f"feeder: {result['feeder']}; sampler failures: {result['sampler_failures']}")
    print(f"load average before {load_before}, after {result['load_average_after']}; {result['seconds']:.0f} s; "
          f"JSON: {output}")


if __name__ == "__main__":
    main()
