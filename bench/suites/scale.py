"""Scale: 100 real Scrapyd nodes behind PgBouncer, then 10 to 1,000 simulated nodes, on a Postgres of its own.

The suite runs its own servers (not the bench's database): for each part a private ``LocalPostgres`` with a small
``max_connections``, a role and a database ``scrapyd`` for the nodes (not a superuser, so Postgres's reserved
slots apply to them as in production), and ``LocalPgBouncer`` (transaction pooling, ``default_pool_size`` 20) in
front of it. Everything is removed at the end, whatever happens.

1. **Real nodes, poll-only** (series ``poll_only``): ``REAL_NODES`` real ``scrapyd`` processes (``LocalCluster``),
   ``database_url`` = PgBouncer, no ``listen_url``: each node finds that LISTEN does not work through a
   transaction pooler and runs poll-only. Postgres has ``max_connections = 50``. Nodes: ``max_proc 2``,
   ``poll_interval 1``, ``heartbeat_interval 5``, ``lease_seconds 30``, ``finished_to_keep`` 1000 (so that the
   rows of every job of the run are still there to read), the rest at their defaults.
2. **Real nodes, listeners direct** (series ``listeners_direct``): the same, with ``listen_url`` = Postgres itself,
   whose ``max_connections`` is raised to 150 (100 listeners + PgBouncer's 20 + reserve), and Scrapyd's default
   ``poll_interval`` 5 s: with NOTIFY waking the nodes, polling is only the floor (as the README advises).

   For each: all nodes started at once (start-up time: first start to last ``daemonstatus.json`` answer; a node
   that fails to start is retried once on another port, and counted), one ``listspiders.json`` per node (Scrapyd
   runs ``scrapy list`` once per node and caches it; a few at a time, see WARMUP_THREADS), then until every node
   said it runs poll-only (1) or every listener is connected (2). Idle for ``idle_seconds``: the cluster's
   transactions from ``pg_stat_database`` (``xact_commit + xact_rollback`` of database ``scrapyd``; every
   autocommit statement is one transaction; a backend reports its counts at most once a second, so the window is
   long), and, sampled every 0.5 s, the server's backends of that database (``pg_stat_activity``), PgBouncer's
   clients and server connections (``SHOW POOLS``) and, every few seconds, PgBouncer's clients per node
   (``SHOW CLIENTS`` by application_name): the budget. Then ``jobs`` jobs (``sleeper``, ``seconds=0.2``, unique
   job ids) are POSTed to ``schedule.json`` of random nodes by a pool of threads, each request timed, with at
   most ``in_flight`` jobs scheduled and not yet terminated (see ``Sizes.in_flight``: 200 crawls at once would not
   fit in this machine's memory next to 100 nodes). Then it waits until every job is terminated in
   ``spider_job`` and reads: each job's row (``start_time`` = the launcher's spawn time, naive local time, the
   same clock as the bench) and the crawls' ``runs.jsonl`` (``EXAMPLE_RECORD_DIR``: one line per crawl, written
   when the spider object exists, after ~0.4 s of Scrapy start-up). Latencies are from the ``schedule.json``
   response: to the spawn (row) and to the spider (runs.jsonl), signed. Jobs run exactly once: each of the
   jobs has exactly one line in runs.jsonl. Connection errors: lines of every node's log (and of the crawls'
   logs) matching CONNECTION_ERRORS.
3. **Simulated nodes** (series ``simulated``): lightweight nodes that send a node's real statements through the
   package's store (no SQL of their own), through PgBouncer, to a Postgres with ``max_connections = 50``. Each
   simulated node has its own engine (``scrapyd_pgqueue.store.db.get_engine``, pool of 2, no overflow, its two
   connections opened at start as a busy node's pool ends up) on a URL of its own (``?application_name=sim-<n>``,
   so PgBouncer sees one client per connection, named), and does what ``PostgresLauncher`` and
   ``PostgresPoller`` do: ``register_node``; every ``heartbeat_interval`` (5 s) the node's tick, ``node_tick``
   (heartbeat, and once healthy for ``lease_seconds`` lease recovery, hand-back of forgotten claims, cancel
   requests, egg catalogue, next periodic due time: one statement, as ``LeaseKeeper``); every ``poll_interval`` (1 s), when
   it has a free slot of its 2, ``claim_next_jobs(["example"], free, node=..., worker=...)``; for each claimed
   job ``mark_started``, a hold of HOLD_SECONDS (the "crawl"), then ``finish_job(..., claimed=..., worker=...)``
   and ``prune_terminated(100)`` (``PostgresJobStorage.add``), and a claim at once for the freed slot (as the
   poller's ``next()``). Nodes run in ``sim_processes`` processes (multiprocessing spawn: the bench process
   imports no reactor), each with a timer thread and a pool of ``sim_threads`` threads. The count steps up
   (10, 100, 300, 1,000; quick: 10, 50) while a feeder thread of the bench enqueues a steady trickle of jobs
   (``JobStore.enqueue`` through PgBouncer), and each step is measured over ``sim_window_seconds`` after
   ``sim_settle_seconds``: server transactions/s, client operations/s (the store calls of the simulated nodes and
   the feeder) and their ratio, backends (peak), PgBouncer's clients and waiting clients, claim latency (measured
   around ``claim_next_jobs`` in the simulated node's thread: pool checkout, PgBouncer, Postgres, and the
   simulator's own GIL and CPU), heartbeat latency, timer lateness of the claim ticks, errors
   (``scrapyd_pgqueue.store.db.DatabaseError``, and anything else separately), and the CPU used by the simulator,
   Postgres, PgBouncer and the whole machine (``/proc``): on 2 cores, the simulator competes with Postgres.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import heapq
import itertools
import json
import math
import multiprocessing
import os
import queue as queue_module
import random
import re
import subprocess
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import report
from bench.context import Context
from bench.stats import summarise

SUMMARY = ("100 real Scrapyd nodes behind PgBouncer (poll-only, then listeners direct) and 10 to 1,000 simulated "
           "nodes: server connections and transactions, schedule.json and claim latency")
SERIES = ("poll_only", "listeners_direct", "simulated")

PROJECT, SPIDER, JOB_SECONDS = "example", "sleeper", "0.2"
MAX_PROC = 2
HEARTBEAT_INTERVAL = 5.0
LEASE_SECONDS = 30.0
MAX_ATTEMPTS = 3
POOL_SIZE = 2  # database_pool_size, the product's default
FINISHED_TO_KEEP = 1000  # real nodes: keep every job's row of the run (the default 100 would prune them)
SIM_FINISHED_TO_KEEP = 100  # simulated nodes prune as a default node does
ROLE = DATABASE = "scrapyd"
PGBOUNCER_POOL = 20
REAL_MAX_CLIENT_CONN = 400
MODES = {
    # series: (listeners direct?, poll_interval, Postgres max_connections)
    "poll_only": (False, 1.0, 50),
    "listeners_direct": (True, 5.0, 150),
}
SIM_POLL_INTERVAL = 1.0
SIM_MAX_CONNECTIONS = 50
HOLD_SECONDS = 0.5  # a simulated crawl holds its slot this long
SLOW_MS = 1000.0  # a store call at least this long is counted as slow, by kind
SAMPLE_PERIOD = 0.5  # pg_stat_activity and SHOW POOLS
# A backend reports its transaction counts at most once a second while busy, and up to 10 s late once idle
# (Postgres's idle flush): a window that starts right after a burst (nodes starting, `scrapy list` on every node,
# simulated nodes connecting) would count part of it. Every window starts this long after the last burst.
STATS_QUIET_SECONDS = 11.0
CLIENTS_PERIOD = 3.0  # SHOW CLIENTS (one row per client: 2,000 at 1,000 simulated nodes)
RANDOM_SEED = 20261123
POLL_ONLY_LINE = "this node runs poll-only"
# Lines of a node's (or a crawl's) log that say a connection to the database failed or was refused. The package's
# own messages: a refused connection it waits for ("refused a connection, waiting", with the server's reason), a
# failed heartbeat or claim, a lost listener, any DatabaseError text ("database at host:port/db: reason"); the
# servers' and libpq's: too many clients, reserved slots, PgBouncer's max_client_conn, could not connect, refused.
CONNECTION_ERRORS = {
    "too many clients": r"too many clients",
    "remaining connection slots": r"remaining connection slots",
    "too many connections": r"too many connections",
    "no more connections allowed": r"no more connections allowed",
    "could not connect": r"could not connect",
    "connection refused": r"connection refused",
    "refused a connection, waiting": r"refused a connection",
    "server closed the connection": r"server closed the connection",
    "pgbouncer cannot connect": r"pgbouncer cannot connect",
    "Heartbeat failed": r"Heartbeat failed",
    "Claiming jobs failed": r"Claiming jobs failed",
    "listener lost its connection": r"lost its connection",
    "no answer within": r"no answer within",
    "pool stayed busy": r"stayed busy for",
}
# Other lines worth a look (not connection errors): counted and sampled in the notes.
OTHER_PROBLEMS = r"Traceback|Unhandled|Could not|failed|\bERROR\b|\[-\] .*Error"


@dataclass(frozen=True)
class Sizes:
    real_nodes: int
    jobs: int
    # Jobs scheduled and not yet terminated, at most. 100 nodes x max_proc 2 = 200 slots; a crawl process is ~90 MB
    # and a node ~100 MB, so 200 crawls at once next to 100 nodes would need ~28 GB of this 24 GB machine. The cap
    # is below the slots, so a job always finds a free slot: latency is wake-up + claim + spawn, not queueing. Every
    # crawl costs ~1.1 s of CPU (Scrapy's start-up): on 2 cores, 16 in flight already queue for the CPU (32 did: ~9 s
    # from response to spider), and fewer would not finish sooner (the phase is CPU-bound either way).
    in_flight: int
    idle_seconds: float
    schedule_threads: int
    warmup_threads: int  # listspiders.json at once (each runs `scrapy list`, ~1 s of CPU and ~80 MB)
    start_timeout: float
    jobs_timeout: float
    wait_for_lease: bool  # idle window only once every node has been up for a lease (it then recovers leases too)
    sim_steps: tuple[int, ...]
    sim_processes: int
    sim_threads: int
    sim_settle_seconds: float
    sim_window_seconds: float
    sim_jobs_per_second: float


SIZES = {
    "quick": Sizes(real_nodes=5, jobs=30, in_flight=6, idle_seconds=8.0, schedule_threads=8, warmup_threads=5,
                   start_timeout=120.0, jobs_timeout=180.0, wait_for_lease=False,
                   sim_steps=(10, 50), sim_processes=2, sim_threads=8, sim_settle_seconds=STATS_QUIET_SECONDS,
                   sim_window_seconds=8.0, sim_jobs_per_second=5.0),
    "full": Sizes(real_nodes=100, jobs=300, in_flight=16, idle_seconds=30.0, schedule_threads=16, warmup_threads=8,
                  start_timeout=300.0, jobs_timeout=900.0, wait_for_lease=True,
                  sim_steps=(10, 100, 300, 1000), sim_processes=8, sim_threads=16,
                  sim_settle_seconds=STATS_QUIET_SECONDS,
                  sim_window_seconds=30.0, sim_jobs_per_second=20.0),
}


def run(ctx: Context) -> dict:
    sizes = SIZES[ctx.profile.name]
    series = {}
    # Each part on its own: one that fails is recorded (its traceback in "failed") and the others still run.
    for name, (direct, poll_interval, max_connections) in MODES.items():
        try:
            series[name] = _real_mode(ctx, sizes, name, direct, poll_interval, max_connections)
        except Exception:  # noqa: BLE001 - recorded and shown; the servers and nodes were removed
            ctx.log(f"scale: {name} failed:\n{traceback.format_exc()}")
            series[name] = {"mode": name, "nodes": sizes.real_nodes, "failed": traceback.format_exc()[-4000:]}
    try:
        series["simulated"] = _simulate(ctx, sizes)
    except Exception:  # noqa: BLE001 - as above
        ctx.log(f"scale: simulated failed:\n{traceback.format_exc()}")
        series["simulated"] = {"points": [], "failed": traceback.format_exc()[-4000:]}
    targets = [
        report.target(f"connection errors in node logs, {name}", _get(series[name], "errors", "connection_errors"),
                      "<=", 0, f"{series[name]['nodes']} real nodes") for name in MODES
    ] + [
        report.target(f"jobs not run exactly once, {name}", _get(series[name], "jobs", "not_exactly_once"), "<=", 0,
                      f"of {_get(series[name], 'jobs', 'count')}") for name in MODES
    ] + [
        report.target(f"simulated node errors, {point['nodes']:,} nodes", point["errors"] + point["errors_adding"],
                      "<=", 0, "in the window + while adding the step's nodes")
        for point in series["simulated"]["points"]
    ]
    return {
        "parameters": {
            "sizes": asdict(sizes),
            "max_proc": MAX_PROC,
            "heartbeat_interval": HEARTBEAT_INTERVAL,
            "lease_seconds": LEASE_SECONDS,
            "database_pool_size": POOL_SIZE,
            "pgbouncer_pool_size": PGBOUNCER_POOL,
            "modes": {name: {"listen_url": direct, "poll_interval": poll, "max_connections": maximum}
                      for name, (direct, poll, maximum) in MODES.items()},
            "sim_poll_interval": SIM_POLL_INTERVAL,
            "sim_max_connections": SIM_MAX_CONNECTIONS,
            "sim_hold_seconds": HOLD_SECONDS,
            "job": {"project": PROJECT, "spider": SPIDER, "seconds": JOB_SECONDS},
        },
        "series": series,
        "ratios": _ratios(series),
        "targets": targets,
        "notes": _notes(series, sizes),
    }


# --- servers -----------------------------------------------------------------------------------------------------


class Servers:
    """A private Postgres (role and database ``scrapyd``) and PgBouncer in front of it; ``remove()`` ends both."""

    def __init__(self, max_connections: int, max_client_conn: int, log):
        self.max_connections = max_connections
        self.max_client_conn = max_client_conn
        self.log = log
        self.postgres = None
        self.bouncer = None
        self.fd_limit = None

    def start(self) -> Servers:
        from scrapyd_pgqueue.store import db
        from scrapyd_pgqueue.local import devdb

        self.postgres = devdb.LocalPostgres(settings={"max_connections": str(self.max_connections)})
        self.postgres.create()
        self.postgres.start()
        self.admin_url = self.postgres.url  # superuser, database postgres: the bench's reads, never the nodes'
        with contextlib.closing(_connect(self.admin_url)) as connection, connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {ROLE} LOGIN")
            cursor.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        self.direct_url = f"postgresql://{ROLE}@127.0.0.1:{self.postgres.port}/{DATABASE}"
        # The schema, once, before any node: 100 nodes would otherwise queue on the migration lock.
        db.get_engine(self.direct_url, application_name="scrapyd-pgqueue-bench").dispose()
        self.bouncer = devdb.LocalPgBouncer(self.direct_url, pool_size=PGBOUNCER_POOL,
                                            max_client_conn=self.max_client_conn)
        self.bouncer.start()
        self.fd_limit = self._raise_fd_limit()
        self.url = self.bouncer.url
        return self

    def _raise_fd_limit(self) -> dict:
        """A guard: PgBouncer needs about max_client_conn open files, and only logs "kernel file descriptor limit:
        1024 ... max expected fd use: ..." when it has fewer (2,000 clients then fail to connect). devdb starts it
        with this process's limit (20,000 here); started through runuser it got 1,024. A service manager sets it
        with LimitNOFILE. Raised here (soft limit up to the hard one, as PgBouncer's user) only if too low."""
        pid = self.bouncer_pid()
        needed = self.max_client_conn + 2 * PGBOUNCER_POOL + 64
        before = _open_files_limit(pid)
        if before is not None and before[0] < needed:
            soft = min(needed, before[1])
            command = ["prlimit", f"--pid={pid}", f"--nofile={soft}:{before[1]}"]
            if os.geteuid() == 0:
                command = ["runuser", "-u", "postgres", "--", *command]
            completed = subprocess.run(command, capture_output=True, text=True, timeout=10)
            if completed.returncode != 0:
                self.log(f"scale: could not raise PgBouncer's open files limit: {completed.stderr.strip()}")
        return {"before": before, "after": _open_files_limit(pid), "needed": needed}

    def bouncer_pid(self) -> int | None:
        if self.bouncer is None or self.bouncer.process is None:
            return None
        children = _children().get(self.bouncer.process.pid, [])  # started through runuser: its child
        return children[0] if children else self.bouncer.process.pid

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.postgres.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError, AttributeError):
            return None

    def remove(self) -> None:
        for server in (self.bouncer, self.postgres):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.remove()


