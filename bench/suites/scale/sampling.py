"""What the servers report: backends (pg_stat_activity), PgBouncer's pools, clients and totals, transactions."""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time

from bench.servers import DATABASE, Servers, connect, connect_bouncer
from bench.suites.scale.settings import CLIENTS_PERIOD, SAMPLE_PERIOD

BACKENDS = f"""
    SELECT pid, application_name FROM pg_stat_activity
    WHERE datname = '{DATABASE}' AND backend_type = 'client backend'
"""
LISTENER_PREFIX = "scrapyd-pgqueue-listener "


def _backends(server_cursor, bouncer_cursor) -> dict:
    """The server's backends of the nodes' database: PgBouncer's (their pids are SHOW SERVERS' remote_pid, read
    before and after, so that one opened meanwhile is PgBouncer's too) and the direct ones, among them the nodes'
    listeners. A PgBouncer server connection carries the application_name of the last client it served (PgBouncer
    sets it), a listener's name too after a poll-only node's probe: only a direct backend is a listener."""

    def bouncer_pids() -> set[int]:
        bouncer_cursor.execute("SHOW SERVERS")
        names = [column.name for column in bouncer_cursor.description]
        return {row["remote_pid"] for row in map(lambda values: dict(zip(names, values)), bouncer_cursor.fetchall())}

    before = bouncer_pids()
    server_cursor.execute(BACKENDS)
    backends = server_cursor.fetchall()
    pooled = before | bouncer_pids()
    direct = [name or "" for pid, name in backends if pid not in pooled]
    listeners = collections.Counter(name for name in direct if name.startswith(LISTENER_PREFIX))
    return {
        "backends": len(backends),
        "pgbouncer_backends": len(backends) - len(direct),
        "direct_backends": len(direct),
        "listeners": sum(listeners.values()),
        "listeners_per_node": max(listeners.values(), default=0),
    }


TRANSACTIONS = f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{DATABASE}'"


class Sampler(threading.Thread):
    """Every SAMPLE_PERIOD: the server's backends of the nodes' database and PgBouncer's pool; every CLIENTS_PERIOD
    PgBouncer's clients by application_name. Keeps every sample; ``summary(t0, t1)`` gives peaks in a window."""

    def __init__(self, servers: Servers):
        super().__init__(name="scale-sampler", daemon=True)
        self.servers = servers
        self.samples: list[dict] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.failures = 0
        self.last_error = None

    def run(self) -> None:
        server = bouncer = None
        last_clients = 0.0
        while not self.stopping.is_set():
            try:
                if server is None:
                    server = connect(self.servers.admin_url)
                if bouncer is None:
                    bouncer = connect_bouncer(self.servers)
                sample = {"time": time.monotonic()}
                with server.cursor() as server_cursor, bouncer.cursor() as bouncer_cursor:
                    sample.update(_backends(server_cursor, bouncer_cursor))
                with bouncer.cursor() as cursor:
                    cursor.execute("SHOW POOLS")
                    names = [column.name for column in cursor.description]
                    for row in map(lambda values: dict(zip(names, values)), cursor.fetchall()):
                        if row["database"] == DATABASE:
                            sample["clients"] = row["cl_active"] + row["cl_waiting"]
                            sample["clients_waiting"] = row["cl_waiting"]
                            sample["servers"] = sum(row[key] for key in ("sv_active", "sv_idle", "sv_used",
                                                                         "sv_tested", "sv_login"))
                            sample["maxwait_s"] = row["maxwait"] + row.get("maxwait_us", 0) / 1e6
                    if time.monotonic() - last_clients >= CLIENTS_PERIOD:
                        last_clients = time.monotonic()
                        cursor.execute("SHOW CLIENTS")
                        names = [column.name for column in cursor.description]
                        per_name = collections.Counter(
                            row["application_name"] for row in map(lambda values: dict(zip(names, values)),
                                                                   cursor.fetchall())
                            if row["database"] == DATABASE)
                        sample["clients_per_name_max"] = max(per_name.values(), default=0)
                        sample["clients_per_name_top"] = per_name.most_common(1)
                with self.lock:
                    self.samples.append(sample)
            except Exception as e:  # noqa: BLE001 - a server under load may refuse one sample: count it, go on
                self.failures += 1
                self.last_error = repr(e)
                for connection in (server, bouncer):
                    if connection is not None:
                        with contextlib.suppress(Exception):
                            connection.close()
                server = bouncer = None
            self.stopping.wait(SAMPLE_PERIOD)
        for connection in (server, bouncer):
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)

    def summary(self, start: float, end: float) -> dict:
        with self.lock:
            window = [sample for sample in self.samples if start <= sample["time"] <= end]

        def peak(key):
            values = [sample[key] for sample in window if key in sample]
            return max(values) if values else None

        top = [sample["clients_per_name_top"] for sample in window if sample.get("clients_per_name_top")]
        return {
            "samples": len(window),
            "backends_peak": peak("backends"),
            "pgbouncer_backends_peak": peak("pgbouncer_backends"),
            "direct_backends_peak": peak("direct_backends"),
            "listeners_peak": peak("listeners"),
            "listeners_per_node_peak": peak("listeners_per_node"),
            "pgbouncer_clients_peak": peak("clients"),
            "pgbouncer_clients_waiting_peak": peak("clients_waiting"),
            "pgbouncer_servers_peak": peak("servers"),
            "pgbouncer_maxwait_s_peak": peak("maxwait_s"),
            "pgbouncer_clients_per_node_peak": peak("clients_per_name_max"),
            "pgbouncer_clients_per_node_top": max(top, key=lambda item: item[0][1])[0] if top else None,
        }


PGBOUNCER_TOTALS = ("total_xact_count", "total_query_count", "total_xact_time", "total_wait_time")


def _bouncer_totals(servers: Servers) -> dict[str, int]:
    """PgBouncer's running totals for the nodes' database (SHOW STATS: live counters; times in microseconds)."""
    totals = dict.fromkeys(PGBOUNCER_TOTALS, 0)
    for row in servers.bouncer.show("SHOW STATS"):
        if row["database"] == DATABASE:
            for key in PGBOUNCER_TOTALS:
                totals[key] += int(row[key])
    return totals


def _bouncer_window(before: dict, after: dict, server_transactions: int, seconds: float) -> dict:
    """What went through PgBouncer in a window: its clients' transactions (what the nodes sent), the mean time a
    transaction held a server connection and waited for one, and the server's transactions per client one
    (above 1: what PgBouncer adds, its ``SET application_name`` when a server connection changes client)."""
    xacts = after["total_xact_count"] - before["total_xact_count"]
    return {
        "client_transactions": xacts,
        "client_transactions_per_second": xacts / seconds if seconds else math.nan,
        "queries": after["total_query_count"] - before["total_query_count"],
        "xact_ms_mean": (after["total_xact_time"] - before["total_xact_time"]) / xacts / 1000 if xacts else math.nan,
        "wait_ms_mean": (after["total_wait_time"] - before["total_wait_time"]) / xacts / 1000 if xacts else math.nan,
        "server_per_client_transaction": server_transactions / xacts if xacts else math.nan,
    }


def _transactions(servers: Servers) -> int:
    with contextlib.closing(connect(servers.admin_url)) as connection, connection.cursor() as cursor:
        cursor.execute(TRANSACTIONS)
        return cursor.fetchone()[0]
