"""The scale suite's table: the real nodes' figures side by side, the simulated steps' load and latency."""

from __future__ import annotations

import math

from bench import report
from bench.suites.scale.settings import JOB_SECONDS, MODES, REAL_MAX_CLIENT_CONN


def _ms(summary: dict, key: str) -> str:
    return report.number(summary[key], 0 if abs(summary[key] or 0) >= 100 else 1)


def format_table(result: dict) -> str:
    series, parameters = result["series"], result["parameters"]
    modes = list(MODES)

    def both(getter, digits=0):
        cells = []
        for name in modes:
            try:
                value = getter(series[name])
            except (KeyError, TypeError):
                value = None
            cells.append(value if isinstance(value, str) else report.number(value, digits))
        return cells

    def cores(data, phase, group):
        return data[phase]["cpu_cores"].get(group)

    rows = [
        ["nodes", *both(lambda d: d["nodes"])],
        ["nodes retried at start", *both(lambda d: d["start"]["retried"])],
        ["start-up: all nodes answering (s)", *both(lambda d: d["start"]["seconds"], 1)],
        ["warm-up: listspiders.json on every node (s)", *both(lambda d: d["warmup_seconds"], 1)],
        ["listen_url / poll_interval (s)", *both(lambda d: f"{'direct' if d['listen_url'] else 'none'} / "
                                                           f"{d['poll_interval']:g}")],
        ["Postgres max_connections", *both(lambda d: d["max_connections"])],
        ["nodes that said 'runs poll-only'", *both(lambda d: d["poll_only_lines"])],
        ["idle: transactions/s, whole cluster", *both(lambda d: d["idle"]["transactions_per_second"], 1)],
        ["idle: transactions/s per node", *both(lambda d: d["idle"]["transactions_per_second_per_node"], 2)],
        ["idle: PgBouncer client transactions/s", *both(
            lambda d: d["idle"]["pgbouncer"]["client_transactions_per_second"], 1)],
        ["idle: server transactions per PgBouncer client transaction", *both(
            lambda d: d["idle"]["pgbouncer"]["server_per_client_transaction"], 2)],
        ["idle: server backends, peak", *both(lambda d: d["idle"]["backends_peak"])],
        ["idle: of which PgBouncer's / direct, peak", *both(
            lambda d: f"{d['idle']['pgbouncer_backends_peak']} / {d['idle']['direct_backends_peak']}")],
        ["idle: listeners (direct backends), peak", *both(lambda d: d["idle"]["listeners_peak"])],
        ["idle: PgBouncer server connections, peak", *both(lambda d: d["idle"]["pgbouncer_servers_peak"])],
        ["idle: PgBouncer clients, peak", *both(lambda d: d["idle"]["pgbouncer_clients_peak"])],
        ["idle: CPU of all nodes (cores)", *both(lambda d: cores(d, "idle", "nodes"), 2)],
        ["idle: CPU of Postgres / PgBouncer (cores)", *both(
            lambda d: f"{cores(d, 'idle', 'postgres'):.2f} / {cores(d, 'idle', 'pgbouncer'):.2f}")],
        ["jobs: run exactly once / scheduled", *both(lambda d: f"{d['jobs']['exactly_once']}/{d['jobs']['count']}")],
        ["jobs: never ran / ran twice or more", *both(lambda d: f"{d['jobs']['never_ran']} / "
                                                               f"{d['jobs']['ran_more_than_once']}")],
        ["jobs: schedule.json errors", *both(lambda d: d["jobs"]["schedule_errors"])],
        ["jobs: schedule.json p50 / p99 (ms)", *both(lambda d: f"{_ms(d['jobs']['schedule_ms'], 'p50')} / "
                                                              f"{_ms(d['jobs']['schedule_ms'], 'p99')}")],
        ["jobs: response -> spawn (row start_time) p50 / p99 (ms)", *both(
            lambda d: f"{_ms(d['jobs']['to_spawn_ms'], 'p50')} / {_ms(d['jobs']['to_spawn_ms'], 'p99')}")],
        ["jobs: response -> spider (runs.jsonl) p50 / p99 (ms)", *both(
            lambda d: f"{_ms(d['jobs']['to_spider_ms'], 'p50')} / {_ms(d['jobs']['to_spider_ms'], 'p99')}")],
        ["jobs: ran on the node that took schedule.json", *both(
            lambda d: f"{d['jobs']['ran_on_scheduling_node']}/{d['jobs']['count']}")],
        ["jobs: phase (s), in flight at most", *both(lambda d: f"{d['jobs']['seconds']:.0f}, "
                                                              f"{d['jobs']['in_flight_cap']}")],
        ["jobs: transactions/s during the phase", *both(lambda d: d["jobs"]["transactions_per_second"], 0)],
        ["jobs: server transactions per job, over idle", *both(
            lambda d: (d["jobs"]["transactions_per_second"] - d["idle"]["transactions_per_second"])
            * d["jobs"]["seconds"] / d["jobs"]["count"], 0)],
        ["jobs: PgBouncer mean xact / wait for a server (ms)", *both(
            lambda d: f"{d['jobs']['pgbouncer']['xact_ms_mean']:.2f} / {d['jobs']['pgbouncer']['wait_ms_mean']:.2f}")],
        ["jobs: server backends, peak", *both(lambda d: d["jobs"]["backends_peak"])],
        ["jobs: PgBouncer clients peak / waiting peak", *both(
            lambda d: f"{d['jobs']['pgbouncer_clients_peak']} / {d['jobs']['pgbouncer_clients_waiting_peak']}")],
        ["PgBouncer clients per node, peak (budget 2)", *both(
            lambda d: max(v for v in (d["idle"]["pgbouncer_clients_per_node_peak"],
                                      d["jobs"]["pgbouncer_clients_per_node_peak"]) if v is not None))],
        ["listeners per node, peak (budget 1)", *both(
            lambda d: max(d["idle"]["listeners_per_node_peak"] or 0, d["jobs"]["listeners_per_node_peak"] or 0))],
        ["connection errors in node and crawl logs", *both(lambda d: d["errors"]["connection_errors"])],
    ]
    simulated = series["simulated"]
    load_rows, latency_rows = [], []
    for point in simulated["points"]:
        cpu, bouncer = point["cpu_cores"], point["pgbouncer"]
        load_rows.append([
            report.number(point["nodes"]),
            report.number(point["operations_per_second"], 0),
            report.number(bouncer["client_transactions_per_second"], 0),
            report.number(point["transactions_per_second"], 0),
            report.number(point["transactions_per_operation"], 2),
            report.number(point["backends_peak"]),
            report.number(point["pgbouncer_servers_peak"]),
            report.number(point["pgbouncer_clients_peak"]),
            report.number(point["pgbouncer_clients_waiting_peak"]),
            report.number(point["jobs_claimed"]),
            report.number(point["pending_at_end"]),
            report.number(point["errors"]),
            report.number(point["errors_adding"]),
        ])
        latency_rows.append([
            report.number(point["nodes"]),
            _ms(point["claim_ms"], "p50"),
            _ms(point["claim_ms"], "p99"),
            _ms(point["heartbeat_ms"], "p50"),
            _ms(point["heartbeat_ms"], "p99"),
            report.number(bouncer["xact_ms_mean"], 2),
            report.number(bouncer["wait_ms_mean"], 2),
            f"{point['ticks_run_per_due']:.0%}",
            f"{point['heartbeats_run_per_due']:.0%}",
            f"{cpu.get('simulator', math.nan):.2f}",
            f"{cpu.get('postgres', math.nan):.2f}",
            f"{cpu.get('pgbouncer', math.nan):.2f}",
            f"{cpu.get('machine_busy', math.nan):.2f}",
        ])
    sizes = parameters["sizes"]
    lines = [
        report.heading("Scale"),
        f"real Scrapyd nodes through PgBouncer (transaction pooling, pool {parameters['pgbouncer_pool_size']}, "
        f"max_client_conn {REAL_MAX_CLIENT_CONN}) to a Postgres of their own; max_proc {parameters['max_proc']}, "
        f"heartbeat {parameters['heartbeat_interval']:g} s, lease {parameters['lease_seconds']:g} s, "
        f"database_pool_size {parameters['database_pool_size']}; idle window {sizes['idle_seconds']:g} s; "
        f"{sizes['jobs']} jobs (sleeper, seconds={JOB_SECONDS}) POSTed to random nodes by {sizes['schedule_threads']} "
        f"threads, at most {sizes['in_flight']} in flight; latencies from the schedule.json response, signed",
        report.format_rows(["figure", "poll-only", "listeners direct"], rows),
        "",
        f"simulated nodes: the package's store calls of a node (register, node tick (heartbeat, lease recovery, "
        f"cancels, eggs, periodic) every {parameters['heartbeat_interval']:g} s, a claim tick every "
        f"{parameters['sim_poll_interval']:g} s with a free slot of {parameters['max_proc']}, mark_started, a "
        f"{parameters['sim_hold_seconds']:g} s hold, finish_job + prune_terminated), one engine (pool "
        f"{parameters['database_pool_size']}, both connections open) per node, through PgBouncer (pool "
        f"{parameters['pgbouncer_pool_size']}, max_client_conn {simulated.get('max_client_conn', 0):,}) to Postgres "
        f"(max_connections {parameters['sim_max_connections']}); {sizes['sim_processes']} processes x "
        f"{sizes['sim_threads']} threads; {sizes['sim_jobs_per_second']:g} jobs/s enqueued; "
        f"{sizes['sim_window_seconds']:g} s window per step. store calls = the simulated nodes' JobStore/AllJobsStore/"
        "EggStore calls + the feeder's enqueues; PgB client xact = transactions PgBouncer's clients sent (SHOW STATS); "
        "server xact = pg_stat_database; PgB xact ms / wait ms = mean time a transaction held / waited for a server "
        "connection (SHOW STATS); claim ticks / heartbeats run = run in the window / due (late ones are skipped, as "
        "LoopingCall does); CPU in cores (the machine has 2; 'machine' includes other users)",
        report.format_rows(["nodes", "store calls/s", "PgB client xact/s", "server xact/s", "server xact/call",
                            "backends peak", "PgB server conns", "PgB clients", "PgB waiting peak", "jobs claimed",
                            "pending at end", "errors", "errors adding"], load_rows),
        "",
        report.format_rows(["nodes", "claim p50 ms", "claim p99 ms", "heartbeat p50 ms", "heartbeat p99 ms",
                            "PgB xact ms", "PgB wait ms", "claim ticks run", "heartbeats run", "CPU sim",
                            "CPU postgres", "CPU pgbouncer", "CPU machine"], latency_rows),
        "",
    ]
    return report.table_text(result, lines, ratios="ratio / difference")