def _connect(url: str):
    import psycopg2
    from sqlalchemy import make_url

    parsed = make_url(url)
    connection = psycopg2.connect(host=parsed.host, port=parsed.port, user=parsed.username,
                                  dbname=parsed.database, application_name="scrapyd-pgqueue-bench")
    connection.autocommit = True
    return connection


def _connect_bouncer(servers: Servers):
    """PgBouncer's admin console (SHOW ...)."""
    import psycopg2

    connection = psycopg2.connect(host="127.0.0.1", port=servers.bouncer.port, user="postgres", dbname="pgbouncer")
    connection.autocommit = True
    return connection


def _open_files_limit(pid) -> tuple[int, int] | None:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    except (OSError, ValueError):
        pass
    return None


# --- CPU accounting from /proc ---------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, own CPU ticks, reaped children's CPU ticks) of a process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is the state (field 3)
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _all_stats() -> dict[int, tuple[int, int, int]]:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None:
                stats[int(entry)] = stat
    return stats


def _children(stats=None) -> dict[int, list[int]]:
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in (stats or _all_stats()).items():
        children[ppid].append(pid)
    return children


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each group of process trees: each root's own and reaped children's time, plus
    its live descendants' own time (a child that exits and is reaped moves from the second to the first)."""
    stats = _all_stats()
    children = _children(stats)
    result = {}
    for name, roots in groups.items():
        ticks = 0
        for root in roots:
            if root is None or root not in stats:
                continue
            ticks += stats[root][1] + stats[root][2]
            stack = list(children.get(root, ()))
            while stack:
                pid = stack.pop()
                ticks += stats[pid][1]
                stack.extend(children.get(pid, ()))
        result[name] = ticks / CLOCK_TICKS
    result["machine_busy"] = _machine_busy_seconds()
    return result


