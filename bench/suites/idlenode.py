"""Idle real nodes: what each sends to Postgres per tick, and its memory against stock Scrapyd's, in one run.

Starts its own Postgres (``LocalPostgres``) with ``log_statement = all`` and the application name in each log line,
then, with ``listen_notify`` on and off, NODES real one-line nodes (``application = scrapyd_pgqueue.application``,
the repository's scrapyd.cfg, ``poll_interval`` and ``heartbeat_interval`` 5 s) on an empty queue. After a warm-up
longer than ``lease_seconds`` (a node recovers other nodes' leases only after a whole lease of prompt heartbeats),
it counts the statements every node connection sent (log lines ``statement:``; the package sends each statement
with its ``SET LOCAL`` timeouts in the same query string, so a line is one round trip) over WINDOW seconds, per
node per 5 s tick, and what each statement was (its first words).

Memory: the same nodes' RSS and USS (``/proc/<pid>/smaps_rollup``: Private_Clean + Private_Dirty) after the
warm-up, against a stock Scrapyd (``python -m scrapyd``, its default SQLite queue, the same baked-in project) in the
same venv, started in the same run.
"""

from __future__ import annotations

import collections
import re
import statistics
import time
from pathlib import Path

from bench import report
from bench.context import Context

SUMMARY = "idle real nodes: statements per node per tick (server log) and memory against stock Scrapyd"
SERIES = ("notify", "polling", "memory")

NODES = 3
TICK = 5.0  # poll_interval and heartbeat_interval of the nodes (Scrapyd's default poll interval)
LEASE_SECONDS = 30  # scrapyd.cfg's default
WARMUP = {"quick": 8.0, "full": LEASE_SECONDS + 10.0}  # seconds before the window
WINDOW = {"quick": 15.0, "full": 60.0}
SERVER_LOG = {"log_statement": "all", "log_line_prefix": "%a|"}
# A logged statement: its first line, then the rest of its text on lines that start with a tab.
STATEMENT = re.compile(r"^(?P<application>[^|\n]*)\|LOG:  statement: (?P<text>.*(?:\n\t.*)*)", re.MULTILINE)
STOCK_CONFIG = "[scrapyd]\nbind_address = 127.0.0.1\n\n[settings]\nexample = example.settings\n"
MEMORY_TARGET = 1.15  # an idle node within 15% of stock Scrapyd's RSS
STATEMENTS_TARGET = 2.0  # per node per tick
CONNECTIONS_PERIOD = 0.25  # seconds between samples of the nodes' connections
CONNECTION_BUDGET = {"notify": 3, "polling": 2}  # per node: listen_notify on, off


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.database import db
    from scrapyd_pgqueue.local.devdb import LocalPostgres

    server = LocalPostgres(settings=SERVER_LOG)
    server.create()
    server.start()
    try:
        db.get_engine(server.url).dispose()  # the schema, migrated once before any node starts
        modes = {}
        for name, listen in (("notify", "on"), ("polling", "off")):
            ctx.log(f"idlenode: {NODES} nodes, listen_notify {listen}")
            modes[name] = _measure(ctx, server, listen)
    finally:
        server.stop()
        server.remove()
    memory = modes["notify"].pop("memory")
    modes["polling"].pop("memory")
    ratios = {
        **{f"{name} connections per node, peak": modes[name]["connections"]["peak_per_node"] for name in modes},
        "notify statements per node per tick": modes["notify"]["per_node_per_tick"],
        "polling statements per node per tick": modes["polling"]["per_node_per_tick"],
        "node RSS / stock RSS": memory["rss_ratio"],
        "node USS / stock USS": memory["uss_ratio"],
    }
    return {
        "parameters": {"nodes": NODES, "tick_seconds": TICK, "lease_seconds": LEASE_SECONDS,
                       "warmup_seconds": WARMUP[ctx.profile.name], "window_seconds": WINDOW[ctx.profile.name],
                       "server_log": SERVER_LOG, "stock": STOCK_CONFIG},
        "series": {**modes, "memory": memory},
        "ratios": ratios,
        "targets": [
            report.target("statements per node per tick, notify", ratios["notify statements per node per tick"],
                          "<=", STATEMENTS_TARGET),
            report.target("statements per node per tick, polling", ratios["polling statements per node per tick"],
                          "<=", STATEMENTS_TARGET),
            report.target("idle node RSS / stock Scrapyd", memory["rss_ratio"], "<=", MEMORY_TARGET),
            *(report.target(f"connections per node, peak, {name}", modes[name]["connections"]["peak_per_node"], "<=",
                            budget, "idle; the busy peak: tests/test_leases.py, tests/test_pgbouncer.py")
              for name, budget in CONNECTION_BUDGET.items()),
        ],
        "notes": [],
    }


def _measure(ctx: Context, server, listen: str) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster, ScrapydNode

    config = {"poll_interval": str(TICK), "heartbeat_interval": str(TICK), "listen_notify": listen,
              "lease_seconds": str(LEASE_SECONDS)}
    directory = ctx.workdir / f"idlenode-{listen}"
    stock = ScrapydNode("stock", directory / "stock", "", {}, {}, base_config=STOCK_CONFIG)
    with LocalCluster(server.url, nodes=NODES, directory=directory, config=config) as cluster:
        stock.start()
        try:
            stock.wait_ready()
            time.sleep(WARMUP[ctx.profile.name])
            start = server.logfile.stat().st_size
            began = time.monotonic()
            connections = _connections_per_node(server.url, WINDOW[ctx.profile.name])
            with open(server.logfile, "rb") as log:
                log.seek(start)
                text = log.read().decode(errors="replace")
            seconds = time.monotonic() - began
            memory = _memory([node.process.pid for node in cluster.nodes], stock.process.pid)
        finally:
            stock.stop()
    return {**_statements(text, seconds), "memory": memory, "connections": connections}


