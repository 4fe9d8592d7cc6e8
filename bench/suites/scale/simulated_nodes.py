"""Series simulated, the bench's side: the feeder, the simulation processes driven step by step, each window."""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import multiprocessing
import queue as queue_module
import threading
import time
import traceback
import uuid

from bench.context import Context
from bench.processes import cpu_cores, cpu_seconds
from bench.servers import Servers, connect
from bench.stats import summarise
from bench.suites.scale.figures import _last_line
from bench.suites.scale.sampling import Sampler, _bouncer_totals, _bouncer_window, _transactions
from bench.suites.scale.settings import (
    HEARTBEAT_INTERVAL,
    HOLD_SECONDS,
    LEASE_SECONDS,
    MAX_ATTEMPTS,
    MAX_PROC,
    POOL_SIZE,
    PROJECT,
    REAL_MAX_CLIENT_CONN,
    SIM_FINISHED_TO_KEEP,
    SIM_MAX_CONNECTIONS,
    SIM_POLL_INTERVAL,
    SPIDER,
    Sizes,
)
from bench.suites.scale.simulation import simulate


class Feeder(threading.Thread):
    """Enqueues jobs at a steady rate through PgBouncer with the package's store, as a node's schedule.json does."""

    def __init__(self, url: str, rate: float):
        super().__init__(name="scale-feeder", daemon=True)
        self.url, self.rate = url, rate
        self.stopping = threading.Event()
        self.enqueued = 0
        self.errors = 0
        self.first_error = None

    def run(self) -> None:
        from scrapyd_pgqueue.database import db
        from scrapyd_pgqueue.store import JobStore

        engine = db.get_engine(f"{self.url}?application_name=scale-feeder", migrate_schema=False,
                               application_name="scale-feeder")
        store = JobStore(engine)
        started = time.monotonic()
        try:
            for number in itertools.count():
                due = started + number / self.rate
                if self.stopping.wait(max(0.0, due - time.monotonic())):
                    return
                try:
                    store.enqueue(PROJECT, {"name": SPIDER, "_job": f"sim-{number}-{uuid.uuid4().hex[:6]}"})
                    self.enqueued += 1
                except Exception as e:  # noqa: BLE001 - counted
                    self.errors += 1
                    self.first_error = self.first_error or repr(e)
        finally:
            engine.dispose()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def _simulate(ctx: Context, sizes: Sizes, listen_slots: int = 0, slot_retry: float | None = None) -> dict:
    """The simulated series. ``listen_slots`` > 0: every simulated node also holds a session straight to Postgres
    (``listen_url``), taking a listen slot while it wants work (one try per ``slot_retry``, default its
    ``poll_interval``) and LISTENing while it holds one (``slots.py``); Postgres then takes one connection a node
    more."""
    steps = sizes.sim_steps
    slot_retry = SIM_POLL_INTERVAL if slot_retry is None else slot_retry
    max_connections = SIM_MAX_CONNECTIONS + (max(steps) + 50 if listen_slots else 0)
    servers = Servers(max_connections, max(REAL_MAX_CLIENT_CONN, max(steps) * POOL_SIZE + 200), ctx.log)
    context = multiprocessing.get_context("spawn")
    processes, commands = [], []
    results = None
    sampler = feeder = None
    points = []
    failure = None
    try:
        servers.start()
        sampler = Sampler(servers)
        sampler.start()
        results = context.Queue()
        parameters = {"poll_interval": SIM_POLL_INTERVAL, "heartbeat_interval": HEARTBEAT_INTERVAL,
                      "lease_seconds": LEASE_SECONDS, "max_attempts": MAX_ATTEMPTS, "max_proc": MAX_PROC,
                      "pool_size": POOL_SIZE, "hold_seconds": HOLD_SECONDS, "threads": sizes.sim_threads,
                      "finished_to_keep": SIM_FINISHED_TO_KEEP, "listen_slots": listen_slots,
                      "slot_retry": slot_retry, "direct_url": servers.direct_url}
        for index in range(sizes.sim_processes):
            commands.append(context.Queue())
            process = context.Process(target=simulate, name=f"scale-sim-{index}",
                                      args=(index, servers.url, parameters, commands[index], results))
            process.start()
            processes.append(process)
        _gather(results, processes, "ready", 180.0)
        ctx.log(f"scale: simulated: {len(processes)} processes ready; feeding {sizes.sim_jobs_per_second:g} jobs/s")
        feeder = Feeder(servers.url, sizes.sim_jobs_per_second)
        feeder.start()
        current = 0
        for step in steps:
            try:
                points.append(_sim_step(ctx, sizes, servers, sampler, feeder, processes, commands, results,
                                        current, step))
            except Exception as e:  # noqa: BLE001 - a step that cannot be measured ends the stepping; kept
                failure = {"step": step, "error": _last_line(str(e)), "traceback": traceback.format_exc()[-4000:]}
                ctx.log(f"scale: simulated: the {step}-node step failed, stopping here:\n{failure['traceback']}")
                break
            current = step
    finally:
        if feeder is not None:
            feeder.stop()
        for command in commands:
            with contextlib.suppress(Exception):
                command.put(("stop", None))
        for process in processes:
            process.join(15)
            if process.is_alive():
                process.kill()
                process.join(5)
        if sampler is not None:
            sampler.stop()
        servers.remove()
    return {
        "points": points,
        "failure": failure,
        "processes": sizes.sim_processes,
        "threads_per_process": sizes.sim_threads,
        "jobs_per_second": sizes.sim_jobs_per_second,
        "listen_slots": listen_slots,
        "slot_retry": slot_retry if listen_slots else None,
        "max_connections": max_connections,
        "feeder": {"enqueued": feeder.enqueued if feeder else 0, "errors": feeder.errors if feeder else 0,
                   "first_error": feeder.first_error if feeder else None},
        "pgbouncer_open_files": servers.fd_limit,
        "max_client_conn": servers.max_client_conn,
        "sampler_failures": sampler.failures if sampler is not None else None,
    }