def _machine_busy_seconds() -> float:
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def cpu_cores(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Cores used by each group between two ``cpu_seconds`` readings (1.0 = one core busy)."""
    return {name: (after[name] - before[name]) / seconds for name in after if name in before} if seconds > 0 else {}


# --- sampling connections ----------------------------------------------------------------------------------------

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
                    server = _connect(self.servers.admin_url)
                if bouncer is None:
                    bouncer = _connect_bouncer(self.servers)
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
    with contextlib.closing(_connect(servers.admin_url)) as connection, connection.cursor() as cursor:
        cursor.execute(TRANSACTIONS)
        return cursor.fetchone()[0]


# --- real nodes ----------------------------------------------------------------------------------------------------


def _real_mode(ctx: Context, sizes: Sizes, name: str, direct: bool, poll_interval: float,
               max_connections: int) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    servers = Servers(max_connections, REAL_MAX_CLIENT_CONN, ctx.log)
    sampler = cluster = None
    result = {"mode": name, "nodes": sizes.real_nodes, "listen_url": direct, "poll_interval": poll_interval,
              "max_connections": max_connections}
    try:
        servers.start()
        result["pgbouncer_open_files"] = servers.fd_limit
        sampler = Sampler(servers)
        sampler.start()
        config = {
            "max_proc": str(MAX_PROC),
            "poll_interval": f"{poll_interval:g}",
            "heartbeat_interval": f"{HEARTBEAT_INTERVAL:g}",
            "lease_seconds": f"{LEASE_SECONDS:g}",
            "finished_to_keep": str(FINISHED_TO_KEEP),
        }
        if direct:
            config["listen_url"] = servers.direct_url
        record_dir = ctx.workdir / f"scale-{name}-runs"
        cluster = LocalCluster(servers.url, sizes.real_nodes, directory=ctx.workdir / f"scale-{name}",
                               config=config, env={"EXAMPLE_RECORD_DIR": str(record_dir)})
        ctx.log(f"scale: {name}: starting {sizes.real_nodes} nodes (PgBouncer {servers.url.split('@')[-1]}, "
                f"Postgres max_connections {max_connections}, poll_interval {poll_interval:g}"
                f"{', listen_url direct' if direct else ', poll-only'})")
        result["start"] = _start_nodes(ctx, cluster, sizes.start_timeout)
        all_ready = time.monotonic()
        ctx.log(f"scale: {name}: {len(cluster.nodes)} nodes up in {result['start']['seconds']:.1f} s "
                f"(retried: {result['start']['retried']}); listspiders.json on each")
        result["warmup_seconds"] = _warm_up(cluster, sizes.warmup_threads)
        result["settle"] = _settle(ctx, cluster, servers, direct)
        # Every node healthy for a lease (it then recovers others' leases every heartbeat), and the warm-up's
        # counts reported (STATS_QUIET_SECONDS).
        ready_at = time.monotonic() + STATS_QUIET_SECONDS
        if sizes.wait_for_lease:
            ready_at = max(ready_at, all_ready + LEASE_SECONDS + HEARTBEAT_INTERVAL)
        time.sleep(max(0.0, ready_at - time.monotonic()))
        ctx.log(f"scale: {name}: idle for {sizes.idle_seconds:g} s")
        result["idle"] = _measure_idle(servers, sampler, cluster, sizes.idle_seconds)
        ctx.log(f"scale: {name}: idle {result['idle']['transactions_per_second']:.0f} transactions/s, peak "
                f"{result['idle']['backends_peak']} backends; {sizes.jobs} jobs")
        result["jobs"] = _run_jobs(ctx, cluster, servers, sampler, sizes, name, record_dir)
        jobs = result["jobs"]
        ctx.log(f"scale: {name}: {jobs['exactly_once']}/{jobs['count']} jobs ran once; schedule.json p50 "
                f"{jobs['schedule_ms']['p50']:.0f} ms; response->spawn p50 {jobs['to_spawn_ms']['p50']:.0f} ms")
    finally:
        if sampler is not None:
            sampler.stop()
        if cluster is not None:
            ctx.log(f"scale: {name}: stopping the nodes")
            cluster.stop()
        servers.remove()
    if cluster is not None:
        result["errors"] = _scan_logs(cluster)
        result["poll_only_lines"] = result["errors"].pop("poll_only_lines")
    result["sampler_failures"] = sampler.failures if sampler is not None else None
    return result


def _start_nodes(ctx: Context, cluster, timeout: float) -> dict:
    """Start every node at once and wait for each; a node that fails is retried once on another port."""
    from scrapyd_pgqueue.local.devdb import free_port

    started = time.monotonic()
    deadline = started + timeout
    for node in cluster.nodes:
        node.start()
    retried, failures = [], []
    for node in cluster.nodes:
        try:
            node.wait_ready(max(1.0, deadline - time.monotonic()))
        except RuntimeError as e:
            reason = _last_line(str(e))
            ctx.log(f"scale: node {node.name} did not start ({reason}); retrying once on another port")
            retried.append({"node": node.name, "reason": reason})
            node.stop()
            node.port = free_port()
            node.url = f"http://127.0.0.1:{node.port}/"
            node.start()
            try:
                node.wait_ready(max(30.0, deadline - time.monotonic()))
            except RuntimeError as again:
                failures.append({"node": node.name, "reason": _last_line(str(again))})
    if failures:
        raise RuntimeError(f"scale: nodes did not start: {failures}")
    return {"seconds": time.monotonic() - started, "retried": len(retried), "retries": retried}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _warm_up(cluster, threads: int) -> float:
    """One listspiders.json per node: Scrapyd runs `scrapy list` once per node and caches it."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for answer in pool.map(lambda node: node.get("listspiders.json", timeout=300, project=PROJECT),
                               cluster.nodes):
            if SPIDER not in answer.get("spiders", ()):
                raise RuntimeError(f"scale: spider {SPIDER} not in project {PROJECT}: {answer}")
    return time.monotonic() - started


