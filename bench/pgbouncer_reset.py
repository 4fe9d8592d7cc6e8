"""What PgBouncer's reset after every transaction (``server_reset_query_always``) costs Postgres per node statement.

Real Postgres (a throwaway ``devdb.LocalPostgres``, autovacuum off so that nothing else commits in the measured
databases) and Debian's PgBouncer (``devdb.LocalPgBouncer``, transaction pooling), one PgBouncer per case.

Counts: ``--clients`` clients, each a node's pool connection (the connector's ``Engine``, its own
``application_name`` as a node's, or one name for all), share a pool of ``--pool`` server connections and send
``--statements`` of the node's commonest statement each, concurrently: the poll-only claim that finds nothing
(``JobStore.claim_next_jobs``, the real call). Server transactions are ``pg_stat_database``'s ``xact_commit +
xact_rollback`` of a database used by nothing else, read once PgBouncer has stopped (a backend reports its counts
when it ends), less one per server session (a backend's login commits one transaction).

Throughput: the shipped reset against ``server_reset_query_always = 0`` side by side for clients of their own
names (and, for scale, a reset that sets a shared name again against none for clients sharing it), alternating,
``--rounds`` rounds of ``--seconds`` each: ``--clients`` client processes claiming as fast as they can; statements
per second, claim p50, and CPU per statement of Postgres (the postmaster's tree) and of PgBouncer.

    python -m bench.pgbouncer_reset [--clients 8] [--pool 2] [--statements 2000] [--seconds 5] [--rounds 3]
                                    [--output results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path

from psycopg2 import sql

from bench.processes import cpu_seconds
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import Engine
from scrapyd_pgqueue.local import devdb

# The shipped reset: everything DISCARD ALL does but DISCARD PLANS.
FULL_RESET = devdb.SERVER_RESET_QUERY
# The same without RESET ALL: application_name (and every other SET) is left as it was.
RESET_BUT_SETTINGS = ("CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; DEALLOCATE ALL; UNLISTEN *; "
                      "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES")
SHARED_NAME = "scrapyd-pgqueue bench-node"  # every client's application_name when they share one
# The full reset, then the shared name set again in the same transaction: PgBouncer sees the server's name (a
# ParameterStatus) and has nothing to SET for a client of that name.
RESET_TO_SHARED_NAME = ("CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; "
                        "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; "
                        "SET application_name = 'scrapyd-pgqueue bench-node'")
CASES = {
    "reset, always = 1": {"server_reset_query": FULL_RESET, "server_reset_query_always": "1"},
    "always = 0": {"server_reset_query": FULL_RESET, "server_reset_query_always": "0"},
    "reset without RESET ALL, always = 1": {"server_reset_query": RESET_BUT_SETTINGS,
                                            "server_reset_query_always": "1"},
    "reset, always = 1, application_name ignored": {
        "server_reset_query": FULL_RESET, "server_reset_query_always": "1",
        "ignore_startup_parameters": "extra_float_digits,application_name"},
    "reset, then the shared name, always = 1": {"server_reset_query": RESET_TO_SHARED_NAME,
                                                "server_reset_query_always": "1"},
}
# Throughput, alternating: the shipped reset against none for nodes of their own names, and, for scale, both with
# one name for all (no SET of application_name).
SIDE_BY_SIDE = (("reset, always = 1", "distinct"), ("always = 0", "distinct"),
                ("reset, then the shared name, always = 1", "same"), ("always = 0", "same"))
NAMES = ("distinct", "same")  # each client a node's application_name, or one for all
PROJECT = "bench"

CREATE_EMPTY_DATABASE = sql.SQL("CREATE DATABASE {}")
CREATE_DATABASE = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
DROP_DATABASE = sql.SQL("DROP DATABASE {}")
BACKENDS_ON = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
TRANSACTIONS = "SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = %s"
SERVER_VERSION = "SELECT version()"


class Server:
    """The throwaway Postgres, a migrated template database, and a fresh database copied from it per case."""

    def __init__(self):
        self.postgres = devdb.LocalPostgres(settings={"autovacuum": "off", "max_connections": "100"})
        self.postgres.create()
        self.postgres.start()
        self.template = "reset_template"
        self.admin = db.direct_connection(host="127.0.0.1", port=self.postgres.port, user="postgres",
                                          dbname="postgres")
        self.admin.autocommit = True
        self.query(CREATE_EMPTY_DATABASE.format(sql.Identifier(self.template)))
        engine = db.get_engine(self.url_of(self.template), application_name="scrapyd-pgqueue-bench")  # migrated
        engine.dispose()
        self.wait_until_unused(self.template)
        self.serial = 0

    def url_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.postgres.port}/{database}"

    def query(self, statement, params=()):
        with self.admin.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else None

    def fresh_database(self) -> str:
        self.serial += 1
        name = f"reset_case_{self.serial}"
        self.query(CREATE_DATABASE.format(sql.Identifier(name), sql.Identifier(self.template)))
        return name

    def wait_until_unused(self, database: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.query(BACKENDS_ON, (database,))[0][0]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"backends still on {database} after {timeout} s")
            time.sleep(0.05)

    def transactions(self, database: str) -> tuple[int, int]:
        """(transactions, sessions) once no backend is left on ``database``: each reports its counts as it ends."""
        self.wait_until_unused(database)
        time.sleep(0.2)
        [(transactions, sessions)] = self.query(TRANSACTIONS, (database,))
        return transactions, sessions

    def postmaster(self) -> int:
        return int((self.postgres.data / "postmaster.pid").read_text().split()[0])

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.admin.close()
        self.postgres.remove()


def client_name(index: int, names: str) -> str:
    return db.application_name(f"bench-node-{index}") if names == "distinct" else SHARED_NAME


def claim_once(store, name: str) -> None:
    store.claim_next_jobs([PROJECT], 1, node=name, worker=name)


def count_case(server: Server, case: str, names: str, clients: int, pool: int, statements: int) -> dict:
    """Server transactions per statement for ``clients`` concurrent clients sharing ``pool`` server connections."""
    from scrapyd_pgqueue.store import JobStore

    database = server.fresh_database()
    bouncer = devdb.LocalPgBouncer(server.url_of(database), pool_size=pool, settings=CASES[case])
    bouncer.start()
    engines = [Engine(bouncer.url, pool_size=1, timeout=60.0,
                      connect_args={"application_name": client_name(i, names)}) for i in range(clients)]
    try:
        def work(index: int) -> None:
            store = JobStore.for_engine(engines[index])
            for _ in range(statements):
                claim_once(store, client_name(index, names))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        [stats] = [row for row in bouncer.show("SHOW STATS") if row["database"] == database]
    finally:
        for engine in engines:
            engine.dispose()
        bouncer.remove()
    transactions, sessions = server.transactions(database)
    server.query(DROP_DATABASE.format(sql.Identifier(database)))
    sent = clients * statements
    return {"case": case, "names": names, "clients": clients, "pool": pool, "statements": sent,
            "server_transactions": transactions - sessions, "server_sessions": sessions,
            "per_statement": (transactions - sessions) / sent,
            "pgbouncer_xact_count": int(stats["total_xact_count"]),
            "pgbouncer_query_count": int(stats["total_query_count"])}


def client_process(url: str, name: str, ready, start, stop, results) -> None:
    """One node's pool connection claiming as fast as it can between ``start`` and ``stop``."""
    from scrapyd_pgqueue.store import JobStore

    engine = Engine(url, pool_size=1, timeout=60.0, connect_args={"application_name": name})
    store = JobStore.for_engine(engine)
    sent = 0
    for _ in range(50):  # warm: connected, the claim function's plan cached on the server connections
        claim_once(store, name)
        sent += 1
    ready.release()
    start.wait()
    timed, latencies = 0, []
    while not stop.is_set():
        began = time.perf_counter()
        claim_once(store, name)
        latencies.append(time.perf_counter() - began)
        timed += 1
    sent += timed
    engine.dispose()
    results.put({"timed": timed, "sent": sent, "latencies": latencies})


