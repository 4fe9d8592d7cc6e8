"""The scale suite's constants: the nodes' configuration, the modes, the sizes, the log lines it looks for."""

from __future__ import annotations

from dataclasses import dataclass

PROJECT, SPIDER, JOB_SECONDS = "example", "sleeper", "0.2"
MAX_PROC = 2
HEARTBEAT_INTERVAL = 5.0
LEASE_SECONDS = 30.0
MAX_ATTEMPTS = 3
POOL_SIZE = 2  # database_pool_size, the product's default
FINISHED_TO_KEEP = 1000  # real nodes: keep every job's row of the run (the default 100 would prune them)
SIM_FINISHED_TO_KEEP = 100  # simulated nodes prune as a default node does
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