def _settle(ctx: Context, cluster, servers: Servers, direct: bool, timeout: float = 120.0) -> dict:
    """Until every node runs poll-only (said in its log) or every listener is connected (pg_stat_activity)."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if direct:
            with contextlib.closing(_connect(servers.admin_url)) as connection, connection.cursor() as cursor, \
                    contextlib.closing(_connect_bouncer(servers)) as bouncer, bouncer.cursor() as bouncer_cursor:
                done = _backends(cursor, bouncer_cursor)["listeners"]
        else:
            done = sum(_count_lines(node.logfile, POLL_ONLY_LINE) for node in cluster.nodes)
        if done >= len(cluster.nodes):
            return {"seconds": time.monotonic() - started, "ready": done}
        if time.monotonic() > deadline:
            what = "listeners connected" if direct else "nodes said they run poll-only"
            ctx.log(f"scale: only {done} of {len(cluster.nodes)} {what} after {timeout:g} s; measuring anyway")
            return {"seconds": time.monotonic() - started, "ready": done}
        time.sleep(0.5)


def _count_lines(path: Path, needle: str) -> int:
    try:
        return sum(1 for line in path.read_text(errors="replace").splitlines() if needle in line)
    except OSError:
        return 0


def _cpu_groups_real(servers: Servers, cluster) -> dict[str, list[int]]:
    return {
        "nodes": [node.process.pid for node in cluster.nodes if node.process is not None],
        "postgres": [servers.postmaster_pid()],
        "pgbouncer": [servers.bouncer_pid()],
    }


def _measure_idle(servers: Servers, sampler: Sampler, cluster, seconds: float) -> dict:
    groups = _cpu_groups_real(servers, cluster)
    first_bouncer = _bouncer_totals(servers)
    first_transactions, first_cpu, start = _transactions(servers), cpu_seconds(groups), time.monotonic()
    time.sleep(seconds)
    last_transactions, last_cpu, end = _transactions(servers), cpu_seconds(groups), time.monotonic()
    last_bouncer = _bouncer_totals(servers)
    window = end - start
    transactions = last_transactions - first_transactions - 1  # the first reading's own transaction
    return {
        "pgbouncer": _bouncer_window(first_bouncer, last_bouncer, transactions, window),
        "window_seconds": window,
        "transactions": transactions,
        "transactions_per_second": transactions / window,
        "transactions_per_second_per_node": transactions / window / len(cluster.nodes),
        "cpu_cores": cpu_cores(first_cpu, last_cpu, window),
        **sampler.summary(start, end),
    }


def _run_jobs(ctx: Context, cluster, servers: Servers, sampler: Sampler, sizes: Sizes, name: str,
              record_dir: Path) -> dict:
    chooser = random.Random(RANDOM_SEED)
    jobs = [f"scale-{name}-{index:04d}-{uuid.uuid4().hex[:6]}" for index in range(sizes.jobs)]
    targets = {job: chooser.choice(cluster.nodes) for job in jobs}
    requests: dict[str, dict] = {}
    slots = threading.BoundedSemaphore(sizes.in_flight)
    released: set[str] = set()
    lock = threading.Lock()
    stopping = threading.Event()

    def release(job):
        with lock:
            if job in released:
                return
            released.add(job)
        slots.release()

    def schedule(job):
        node = targets[job]
        sent = time.perf_counter()
        try:
            answer = node.post("schedule.json", timeout=120, project=PROJECT, spider=SPIDER, jobid=job,
                               seconds=JOB_SECONDS)
            error = None if answer.get("status") == "ok" else str(answer)[:300]
        except Exception as e:  # noqa: BLE001 - counted: a refused or failed request is a result
            error = f"{type(e).__name__}: {e}"[:300]
        requests[job] = {"node": node.name, "ms": (time.perf_counter() - sent) * 1000, "error": error,
                         "responded": time.time(), "responded_local": datetime.datetime.now()}
        if error is not None:
            release(job)

    def watch():  # frees a slot for every job terminated in spider_job
        with contextlib.closing(_connect(servers.direct_url)) as connection, connection.cursor() as cursor:
            while not stopping.is_set():
                cursor.execute("SELECT job FROM spider_job WHERE status = 'terminated' AND job = ANY(%s)", (jobs,))
                for (job,) in cursor.fetchall():
                    release(job)
                stopping.wait(0.2)

    groups = _cpu_groups_real(servers, cluster)
    first_bouncer = _bouncer_totals(servers)
    first_transactions, first_cpu, start = _transactions(servers), cpu_seconds(groups), time.monotonic()
    watcher = threading.Thread(target=watch, name="scale-watch", daemon=True)
    watcher.start()
    deadline = start + sizes.jobs_timeout
    try:
        with concurrent.futures.ThreadPoolExecutor(sizes.schedule_threads) as pool:
            for job in jobs:
                if not slots.acquire(timeout=max(1.0, deadline - time.monotonic())):
                    ctx.log(f"scale: {name}: in-flight jobs did not terminate within {sizes.jobs_timeout:g} s; "
                            "the rest are not scheduled")
                    for left in jobs[jobs.index(job):]:
                        requests[left] = {"node": targets[left].name, "ms": math.nan, "responded": math.nan,
                                          "responded_local": None, "error": "not scheduled: deadline passed"}
                    break
                pool.submit(schedule, job)
        scheduled = time.monotonic()
        while len(released) < len(jobs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        stopping.set()
        watcher.join(5)
    end = time.monotonic()
    last_transactions, last_cpu = _transactions(servers), cpu_seconds(groups)
    last_bouncer = _bouncer_totals(servers)
    rows = _job_rows(servers, jobs)
    runs = _read_runs(record_dir)
    return _job_figures(jobs, requests, rows, runs, sampler.summary(start, end), {
        "seconds": end - start,
        "scheduling_seconds": scheduled - start,
        "transactions_per_second": (last_transactions - first_transactions - 1) / (end - start),
        "pgbouncer": _bouncer_window(first_bouncer, last_bouncer, last_transactions - first_transactions - 1,
                                     end - start),
        "cpu_cores": cpu_cores(first_cpu, last_cpu, end - start),
        "in_flight_cap": sizes.in_flight,
        "threads": sizes.schedule_threads,
        "unterminated_at_deadline": len(jobs) - len(released),
    })


def _job_rows(servers: Servers, jobs: list[str]) -> dict[str, dict]:
    with contextlib.closing(_connect(servers.direct_url)) as connection, connection.cursor() as cursor:
        cursor.execute("""
            SELECT job, status, outcome, node, attempts, start_time, end_time FROM spider_job WHERE job = ANY(%s)
        """, (jobs,))
        names = [column.name for column in cursor.description]
        rows = collections.defaultdict(list)
        for values in cursor.fetchall():
            row = dict(zip(names, values))
            rows[row["job"]].append(row)
    return rows


def _read_runs(record_dir: Path) -> list[dict]:
    path = record_dir / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _job_figures(jobs, requests, rows, runs, peaks, extra) -> dict:
    wanted = set(jobs)
    ran = collections.Counter(run["job"] for run in runs if run.get("job") in wanted)
    started = {}
    for run in runs:
        if run.get("job") in wanted:
            started.setdefault(run["job"], run["started"])
    ok = [job for job in jobs if requests.get(job, {}).get("error") is None and job in requests]
    to_spawn, to_spider = [], []
    for job in ok:
        job_rows = rows.get(job, [])
        if len(job_rows) == 1 and job_rows[0]["start_time"] is not None:
            to_spawn.append((job_rows[0]["start_time"] - requests[job]["responded_local"]).total_seconds() * 1000)
        if job in started:
            to_spider.append((started[job] - requests[job]["responded"]) * 1000)
    outcomes = collections.Counter(str(row["outcome"]) for job in jobs for row in rows.get(job, []))
    errors = [requests[job]["error"] for job in jobs if requests.get(job, {}).get("error")]
    return {
        "count": len(jobs),
        "schedule_errors": len(errors),
        "schedule_error_samples": errors[:5],
        "exactly_once": sum(1 for job in jobs if ran[job] == 1),
        "not_exactly_once": sum(1 for job in jobs if ran[job] != 1),
        "never_ran": sum(1 for job in jobs if ran[job] == 0),
        "ran_more_than_once": sum(1 for job in jobs if ran[job] > 1),
        "terminated": sum(1 for job in jobs if any(row["status"] == "terminated" for row in rows.get(job, []))),
        "rows_per_job_max": max((len(rows.get(job, [])) for job in jobs), default=0),
        "claimed_more_than_once": sum(1 for job in jobs for row in rows.get(job, []) if row["attempts"] > 1),
        "outcomes": dict(outcomes),
        "ran_on_scheduling_node": sum(1 for job in ok if rows.get(job) and rows[job][0]["node"] == requests[job]["node"]),
        "schedule_ms": summarise([requests[job]["ms"] for job in ok]),
        "to_spawn_ms": summarise(to_spawn),
        "to_spider_ms": summarise(to_spider),
        "to_spawn_ms_values": sorted(to_spawn),
        "to_spider_ms_values": sorted(to_spider),
        **peaks,
        **extra,
    }


def _scan_logs(cluster) -> dict:
    """Connection errors (CONNECTION_ERRORS) and other problem lines in every node's log and its crawls' logs."""
    patterns = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in CONNECTION_ERRORS.items()}
    other = re.compile(OTHER_PROBLEMS)
    counts = collections.Counter()
    samples: list[str] = []
    other_count, other_samples = 0, []
    nodes_with_errors = set()
    poll_only = lines_matched = 0
    for node in cluster.nodes:
        files = [node.logfile, *sorted((node.directory / "logs").rglob("*.log"))]
        for path in files:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                if POLL_ONLY_LINE in line:
                    poll_only += 1
                    continue
                matched = [name for name, pattern in patterns.items() if pattern.search(line)]
                if matched:
                    lines_matched += 1
                    counts.update(matched)
                    nodes_with_errors.add(node.name)
                    if len(samples) < 8:
                        samples.append(f"{node.name}/{path.name}: {line.strip()[:300]}")
                elif other.search(line):
                    other_count += 1
                    if len(other_samples) < 8:
                        other_samples.append(f"{node.name}/{path.name}: {line.strip()[:300]}")
    return {
        "connection_errors": lines_matched,  # lines: a line matching two patterns counts once
        "by_pattern": dict(counts),
        "nodes_with_errors": len(nodes_with_errors),
        "samples": samples,
        "other_problem_lines": other_count,
        "other_samples": other_samples,
        "poll_only_lines": poll_only,
    }


# --- simulated nodes: the bench's side ---------------------------------------------------------------------------


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
        from scrapyd_pgqueue.store import db
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


def _simulate(ctx: Context, sizes: Sizes) -> dict:
    steps = sizes.sim_steps
    servers = Servers(SIM_MAX_CONNECTIONS, max(REAL_MAX_CLIENT_CONN, max(steps) * POOL_SIZE + 200), ctx.log)
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
                      "finished_to_keep": SIM_FINISHED_TO_KEEP}
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
    with contextlib.closing(_connect(servers.direct_url)) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM spider_job WHERE status = 'pending'")
        pending = cursor.fetchone()[0]
    merged = _merge_stats(stats.values())
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


def _merge_stats(parts) -> dict:
    merged = {"operations": collections.Counter(), "claim_ms": [], "heartbeat_ms": [], "tick_late_ms": [],
              "claims_with_jobs": 0, "jobs_claimed": 0, "jobs_finished": 0, "errors": collections.Counter(),
              "error_samples": [], "slow": collections.Counter()}
    for part in parts:
        merged["operations"].update(part["operations"])
        for key in ("claim_ms", "heartbeat_ms", "tick_late_ms", "error_samples"):
            merged[key] += part[key]
        for key in ("claims_with_jobs", "jobs_claimed", "jobs_finished"):
            merged[key] += part[key]
        merged["errors"].update(part["errors"])
        merged["slow"].update(part["slow"])
    merged["slow"] = dict(merged["slow"])
    merged["operations"] = dict(merged["operations"])
    merged["errors"] = dict(merged["errors"])
    return merged


# --- simulated nodes: the simulation processes ------------------------------------------------------------------


def simulate(index: int, url: str, parameters: dict, commands, results) -> None:
    """A simulation process's body (spawned): simulated nodes added on command, statistics per window."""
    simulation = None
    try:
        simulation = Simulation(url, parameters)
        results.put(("ready", index, None))
        while True:
            command, payload = commands.get()
            if command == "add":
                results.put(("added", index, simulation.add(payload)))
            elif command == "start":
                # What happened since the last window (adding nodes: connects, registrations) is kept, not lost.
                between = simulation.stats.take(len(simulation.nodes), parameters["poll_interval"],
                                                parameters["heartbeat_interval"])
                simulation.stats.reset()
                results.put(("started", index, {key: between[key] for key in ("errors", "error_samples", "slow")}))
            elif command == "end":
                results.put(("stats", index, simulation.stats.take(
                    len(simulation.nodes), parameters["poll_interval"], parameters["heartbeat_interval"])))
            elif command == "stop":
                break
    except BaseException:  # noqa: BLE001 - reported to the bench, which raises it
        results.put(("error", index, traceback.format_exc()))
    finally:
        if simulation is not None:
            simulation.stop()
        # No interpreter teardown of hundreds of engines and threads; the queue's feeder thread is flushed first.
        results.close()
        results.join_thread()
        os._exit(0)