def throughput_round(server: Server, case: str, names: str, clients: int, pool: int, seconds: float) -> dict:
    database = server.fresh_database()
    bouncer = devdb.LocalPgBouncer(server.url_of(database), pool_size=pool, settings=CASES[case])
    bouncer.start()
    context = multiprocessing.get_context("spawn")
    ready, start, stop, results = context.Semaphore(0), context.Event(), context.Event(), context.Queue()
    processes = [context.Process(target=client_process, args=(bouncer.url, client_name(i, names), ready,
                                                              start, stop, results)) for i in range(clients)]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            if not ready.acquire(timeout=120):
                raise RuntimeError("a client process did not get ready")
        groups = {"postgres": [server.postmaster()], "pgbouncer": [bouncer.process.pid],
                  "clients": [process.pid for process in processes]}
        before, began = cpu_seconds(groups), time.monotonic()
        start.set()
        time.sleep(seconds)
        stop.set()
        after, elapsed = cpu_seconds(groups), time.monotonic() - began
        reports = [results.get(timeout=60) for _ in processes]
        for process in processes:
            process.join(30)
    finally:
        stop.set()
        for process in processes:
            if process.is_alive():
                process.kill()
        bouncer.remove()
    transactions, sessions = server.transactions(database)
    server.query(DROP_DATABASE.format(sql.Identifier(database)))
    timed = sum(report["timed"] for report in reports)
    latencies = sorted(latency for report in reports for latency in report["latencies"])
    cpu = {name: after[name] - before[name] for name in groups}
    return {"case": case, "names": names, "seconds": elapsed, "statements": timed, "per_second": timed / elapsed,
            "claim_p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "claim_p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else None,
            "postgres_cpu_us": 1e6 * cpu["postgres"] / timed, "pgbouncer_cpu_us": 1e6 * cpu["pgbouncer"] / timed,
            "clients_cpu_us": 1e6 * cpu["clients"] / timed,
            "per_statement": (transactions - sessions) / sum(report["sent"] for report in reports)}