def _sim_step(ctx, sizes, servers, sampler, feeder, processes, commands, results, current: int, step: int) -> dict:
    """Add nodes ``current`` to ``step`` (spread over the processes), let them settle, measure one window."""
    added_at = time.monotonic()
    for index, command in enumerate(commands):
        command.put(("add", [number for number in range(current, step) if number % len(processes) == index]))
    added = _gather(results, processes, "added", 600.0)
    add_seconds = time.monotonic() - added_at
    ctx.log(f"scale: simulated: {step} nodes ({add_seconds:.1f} s to add); settling {sizes.sim_settle_seconds:g} s, "
            f"measuring {sizes.sim_window_seconds:g} s")
    time.sleep(sizes.sim_settle_seconds)
    point = _sim_window(servers, sampler, feeder, processes, commands, results, sizes)
    point.update(nodes=step, add_seconds=add_seconds,
                 nodes_added_per_process=[payload for _, payload in sorted(added.items())])
    ctx.log(f"scale: simulated {step} nodes: {point['transactions_per_second']:.0f} transactions/s, claim p50 "
            f"{point['claim_ms']['p50']:.1f} ms p99 {point['claim_ms']['p99']:.1f} ms, "
            f"{point['pgbouncer_clients_peak']} PgBouncer clients, {point['backends_peak']} backends, errors "
            f"{point['errors']} (slow calls {point['slow_operations']}), claim ticks run "
            f"{point['ticks_run_per_due']:.0%}, CPU sim {point['cpu_cores'].get('simulator', 0):.2f} postgres "
            f"{point['cpu_cores'].get('postgres', 0):.2f} cores")
    return point


def _gather(results, processes, kind: str, timeout: float) -> dict[int, object]:
    """One ``kind`` message from every simulation process (their errors raised here)."""
    got: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(processes):
        try:
            message, index, payload = results.get(timeout=1.0)
        except queue_module.Empty:
            dead = [process.name for process in processes if not process.is_alive()]
            if dead:
                raise RuntimeError(f"scale: simulation process(es) died: {dead}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"scale: no '{kind}' from {len(processes) - len(got)} simulation process(es) "
                                   f"within {timeout:g} s") from None
            continue
        if message == "error":
            raise RuntimeError(f"scale: simulation process {index} failed:\n{payload}")
        if message != kind:
            raise RuntimeError(f"scale: expected '{kind}' from simulation process {index}, got '{message}'")
        got[index] = payload
    return got