# A node's server connections, by the node name that ends each of its application names.
NODE_CONNECTIONS = """
    SELECT substring(application_name FROM ' (\\S+)$') AS node, count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name LIKE 'scrapyd-pgqueue%' GROUP BY 1
"""


def _connections_per_node(url: str, seconds: float) -> dict:
    """Each node's server connections, sampled every CONNECTIONS_PERIOD for ``seconds``: the most any node held at
    once (its budget: 3 with listen_notify on, 2 off) and the mean over nodes and samples."""
    import contextlib

    import psycopg2

    samples = []
    end = time.monotonic() + seconds
    # Named apart from the package's connections: neither its statements nor itself are counted as a node's.
    with contextlib.closing(psycopg2.connect(url, application_name="bench-idlenode")) as connection, \
            connection.cursor() as cursor:
        connection.autocommit = True
        while time.monotonic() < end:
            cursor.execute(NODE_CONNECTIONS)
            samples.append(dict(cursor.fetchall()))
            time.sleep(CONNECTIONS_PERIOD)
    counts = [count for sample in samples for count in sample.values()]
    return {"samples": len(samples), "peak_per_node": max(counts, default=0),
            "mean_per_node": statistics.fmean(counts) if counts else 0.0}


def _statements(text: str, seconds: float) -> dict:
    kinds = collections.Counter()
    total = 0
    for match in STATEMENT.finditer(text):
        if not match["application"].startswith("scrapyd-pgqueue"):
            continue
        total += 1
        kinds[_kind(match["text"])] += 1
    ticks = seconds / TICK
    return {
        "window_seconds": round(seconds, 1),
        "statements": total,
        "per_node_per_tick": total / NODES / ticks,
        "kinds_per_node_per_tick": {kind: count / NODES / ticks for kind, count in kinds.most_common()},
    }


def _kind(statement: str) -> str:
    """What a statement does, in a few words: the timeouts' prefix dropped, a function's name or the first words."""
    body = re.sub(r"^(SET LOCAL [^;]*;\s*)+", "", statement.strip())
    function = re.search(r"\b(scrapyd_pgqueue_\w+|claim_spider_jobs|\w+_node_tick)\(", body)
    if function:
        return f"{function.group(1)}()"
    return " ".join(body.split()[:4])[:60]


def _memory(node_pids: list[int], stock_pid: int) -> dict:
    """RSS and USS of every node and of the stock Scrapyd (kB from smaps_rollup), and the ratios of the median."""
    nodes = [_smaps(pid) for pid in node_pids]
    stock = _smaps(stock_pid)
    rss = statistics.median(node["rss_kb"] for node in nodes)
    uss = statistics.median(node["uss_kb"] for node in nodes)
    return {"nodes": nodes, "stock": stock, "rss_ratio": rss / stock["rss_kb"], "uss_ratio": uss / stock["uss_kb"],
            "node_rss_mb": rss / 1024, "node_uss_mb": uss / 1024,
            "stock_rss_mb": stock["rss_kb"] / 1024, "stock_uss_mb": stock["uss_kb"] / 1024}


def _smaps(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value)
    return {"pid": pid, "rss_kb": fields["Rss"], "uss_kb": fields["Private_Clean"] + fields["Private_Dirty"],
            "anonymous_kb": fields["Anonymous"]}


def format_table(result: dict) -> str:
    series = result["series"]
    rows = [[name, f"{series[name]['statements']:,}", f"{series[name]['window_seconds']:g}",
             report.number(series[name]["per_node_per_tick"], 2),
             report.number(series[name]["connections"]["peak_per_node"]),
             report.number(series[name]["connections"]["mean_per_node"], 2)] for name in ("notify", "polling")]
    kinds = sorted({kind for name in ("notify", "polling") for kind in series[name]["kinds_per_node_per_tick"]})
    kind_rows = [[kind, *(report.number(series[name]["kinds_per_node_per_tick"].get(kind, 0.0), 2)
                          for name in ("notify", "polling"))] for kind in kinds]
    memory = series["memory"]
    memory_rows = [
        ["node (median of {})".format(len(memory["nodes"])), report.number(memory["node_rss_mb"], 1),
         report.number(memory["node_uss_mb"], 1)],
        ["stock Scrapyd", report.number(memory["stock_rss_mb"], 1), report.number(memory["stock_uss_mb"], 1)],
        ["node / stock", report.number(memory["rss_ratio"], 2), report.number(memory["uss_ratio"], 2)],
    ]
    lines = [
        report.heading("Idle real nodes"),
        f"{result['parameters']['nodes']} one-line nodes, empty queue, poll and heartbeat every "
        f"{result['parameters']['tick_seconds']:g} s; statements from the server's log (log_statement = all)",
        report.format_rows(["listen_notify", "statements", "window s", "per node per tick", "connections peak",
                            "connections mean"], rows),
        "",
        report.format_rows(["statement", "notify /node/tick", "polling /node/tick"], kind_rows),
        "",
        report.format_rows(["idle process", "RSS MB", "USS MB"], memory_rows),
        "",
    ]
    return report.table_text(result, lines)


def plot(result: dict, directory: Path) -> list[Path]:
    return []