def machine(server: Server) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    bouncer = subprocess.run([devdb.pgbouncer_binary(), "--version"], capture_output=True, text=True).stdout
    return {"cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "python": platform.python_version(),
            "postgres": server.query(SERVER_VERSION)[0][0].split(" on ")[0],
            "pgbouncer": bouncer.splitlines()[0] if bouncer else "?", "load_average": os.getloadavg()}


def print_counts(rows: list[dict]) -> None:
    print(f"\n{'case':<45} {'names':<9} {'statements':>10} {'server xacts':>12} {'per statement':>13} "
          f"{'PgBouncer xacts':>15}")
    for row in rows:
        print(f"{row['case']:<45} {row['names']:<9} {row['statements']:>10} {row['server_transactions']:>12} "
              f"{row['per_statement']:>13.2f} {row['pgbouncer_xact_count']:>15}")


def print_throughput(rounds: list[dict]) -> None:
    print(f"\n{'case':<40} {'names':<9} {'round':>5} {'statements/s':>12} {'p50 ms':>7} {'p99 ms':>7} {'xacts/stmt':>10} "
          f"{'Postgres µs/stmt':>16} {'PgBouncer µs/stmt':>17} {'clients µs/stmt':>15}")
    for index, row in enumerate(rounds):
        print(f"{row['case']:<40} {row['names']:<9} {index // len(SIDE_BY_SIDE) + 1:>5} {row['per_second']:>12.0f} "
              f"{row['claim_p50_ms']:>7.3f} {row['claim_p99_ms']:>7.3f} {row['per_statement']:>10.2f} "
              f"{row['postgres_cpu_us']:>16.0f} {row['pgbouncer_cpu_us']:>17.0f} {row['clients_cpu_us']:>15.0f}")
    # Statements per CPU second of Postgres and PgBouncer together: what the servers can carry, which other load on
    # the machine moves less than statements per second.
    print(f"\n{'case':<40} {'names':<9} {'statements/s':>12} {'p50 ms':>7} {'Postgres µs':>11} {'PgBouncer µs':>12} "
          f"{'per server CPU s':>16}   (medians)")
    for case, names in SIDE_BY_SIDE:
        mine = [row for row in rounds if (row["case"], row["names"]) == (case, names)]
        print(f"{case:<40} {names:<9} {statistics.median(r['per_second'] for r in mine):>12.0f} "
              f"{statistics.median(r['claim_p50_ms'] for r in mine):>7.3f} "
              f"{statistics.median(r['postgres_cpu_us'] for r in mine):>11.0f} "
              f"{statistics.median(r['pgbouncer_cpu_us'] for r in mine):>12.0f} "
              f"{statistics.median(1e6 / (r['postgres_cpu_us'] + r['pgbouncer_cpu_us']) for r in mine):>16.0f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pgbouncer_reset", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8, help="clients (nodes' connections), default 8")
    parser.add_argument("--pool", type=int, default=2, help="PgBouncer's server connections, default 2")
    parser.add_argument("--statements", type=int, default=2000, help="statements per client when counting")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per throughput round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per case (alternating)")
    parser.add_argument("--output", type=Path, help="write every figure as JSON there too")
    args = parser.parse_args(argv)
    server = Server()
    try:
        figures = {"machine": machine(server), "parameters": vars(args) | {"output": str(args.output)}}
        print(json.dumps(figures["machine"]))
        figures["counts"] = [count_case(server, case, names, args.clients, args.pool, args.statements)
                             for case in CASES for names in NAMES]
        print_counts(figures["counts"])
        figures["throughput"] = [throughput_round(server, case, names, args.clients, args.pool, args.seconds)
                                 for _ in range(args.rounds) for case, names in SIDE_BY_SIDE]
        print_throughput(figures["throughput"])
        figures["load_average_after"] = os.getloadavg()
        print(f"\nload average before {figures['machine']['load_average']}, after {figures['load_average_after']}")
        if args.output:
            args.output.write_text(json.dumps(figures, indent=1))
    finally:
        server.remove()


if __name__ == "__main__":
    main()