class Stats:
    """What the simulated nodes of one process did since the last reset (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.since = time.monotonic()
            self.operations = collections.Counter()
            self.claim_ms, self.heartbeat_ms, self.tick_late_ms = [], [], []
            self.claims_with_jobs = self.jobs_claimed = self.jobs_finished = 0
            self.errors = collections.Counter()
            self.error_samples = []
            self.slow = collections.Counter()

    def operation(self, kind: str) -> None:
        with self.lock:
            self.operations[kind] += 1

    def error(self, kind: str, error: BaseException) -> None:
        with self.lock:
            self.errors[type(error).__name__] += 1
            if len(self.error_samples) < 5:
                self.error_samples.append(f"{kind}: {type(error).__name__}: {error}"[:300])

    def take(self, nodes: int, poll_interval: float, heartbeat_interval: float) -> dict:
        with self.lock:
            seconds = time.monotonic() - self.since
            return {
                "nodes": nodes, "seconds": seconds, "due_ticks": nodes * seconds / poll_interval,
                "due_beats": nodes * seconds / heartbeat_interval,
                "operations": dict(self.operations), "claim_ms": list(self.claim_ms),
                "heartbeat_ms": list(self.heartbeat_ms), "tick_late_ms": list(self.tick_late_ms),
                "claims_with_jobs": self.claims_with_jobs, "jobs_claimed": self.jobs_claimed,
                "jobs_finished": self.jobs_finished, "errors": dict(self.errors), "slow": dict(self.slow),
                "error_samples": list(self.error_samples),
            }


class Timer:
    """A heap of due calls, run on a thread pool: ``call(due)`` at monotonic time ``due``."""

    def __init__(self, threads: int, stats: Stats):
        self.heap: list = []
        self.condition = threading.Condition()
        self.sequence = itertools.count()
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="sim")
        self.stats = stats
        self.stopping = False
        self.thread = threading.Thread(target=self.run, name="sim-timer", daemon=True)
        self.thread.start()

    def at(self, due: float, call) -> None:
        with self.condition:
            heapq.heappush(self.heap, (due, next(self.sequence), call))
            self.condition.notify()

    def soon(self, call) -> None:
        self.at(time.monotonic(), call)

    def run(self) -> None:
        while True:
            with self.condition:
                while not self.stopping:
                    now = time.monotonic()
                    if self.heap and self.heap[0][0] <= now:
                        break
                    self.condition.wait(self.heap[0][0] - now if self.heap else None)
                if self.stopping:
                    return
                due, _, call = heapq.heappop(self.heap)
            self.pool.submit(self._call, call, due)

    def _call(self, call, due: float) -> None:
        try:
            call(due)
        except Exception as e:  # noqa: BLE001 - a bug of the simulation must show, not stop its node
            self.stats.error("simulation", e)

    def stop(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify()
        self.pool.shutdown(wait=False, cancel_futures=True)


class Simulation:
    def __init__(self, url: str, parameters: dict):
        self.url = url
        self.parameters = parameters
        self.stats = Stats()
        self.timer = Timer(parameters["threads"], self.stats)
        self.nodes: list[SimNode] = []
        self.random = random.Random()

    def add(self, numbers: list[int]) -> int:
        for number in numbers:
            node = SimNode(number, self)
            self.nodes.append(node)
            node.start(self.random)
        return len(numbers)

    def stop(self) -> None:
        self.timer.stop()
        for node in self.nodes:
            node.stopping = True
            with contextlib.suppress(Exception):
                node.engine.dispose()


class SimNode:
    """One simulated Scrapyd node: its own engine and worker id, the launcher's and the poller's statements."""

    def __init__(self, number: int, simulation: Simulation):
        from scrapyd_pgqueue.store import db
        from scrapyd_pgqueue.store import JobStore

        parameters = simulation.parameters
        self.simulation, self.timer, self.stats = simulation, simulation.timer, simulation.stats
        self.name = f"sim-{number}"
        self.worker = uuid.uuid4().hex
        self.engine = db.get_engine(f"{simulation.url}?application_name={self.name}",
                                    pool_size=parameters["pool_size"], migrate_schema=False,
                                    application_name=db.application_name(self.name))
        self.store = JobStore(self.engine)
        self.poll_interval = parameters["poll_interval"]
        self.heartbeat_interval = parameters["heartbeat_interval"]
        self.lease_seconds = parameters["lease_seconds"]
        self.max_attempts = parameters["max_attempts"]
        self.max_proc = parameters["max_proc"]
        self.hold_seconds = parameters["hold_seconds"]
        self.finished_to_keep = parameters["finished_to_keep"]
        self.lock = threading.Lock()
        self.running: dict[int, tuple] = {}  # job row id -> (claim, start time)
        self.claiming = False
        self.claim_again = False
        self.healthy_since = None
        self.stopping = False
        # A busy node's pool ends up holding all its connections (claims, heartbeats, web requests and finishes
        # overlap now and then, and nothing closes an idle pooled connection): open them all now.
        connections = []
        try:
            for _ in range(parameters["pool_size"]):
                connections.append(self.engine.connect())
        except Exception as e:  # noqa: BLE001 - counted; the pool opens what it needs later
            self.stats.error("connect", e)
        finally:
            for connection in connections:
                connection.close()
        if self._timed("register_node", self.store.register_node, worker=self.worker, name=self.name, url=None,
                       max_proc=self.max_proc, ok=True) is not None:
            self.healthy_since = time.monotonic()

    def start(self, chooser: random.Random) -> None:
        now = time.monotonic()
        self.timer.at(now + chooser.uniform(0, self.poll_interval), self.tick)
        self.timer.at(now + chooser.uniform(0, self.heartbeat_interval), self.beat)

    @staticmethod
    def _next(due: float, interval: float) -> float:
        """The next time on this action's grid after now: intervals missed while late are skipped, as Twisted's
        LoopingCall does (and the lease thread, which waits for what is left of its interval)."""
        late = time.monotonic() - due
        return due + interval * (max(0, math.floor(late / interval)) + 1)

    def _timed(self, kind: str, call, *args, ok=None, **kwargs):
        """``call(...)``, counted and timed; an exception is counted by type and gives None (or ``ok`` is
        returned on success instead of the call's result, for calls that return None)."""
        started = time.perf_counter()
        try:
            result = call(*args, **kwargs)
            return result if ok is None else ok
        except Exception as e:  # noqa: BLE001 - DatabaseError and anything else, counted by type
            self.stats.error(kind, e)
            return None
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            with self.stats.lock:
                self.stats.operations[kind] += 1
                if kind == "claim_next_jobs":
                    self.stats.claim_ms.append(elapsed)
                elif kind == "heartbeat":
                    self.stats.heartbeat_ms.append(elapsed)
                if elapsed >= SLOW_MS:
                    self.stats.slow[kind] += 1

    # LeaseKeeper: the node's tick every heartbeat_interval (bounded by it), recovery once healthy for a lease.
    def beat(self, due: float) -> None:
        from scrapyd_pgqueue.store import db

        if self.stopping:
            return
        self.timer.at(self._next(due, self.heartbeat_interval), self.beat)
        healthy = self.healthy_since is not None
        with self.lock:
            known = list(self.running)
        with db.deadline(self.heartbeat_interval):
            tick = self._timed(
                "heartbeat", self.store.node_tick, worker=self.worker, lease_seconds=self.lease_seconds,
                max_attempts=self.max_attempts, known_ids=known, release=healthy,
                recover=healthy and time.monotonic() - self.healthy_since >= self.lease_seconds,
                claimed_before=datetime.datetime.now() - datetime.timedelta(seconds=60),
                prompt_seconds=2 * self.heartbeat_interval,
            )
            if tick is None:
                self.healthy_since = None
                return
            if not tick.registered:
                self._timed("register_node", self.store.register_node, worker=self.worker, name=self.name,
                            url=None, max_proc=self.max_proc)
            if self.healthy_since is None:
                self.healthy_since = time.monotonic()

    # The poller's TimerService: a tick every poll_interval, fixed rate.
    def tick(self, due: float) -> None:
        if self.stopping:
            return
        self.timer.at(self._next(due, self.poll_interval), self.tick)
        with self.stats.lock:
            self.stats.tick_late_ms.append((time.monotonic() - due) * 1000)
        self.poll()

    def poll(self) -> None:
        """PostgresPoller.poll: one claim for the free slots; a poll during a claim runs one more after it."""
        with self.lock:
            free = self.max_proc - len(self.running)
            if free <= 0:
                return
            if self.claiming:
                self.claim_again = True
                return
            self.claiming = True
        try:
            claim = self._timed("claim_next_jobs", self.store.claim_next_jobs, [PROJECT], free, node=self.name,
                                worker=self.worker)
            claimed = claim.jobs if claim else []
            now = datetime.datetime.now()
            with self.lock:
                for claim in claimed:
                    self.running[claim.id] = (claim, now)
            if claimed:
                with self.stats.lock:
                    self.stats.claims_with_jobs += 1
                    self.stats.jobs_claimed += len(claimed)
            for claim in claimed:
                self._timed("mark_started", self.store.mark_started, claim, worker=self.worker, pid=os.getpid(),
                            start_time=now)
                self.timer.at(time.monotonic() + self.hold_seconds, lambda due, claim=claim: self.finish(claim))
        finally:
            with self.lock:
                self.claiming = False
                again, self.claim_again = self.claim_again, False
        if again:
            self.timer.soon(lambda due: self.poll())

    # PostgresJobStorage.add, then the slot asks for its next job at once (the poller's next()).
    def finish(self, claim) -> None:
        with self.lock:
            _, started = self.running[claim.id]
        self._timed("finish_job", self.store.finish_job, project=claim.project, spider=claim.message.get("name"),
                    job=claim.job, start_time=started, end_time=datetime.datetime.now(), outcome="finished",
                    exit_code=0, pid=os.getpid(), node=self.name, claimed=claim, worker=self.worker)
        self._timed("prune_terminated", self.store.prune_terminated, self.finished_to_keep)
        with self.lock:
            del self.running[claim.id]
        with self.stats.lock:
            self.stats.jobs_finished += 1
        if not self.stopping:
            self.poll()


# --- figures -------------------------------------------------------------------------------------------------------


def _get(data: dict, *keys):
    """``data[k1][k2]...``, None when a part is missing (a part that failed)."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _difference(a, b) -> float:
    return math.nan if a is None or b is None else a - b


def _ratios(series: dict) -> dict:
    ratios = {}
    poll, direct = series["poll_only"], series["listeners_direct"]
    for key, label in (("to_spawn_ms", "response->spawn"), ("to_spider_ms", "response->spider")):
        for statistic in ("p50", "p99"):
            ratios[f"{label} {statistic} (ms), poll-only - listeners direct"] = _difference(
                _get(poll, "jobs", key, statistic), _get(direct, "jobs", key, statistic))
    ratios["idle transactions/s, poll-only / listeners direct"] = _safe_ratio(
        _get(poll, "idle", "transactions_per_second"), _get(direct, "idle", "transactions_per_second"))
    points = series["simulated"]["points"]
    if len(points) >= 2:
        first, last = points[0], points[-1]
        ratios[f"simulated transactions/s, {last['nodes']:,} / {first['nodes']:,} nodes"] = _safe_ratio(
            last["transactions_per_second"], first["transactions_per_second"])
        for statistic in ("p50", "p99"):
            ratios[f"simulated claim {statistic}, {last['nodes']:,} / {first['nodes']:,} nodes"] = _safe_ratio(
                last["claim_ms"][statistic], first["claim_ms"][statistic])
    return ratios


def _safe_ratio(numerator, denominator) -> float:
    if not denominator or numerator is None or math.isnan(denominator) or math.isnan(numerator):  # noqa
        return math.nan
    return numerator / denominator


def _notes(series: dict, sizes: Sizes) -> list[str]:
    notes = []
    for name in MODES:
        data = series[name]
        if "failed" in data:
            notes.append(f"{name} FAILED: {_last_line(data['failed'])}")
            continue
        errors = data["errors"]
        if errors["connection_errors"]:
            notes.append(f"{name}: {errors['connection_errors']} connection-error line(s) on "
                         f"{errors['nodes_with_errors']} node(s), by pattern {errors['by_pattern']}; e.g. "
                         + " | ".join(errors["samples"][:3]))
        if errors["other_problem_lines"]:
            notes.append(f"{name}: {errors['other_problem_lines']} other problem line(s) in node/crawl logs; e.g. "
                         + " | ".join(errors["other_samples"][:3]))
        if data["start"]["retried"]:
            notes.append(f"{name}: {data['start']['retried']} node(s) retried at start: {data['start']['retries'][:3]}")
        if data["jobs"]["schedule_errors"]:
            notes.append(f"{name}: {data['jobs']['schedule_errors']} schedule.json error(s): "
                         f"{data['jobs']['schedule_error_samples'][:3]}")
        if data["jobs"]["unterminated_at_deadline"]:
            notes.append(f"{name}: {data['jobs']['unterminated_at_deadline']} job(s) not terminated by the deadline")
        bad = {outcome: n for outcome, n in data["jobs"]["outcomes"].items() if outcome != "finished"}
        if bad:
            notes.append(f"{name}: job outcomes other than finished: {bad}")
    simulated = series["simulated"]
    if "failed" in simulated:
        notes.append(f"simulated FAILED: {_last_line(simulated['failed'])}")
    if simulated.get("failure"):
        notes.append(f"simulated: stopped at the {simulated['failure']['step']:,}-node step: "
                     f"{simulated['failure']['error']}")
    for point in simulated["points"]:
        if point["errors"]:
            notes.append(f"simulated {point['nodes']:,}: errors {point['errors_by_type']}: "
                         f"{point['error_samples'][:2]}")
        if point.get("errors_adding"):
            notes.append(f"simulated {point['nodes']:,}: errors while adding this step's nodes (before the window): "
                         f"{point['errors_adding_by_type']}: {point['errors_adding_samples'][:2]}")
        if point.get("slow_operations"):
            notes.append(f"simulated {point['nodes']:,}: store calls of {SLOW_MS / 1000:g} s or more, by kind: "
                         f"{point['slow_operations']}")
    feeder = simulated.get("feeder", {"errors": 0})
    if feeder["errors"]:
        notes.append(f"simulated: the feeder's enqueue failed {feeder['errors']} time(s): {feeder['first_error']}")
    if not sizes.wait_for_lease:
        notes.append("quick: the idle window starts before the nodes have been up for a lease (30 s), so it misses "
                     "lease recovery, which a node's tick includes once healthy for a lease")
    return notes


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


@report.plotting
def plot(plt, result: dict, directory: Path) -> list[Path]:
    series = result["series"]
    points = series["simulated"]["points"]
    nodes = [point["nodes"] for point in points]
    paths = []

    figure, axes = plt.subplots(figsize=(8, 5))
    axes.plot(nodes, [p["claim_ms"]["p50"] for p in points], marker="o", label="claim_next_jobs p50")
    axes.plot(nodes, [p["claim_ms"]["p99"] for p in points], marker="s", label="claim_next_jobs p99")
    axes.plot(nodes, [p["heartbeat_ms"]["p99"] for p in points], marker="^", linestyle=":", label="heartbeat p99")
    report.log_axes(axes, nodes)
    report.finish_axes(axes, title="Claim and heartbeat latency against the number of nodes",
                       xlabel="simulated nodes (through PgBouncer, pool 20)", ylabel="latency (ms, log)", grid="both")
    paths.append(report.save_figure(plt, figure, directory / "scale_claim_latency.png"))

    figure, axes = plt.subplots(figsize=(8, 5))
    rate = result["parameters"]["sizes"]["sim_jobs_per_second"]
    axes.plot(nodes, [p["transactions_per_second"] for p in points], marker="o",
              label=f"simulated ({rate:g} jobs/s enqueued): server xact/s")
    axes.plot(nodes, [p["operations_per_second"] for p in points], marker="s", linestyle="--",
              label="simulated: store calls/s (PgBouncer's clients' transactions)")
    for name, marker in (("poll_only", "D"), ("listeners_direct", "v")):
        data = series[name]
        if "idle" not in data:
            continue
        axes.plot([data["nodes"]], [data["idle"]["transactions_per_second"]], marker=marker, linestyle="none",
                  markersize=9, label=f"real nodes idle, {name.replace('_', ' ')} (poll {data['poll_interval']:g} s)")
    report.log_axes(axes, sorted(set(nodes) | {series["poll_only"]["nodes"]}) or [1])
    report.finish_axes(axes, title="Server transactions per second against the number of nodes", xlabel="nodes",
                       ylabel="per second (log)", grid="both")
    paths.append(report.save_figure(plt, figure, directory / "scale_transactions.png"))

    figure, axes = plt.subplots(figsize=(8, 5))
    for name in MODES:
        data = series[name]
        for key, style, what in (("to_spawn_ms_values", "-", "spawn (row start_time)"),
                                 ("to_spider_ms_values", "--", "spider (runs.jsonl)")):
            values = _get(data, "jobs", key) or []
            if values:
                axes.step(values, [(rank + 1) / len(values) for rank in range(len(values))], where="post",
                          linestyle=style, label=f"{name.replace('_', ' ')} (poll {data['poll_interval']:g} s): {what}")
    axes.set_xscale("symlog", linthresh=10)
    report.finish_axes(axes, title=f"Wake-up, {series['poll_only']['nodes']} real nodes behind PgBouncer",
                       xlabel="ms after the schedule.json response (symlog)", ylabel="fraction of jobs")
    paths.append(report.save_figure(plt, figure, directory / "scale_wakeup.png"))
    return paths
