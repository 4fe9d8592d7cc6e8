"""The soak's own Postgres, with autovacuum off, and the chaos: a node SIGKILLed and restarted on a period."""

from __future__ import annotations

import contextlib
import threading
import time

from bench.servers import DATABASE, ROLE, connect

# Off, as in issue 47's soak: what keeps the churned tables small must then be the nodes' own VACUUMs
# (vacuum_interval), not the server's autovacuum.
POSTGRES_SETTINGS = {"autovacuum": "off", "max_connections": "100"}


class SoakPostgres:
    """A private Postgres (role and database ``scrapyd``, the tables' owner, so the nodes may VACUUM them)."""

    def start(self) -> SoakPostgres:
        from scrapyd_pgqueue.database import db
        from scrapyd_pgqueue.local import devdb

        self.postgres = devdb.LocalPostgres(settings=POSTGRES_SETTINGS)
        self.postgres.create()
        self.postgres.start()
        self.admin_url = self.postgres.url  # superuser: the bench's reads, never the nodes'
        with contextlib.closing(connect(self.admin_url)) as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {ROLE} LOGIN")
            cursor.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        self.url = f"postgresql://{ROLE}@127.0.0.1:{self.postgres.port}/{DATABASE}"
        self.admin_db_url = f"postgresql://postgres@127.0.0.1:{self.postgres.port}/{DATABASE}"
        # The schema once, before any node: three nodes would otherwise queue on the migration lock at start.
        db.get_engine(self.url, application_name="scrapyd-pgqueue-bench").dispose()
        return self

    def setting(self, name: str) -> str:
        with contextlib.closing(connect(self.admin_url)) as connection, connection.cursor() as cursor:
            cursor.execute("SELECT current_setting(%s)", (name,))
            return cursor.fetchone()[0]

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.postgres.remove()


class Chaos(threading.Thread):
    """Every ``period`` seconds, the next node in turn: out of the feeder's rotation (as a load balancer's health
    check would take it out), SIGKILLed alone (its crawls are orphaned, as after an OOM kill of the node), started
    again at once and back in rotation when ``daemonstatus.json`` answers. Each restart's times are kept: the slow
    calls of issue 47 came 0.2-3 s after the restarted node reported ready."""

    def __init__(self, cluster, feeder, period: float, end: float, log):
        super().__init__(name="soak-chaos", daemon=True)
        self.cluster, self.feeder, self.period, self.end, self.log = cluster, feeder, period, end, log
        self.restarts: list[dict] = []
        self.failures: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        turn = 0
        started = time.monotonic()
        while True:
            due = started + self.period * (turn + 1)
            if due >= self.end or self.stopping.wait(max(0.0, due - time.monotonic())):
                return
            node = self.cluster.nodes[turn % len(self.cluster.nodes)]
            turn += 1
            try:
                self.restarts.append(self._restart(node))
            except Exception as e:  # noqa: BLE001 - a node that does not come back is a finding, not a crash
                self.failures.append(f"{node.name}: {e}")
                self.log(f"soak: restart of {node.name} failed: {e}")

    def _restart(self, node) -> dict:
        self.feeder.take_out(node.name)
        drained = self.feeder.wait_idle(node.name, 5.0)  # calls in flight finish first: no error by our hand
        killed = time.time()
        old_pid = node.process.pid
        node.kill()
        node.start()
        node.wait_ready(120)
        ready = time.time()
        self.feeder.put_back(node.name)
        self.log(f"soak: {node.name} SIGKILLed (pid {old_pid}) and ready again in {ready - killed:.1f} s")
        return {"node": node.name, "killed": killed, "ready": ready, "old_pid": old_pid, "pid": node.process.pid,
                "in_flight_drained": drained}
