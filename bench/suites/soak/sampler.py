"""Samples, on a period, of what issue 47 watched grow: the churned tables (bytes, live and dead rows, VACUUMs),
the nodes' connections (pg_stat_activity by application_name) and each node's RSS."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from bench.servers import connect

TABLES = ("spider_job", "job_log", "scrapyd_node")
# Sizes of everything the table holds (its indexes and TOAST too), as the issue gave them.
TABLE_QUERY = """
SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup, vacuum_count, autovacuum_count
FROM pg_stat_user_tables WHERE relname = ANY(%s)
"""
# A node's sessions are named "scrapyd-pgqueue[-role] <node>" (database/db.py application_name).
CONNECTION_QUERY = """
SELECT application_name, count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'scrapyd-pgqueue%%'
  AND application_name <> 'scrapyd-pgqueue-bench' GROUP BY 1
"""


class Sampler(threading.Thread):
    def __init__(self, url: str, cluster, period: float):
        super().__init__(name="soak-sampler", daemon=True)
        self.url, self.cluster, self.period = url, cluster, period
        self.samples: list[dict] = []
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        # Half a period out of phase with the restarts (which fall on whole periods from the same start): a sample
        # taken as a node is SIGKILLed would see it without connections and its new process mid-start.
        self.sample()
        if self.stopping.wait(self.period / 2):
            return
        self.sample()
        while not self.stopping.wait(self.period):
            self.sample()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.sample()  # the end, after the drain

    def sample(self) -> None:
        try:
            with contextlib.closing(connect(self.url)) as connection, connection.cursor() as cursor:
                cursor.execute(TABLE_QUERY, (list(TABLES),))
                tables = {name: {"bytes": size, "live": live, "dead": dead, "vacuums": vacuums,
                                 "autovacuums": autovacuums}
                          for name, size, live, dead, vacuums, autovacuums in cursor.fetchall()}
                cursor.execute(CONNECTION_QUERY)
                sessions = cursor.fetchall()
        except Exception as e:  # noqa: BLE001 - a missed sample is reported, the soak goes on
            self.failures.append(f"{time.time():.0f}: {e}")
            return
        connections = {node.name: 0 for node in self.cluster.nodes}
        roles: dict[str, dict[str, int]] = {}
        for application, count in sessions:
            prefix, _, node = application.partition(" ")
            connections[node] = connections.get(node, 0) + count
            roles.setdefault(node, {})[prefix.removeprefix("scrapyd-pgqueue").lstrip("-") or "pool"] = count
        self.samples.append({
            "at": time.time(), "tables": tables, "connections": connections, "connection_roles": roles,
            "rss": {node.name: {"pid": node.process.pid, "bytes": rss(node.process.pid)}
                    for node in self.cluster.nodes if node.process is not None},
        })


def rss(pid: int) -> int | None:
    """Resident bytes of the node process alone (its crawls and warm processes are other processes)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None  # between a SIGKILL and the restart
    return None