def _sim_window(servers, sampler, feeder, processes, commands, results, sizes) -> dict:
    groups = {"simulator": [process.pid for process in processes], "postgres": [servers.postmaster_pid()],
              "pgbouncer": [servers.bouncer_pid()]}
    for command in commands:
        command.put(("start", None))
    between = _gather(results, processes, "started", 60.0).values()
    first_bouncer = _bouncer_totals(servers)
    first_transactions, first_cpu, start = _transactions(servers), cpu_seconds(groups), time.monotonic()
    first_enqueued = feeder.enqueued
    time.sleep(sizes.sim_window_seconds)
    for command in commands:
        command.put(("end", None))
    stats = _gather(results, processes, "stats", 120.0)
    last_transactions, last_cpu, end = _transactions(servers), cpu_seconds(groups), time.monotonic()
    last_bouncer = _bouncer_totals(servers)
    enqueued = feeder.enqueued - first_enqueued
    window = end - start
    with contextlib.closing(connect(servers.direct_url)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM spider_job WHERE status = 'pending'")
        pending = cursor.fetchone()[0]
    merged = _merge_stats(stats.values())
    holders = _slot_holders(servers)
    transactions = last_transactions - first_transactions - 1
    operations = sum(merged["operations"].values()) + enqueued
    nodes = sum(stat["nodes"] for stat in stats.values())
    due_ticks = sum(stat["due_ticks"] for stat in stats.values())
    due_beats = sum(stat["due_beats"] for stat in stats.values())
    return {
        "window_seconds": window,
        "pgbouncer": _bouncer_window(first_bouncer, last_bouncer, transactions, window),
        # Claim ticks and heartbeats run in the window against those due (nodes x window / interval): below 1, the
        # simulator (or the machine) could not keep up; late ticks are skipped, as Twisted's LoopingCall does.
        "ticks_run_per_due": len(merged["tick_late_ms"]) / due_ticks if due_ticks else math.nan,
        "heartbeats_run_per_due": merged["operations"].get("heartbeat", 0) / due_beats if due_beats else math.nan,
        "simulated_nodes": nodes,
        "transactions": transactions,
        "transactions_per_second": transactions / window,
        "operations_per_second": operations / window,
        "transactions_per_operation": transactions / operations if operations else math.nan,
        "operations": merged["operations"],
        "enqueued": enqueued,
        "pending_at_end": pending,
        "claim_ms": summarise(merged["claim_ms"]),
        "heartbeat_ms": summarise(merged["heartbeat_ms"]),
        "tick_late_ms": summarise(merged["tick_late_ms"]),
        "claims_with_jobs": merged["claims_with_jobs"],
        "jobs_claimed": merged["jobs_claimed"],
        "jobs_finished": merged["jobs_finished"],
        # listen slots: their holders at the window's end, what they heard, the statements on the direct sessions
        "listen_slot_holders": len(holders),
        "listen_slot_holders_distinct_nodes": len({holder.node for holder in holders}),
        "notifications_heard": merged["heard"],
        "direct_statements": sum(merged["operations"].get(kind, 0) for kind in DIRECT_KINDS),
        "direct_statements_per_second": sum(merged["operations"].get(kind, 0) for kind in DIRECT_KINDS) / window,
        "errors": sum(merged["errors"].values()),
        "database_errors": merged["errors"].get("DatabaseError", 0),
        "errors_by_type": merged["errors"],
        "slow_operations": merged["slow"],
        # Before the window, while the nodes of this step were added and settled (connects, registrations).
        "errors_adding": sum(sum(part["errors"].values()) for part in between),
        "errors_adding_by_type": dict(sum((collections.Counter(part["errors"]) for part in between),
                                          collections.Counter())),
        "errors_adding_samples": [sample for part in between for sample in part["error_samples"]][:5],
        "slow_operations_adding": dict(sum((collections.Counter(part["slow"]) for part in between),
                                           collections.Counter())),
        "error_samples": merged["error_samples"][:5],
        "cpu_cores": cpu_cores(first_cpu, last_cpu, window),
        **sampler.summary(start, end),
    }


# The simulated nodes' statements on their direct sessions (listen slots), not through PgBouncer.
DIRECT_KINDS = ("take_listen_slot", "listen", "unlisten", "give_up_listen_slot")


def _slot_holders(servers) -> list:
    """The listen slots held now (the product's reader of pg_locks), on a connection of the bench's."""
    from scrapyd_pgqueue.database import db
    from scrapyd_pgqueue.store.listen_slots import ListenSlotHolders

    engine = db.get_engine(f"{servers.direct_url}?application_name=scale-holders", pool_size=1,
                           migrate_schema=False, application_name="scale-holders", purpose="holders")
    try:
        return ListenSlotHolders(engine).holders()
    finally:
        engine.dispose()


def _merge_stats(parts) -> dict:
    merged = {"operations": collections.Counter(), "claim_ms": [], "heartbeat_ms": [], "tick_late_ms": [],
              "claims_with_jobs": 0, "jobs_claimed": 0, "jobs_finished": 0, "heard": 0, "errors": collections.Counter(),
              "error_samples": [], "slow": collections.Counter()}
    for part in parts:
        merged["operations"].update(part["operations"])
        for key in ("claim_ms", "heartbeat_ms", "tick_late_ms", "error_samples"):
            merged[key] += part[key]
        for key in ("claims_with_jobs", "jobs_claimed", "jobs_finished", "heard"):
            merged[key] += part[key]
        merged["errors"].update(part["errors"])
        merged["slow"].update(part["slow"])
    merged["slow"] = dict(merged["slow"])
    merged["operations"] = dict(merged["operations"])
    merged["errors"] = dict(merged["errors"])
    return merged
