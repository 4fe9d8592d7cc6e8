"""NOTIFY at scale: scheduling throughput and pickup with 0, 100 and 1,000 idle nodes' sessions on the server.

Every transaction that sends a NOTIFY takes one server-wide lock at its commit (notifying transactions commit one
at a time) and, before Postgres 19, signals every session LISTENing in the database, which then reads the queue.
The package notifies only while some node wants work (``scrapyd_node.wants_work``), once per statement, with an empty
payload; and only ``listen_slots`` nodes LISTEN at once (``scrapyd_pgqueue.store.listen_slots``): a node that wants
work takes a free slot (a session-level advisory lock on its listener's session), LISTENs while it holds it and gives
it up when busy; every other node keeps its session (its lease) without LISTEN, and polls, trying for a slot once per
``poll_interval`` while it wants work. This suite measures what that buys, on a Postgres of its own
(``max_connections`` above the sessions; the role and database ``scrapyd`` of ``bench.servers.Servers``):

- **idle nodes' sessions** (``sessions.py``): one process opens ``count`` real connections straight to Postgres and
  reads what they receive (one ``epoll`` loop). ``slots``, the product now: at most ``listen_slots - 1`` of them take
  a slot with the product's statement and LISTEN on every channel, the rest stay connected without LISTEN and try
  for a slot every ``SLOT_RETRY`` s each (spread: 1,000 sessions about 200 tries/s, all failing while the slots are
  held). ``listen``, the design before (the reference): every session LISTENs;
- **one real node** (``LocalCluster``, ``max_proc`` ``MAX_PROC``, NOTIFY on, ``listen_slots`` ``LISTEN_SLOTS``,
  default ``poll_interval``) takes ``schedule.json`` from ``CLIENTS`` client threads for ``seconds`` (unique job ids,
  spider ``sleeper``): ok answers per second and each answer's time (the commit is inside it), then
  ``scrapyd-pgqueue enqueue`` (a real process) streams ``enqueue_jobs`` jobs in COPYs of ``ENQUEUE_BATCH``, all in
  one transaction (since the bulk COPY path: one NOTIFY a command, not one a batch);
- two modes, the node full (its slots held by long crawls: it wants no work and holds no listen slot): ``busy``,
  nothing notifies; ``wanting``, one more registered node row that wants work and never claims, so every schedule
  and batch notifies. Its listener is stood in for by one more session (in both modes and with 0 sessions too), which
  takes the slot the full node gave up and LISTENs: with it and the ``listen_slots - 1`` simulated holders every slot
  is held;
- **pickup** on an idle cluster (the node wants work and holds a slot; ``max_proc`` 2, so that a picked-up job does
  not fill it and hand its slot to a simulated session, which would never claim): one job at a time, from the
  ``schedule.json`` answer to the crawl process's spawn (``spider_job.start_time``; the wakeup suite's measure,
  signed: negative when the spawn beat the answer), and from the request's sending (never negative).

Ratios are taken within this run: each count of sessions and design against none, same mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench import report
from bench.context import Context
from bench.processes import cpu_seconds
from bench.servers import Servers, connect
from bench.stats import percentile, ratio
from bench.suites import wakeup
from bench.suites.notify.sessions import CHANNELS, Plan, Sessions
from bench.suites.notify.table import format_table, plot

__all__ = ["SERIES", "SUMMARY", "format_table", "plot", "run"]

SUMMARY = ("schedule.json (8 clients) and scrapyd-pgqueue enqueue with 0, 100 and 1,000 idle nodes' sessions, listen "
           "slots against every session listening; pickup")
SERIES = ("busy", "wanting", "pickup")

SESSION_COUNTS = {"quick": (0, 100), "full": (0, 100, 1000)}
SIZES = {"quick": {"seconds": 3.0, "enqueue_jobs": 2_000, "pickups": 3, "rounds": 1},
         "full": {"seconds": 15.0, "enqueue_jobs": 20_000, "pickups": 20, "rounds": 2}}
CLIENTS = 8
ENQUEUE_BATCH = 100  # jobs a COPY (the command's transaction notifies once, at its end)
MAX_CONNECTIONS_SPARE = 100  # the node, the stand-in, the bench's own connections, the reserve
LISTEN_SLOTS = 8  # the option's default
MAX_PROC = 2
SLOT_RETRY = 5.0  # a node's poll_interval (default): its tries for a slot while it wants work and holds none
BLOCKER_SECONDS = 3600
THROUGHPUT_RATIO_TARGET = 0.8
PICKUP_P50_TARGET_MS = 50.0
PICKUP_P99_TARGET_MS = 250.0
WANTING_NODE = "INSERT INTO scrapyd_node (id, name, max_proc) VALUES ('bench-wanting', 'bench-wanting', 1)"
NO_WANTING_NODE = "DELETE FROM scrapyd_node WHERE id = 'bench-wanting'"
DROP_WAITING = "DELETE FROM spider_job WHERE status = 'pending'"
IDLE_BACKENDS = "SELECT pid FROM pg_stat_activity WHERE application_name = 'bench-idle-node'"
WANTS_WORK = "SELECT wants_work FROM scrapyd_node WHERE stopped_time IS NULL AND id <> 'bench-wanting'"


def run(ctx: Context) -> dict:
    from scrapyd_pgqueue.local.cluster import LocalCluster

    counts, sizes = SESSION_COUNTS[ctx.profile.name], SIZES[ctx.profile.name]
    most = max(counts)
    plans = [_plan(count, "slots") for count in counts] + [_plan(most, "listen")]
    servers = Servers(most + MAX_CONNECTIONS_SPARE, 100, ctx.log)
    try:
        servers.start()
        local = dataclasses.replace(ctx, database_url=servers.direct_url)
        config = {"max_proc": str(MAX_PROC), "listen_notify": "on", "listen_slots": str(LISTEN_SLOTS)}
        with LocalCluster(servers.direct_url, 1, directory=ctx.workdir / "notify", config=config) as cluster:
            node = cluster.nodes[0]
            wakeup._wait_idle(local, cluster, listening=True)
            pickup = {_key(plan): _pickups(local, cluster, plan, sizes["pickups"])
                      for plan in plans if plan.count in (0, most)}
            _fill_the_node(local, cluster)
            with Sessions(servers.direct_url, _plan(0, "slots", stand_in=True), ctx.log) as warm:  # not kept
                _measure(local, node, warm, "busy", {**sizes, "seconds": 1.0, "enqueue_jobs": 500})
            measured = {mode: {_key(plan): [] for plan in plans} for mode in ("busy", "wanting")}
            for round_ in range(sizes["rounds"]):  # the second round in reverse order: a drifting load cancels
                for plan in plans if round_ % 2 == 0 else plans[::-1]:
                    with Sessions(servers.direct_url, dataclasses.replace(plan, stand_in=True), ctx.log) as sessions:
                        for mode, runs in measured.items():
                            runs[_key(plan)].append(_measure(local, node, sessions, mode, sizes))
    finally:
        servers.remove()
    series = {mode: {key: _combine(runs) for key, runs in by_plan.items()} for mode, by_plan in measured.items()}
    series["pickup"] = pickup
    return _result(series, plans, sizes)


def _plan(count: int, design: str, stand_in: bool = False) -> Plan:
    return Plan(count, design, LISTEN_SLOTS, LISTEN_SLOTS - 1, SLOT_RETRY, stand_in)


def _key(plan: Plan) -> str:
    return f"{plan.count} {plan.design}"


def _measure(ctx: Context, node, sessions: Sessions, mode: str, sizes: dict) -> dict:
    _sql(ctx.database_url, DROP_WAITING)
    _sql(ctx.database_url, WANTING_NODE if mode == "wanting" else NO_WANTING_NODE)
    holders = _slot_holders(ctx)
    groups = {"client": [sessions.process.pid] if sessions.active else [],
              "backends": [pid for (pid,) in _sql(ctx.database_url, IDLE_BACKENDS)]}
    before = {**sessions.counts(), "cpu": cpu_seconds(groups)}
    schedules = _schedule_from_clients(node, mode, sizes["seconds"])
    after_schedules = {**sessions.counts(), "cpu": cpu_seconds(groups)}
    enqueue = _enqueue(ctx, mode, sizes["enqueue_jobs"])
    after = {**sessions.counts(), "cpu": cpu_seconds(groups)}
    listening = after["holders"]
    ctx.log(f"notify: {sessions.plan.label()}, {mode}: {schedules['jobs_per_s']:.0f} schedules/s, enqueue "
            f"{enqueue['jobs_per_s']:.0f} jobs/s; {listening} listening sessions read "
            f"{after['heard_by_holders'] - before['heard_by_holders']:,} notifications, the others "
            f"{after['heard_by_pollers'] - before['heard_by_pollers']:,}; {after['tries'] - before['tries']:,} tries "
            f"for a slot, {after['won_by_pollers'] - before['won_by_pollers']} won")
    _sql(ctx.database_url, NO_WANTING_NODE)
    return {"sessions": sessions.plan.count, "design": sessions.plan.design, "listening": listening,
            "pollers": after["pollers"], "slots_held": len(holders), "node_holds_a_slot": node.name in holders.values(),
            "stand_in_slot": after["stand_in_slot"] - 1 if after["stand_in_slot"] > 0 else None,
            "schedule": {**schedules, **_heard(before, after_schedules, listening)},
            "enqueue": {**enqueue, **_heard(after_schedules, after, listening)}}


def _heard(before: dict, after: dict, listening: int) -> dict:
    """What the sessions read and tried between two readings of their counters."""
    delta = {name: after[name] - before[name] for name in before if name != "cpu"}
    return {"notifications_received": delta["heard_by_holders"], "notifies_per_listener":
            delta["heard_by_holders"] / listening if listening else 0.0,
            "heard_by_pollers": delta["heard_by_pollers"], "heard_by_stand_in": delta["heard_by_stand_in"],
            "slot_tries": delta["tries"], "slot_try_mean_ms": delta["try_ns"] / delta["tries"] / 1e6
            if delta["tries"] else None, "slots_won_by_pollers": delta["won_by_pollers"],
            "cpu_s": {name: after["cpu"][name] - before["cpu"][name] for name in after.get("cpu", {})}}


def _schedule_from_clients(node, mode: str, seconds: float) -> dict:
    """``CLIENTS`` threads POST schedule.json for ``seconds``: ok answers per second, each answer's time."""
    latencies: list[float] = []
    refused: list[str] = []
    run_id = uuid.uuid4().hex[:8]
    end = time.monotonic() + seconds

    def client(index: int) -> None:
        sent = 0
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = node.post("schedule.json", project=wakeup.PROJECT, spider=wakeup.SPIDER,
                               jobid=f"n-{mode}-{run_id}-{index}-{sent}", seconds="0")
            latencies.append(time.perf_counter() - started)
            if answer.get("status") != "ok":
                refused.append(str(answer.get("message")))
            sent += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if refused:
        raise RuntimeError(f"notify: schedule.json refused {len(refused)} jobs: {refused[:3]}")
    return {"jobs": len(latencies), "seconds": elapsed, "jobs_per_s": len(latencies) / elapsed,
            "answer_p50_ms": percentile(latencies, 0.5) * 1000, "answer_p99_ms": percentile(latencies, 0.99) * 1000,
            "latencies_s": latencies}


def _combine(runs: list[dict]) -> dict:
    """A plan's rounds as one: jobs and seconds summed, the answers' percentiles over every answer; ``rounds``: each
    round's rates."""
    combined = {**runs[-1], "rounds": [{way: run[way]["jobs_per_s"] for way in ("schedule", "enqueue")}
                                       for run in runs]}
    for way in ("schedule", "enqueue"):
        figures = {**runs[-1][way]}
        for name in ("jobs", "seconds", "notifications_received", "heard_by_pollers", "heard_by_stand_in",
                     "slot_tries", "slots_won_by_pollers"):
            figures[name] = sum(run[way][name] for run in runs)
        figures["jobs_per_s"] = figures["jobs"] / figures["seconds"]
        figures["cpu_s"] = {name: sum(run[way]["cpu_s"][name] for run in runs) for name in runs[-1][way]["cpu_s"]}
        figures["notifies_per_listener"] = sum(run[way]["notifies_per_listener"] for run in runs)
        tried = [(run[way]["slot_try_mean_ms"], run[way]["slot_tries"]) for run in runs if run[way]["slot_tries"]]
        figures["slot_try_mean_ms"] = (sum(ms * tries for ms, tries in tried) / sum(tries for _, tries in tried)
                                       if tried else None)
        if way == "schedule":
            latencies = [latency for run in runs for latency in run[way].pop("latencies_s")]
            figures.pop("latencies_s")
            figures["answer_p50_ms"] = percentile(latencies, 0.5) * 1000
            figures["answer_p99_ms"] = percentile(latencies, 0.99) * 1000
        else:
            figures["batch_ms"] = figures["seconds"] / -(-figures["jobs"] // ENQUEUE_BATCH) * 1000
        combined[way] = figures
    return combined


def _enqueue(ctx: Context, mode: str, jobs: int) -> dict:
    """``scrapyd-pgqueue enqueue`` of a JSON Lines file, ``ENQUEUE_BATCH`` jobs a transaction, start-up included."""
    path = ctx.workdir / f"notify-{mode}.jsonl"
    run_id = uuid.uuid4().hex[:8]
    path.write_text("".join(f'{{"spider": "sleeper", "jobid": "e-{run_id}-{i}"}}\n' for i in range(jobs)))
    command = [str(Path(sys.executable).parent / "scrapyd-pgqueue"), "enqueue", "--project", wakeup.PROJECT,
               "--batch-size", str(ENQUEUE_BATCH), str(path)]
    env = {**os.environ, "SCRAPYD_DATABASE_URL": ctx.database_url}  # not on the command line (ps)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=1800)
    elapsed = time.perf_counter() - started
    batches = -(-jobs // ENQUEUE_BATCH)
    return {"jobs": jobs, "seconds": elapsed, "jobs_per_s": jobs / elapsed, "batch_ms": elapsed / batches * 1000}


def _pickups(ctx: Context, cluster, plan: Plan, jobs: int) -> dict:
    """The wakeup suite's measure on the idle node (it holds a listen slot), with ``plan``'s sessions."""
    node = cluster.nodes[0].name
    _wait_wanting(ctx, True)
    _wait_for(lambda: node in _slot_holders(ctx).values(), f"node {node} to hold a listen slot")
    with Sessions(ctx.database_url, plan, ctx.log) as sessions:
        before = sessions.counts()
        pauses = random.Random(plan.count)
        samples, held = [], 0
        for index in range(jobs):
            samples.append(wakeup._one_job(ctx, cluster, f"pickup{plan.count}{plan.design}", index, pauses, 1.0))
            held += node in _slot_holders(ctx).values()
        after = sessions.counts()
    latencies = [sample["latency_ms"] for sample in samples]
    from_request = [sample["from_request_ms"] for sample in samples]
    ctx.log(f"notify: pickup with {plan.label()} sessions: p50 {percentile(latencies, 0.5):.1f} ms; the node held "
            f"a slot after {held} of {jobs} pickups")
    return {"sessions": plan.count, "design": plan.design, "samples": len(latencies),
            "p50_ms": percentile(latencies, 0.5), "p99_ms": percentile(latencies, 0.99), "max_ms": max(latencies),
            "from_request_p50_ms": percentile(from_request, 0.5),
            "from_request_p99_ms": percentile(from_request, 0.99),
            "node_held_a_slot_after": held, "listening": after["holders"],
            **_heard(before, after, after["holders"])}


def _fill_the_node(ctx: Context, cluster) -> None:
    """Start crawls that outlast the run on every slot of the node: it wants no work and gives up its listen slot."""
    for index in range(MAX_PROC):
        answer = cluster.nodes[0].post("schedule.json", project=wakeup.PROJECT, spider=wakeup.SPIDER,
                                       jobid=f"notify-blocker-{index}", seconds=str(BLOCKER_SECONDS))
        if answer.get("status") != "ok":
            raise RuntimeError(f"notify: the blocking crawl was refused: {answer}")
    _wait_wanting(ctx, False)
    node = cluster.nodes[0].name
    _wait_for(lambda: node not in _slot_holders(ctx).values(), f"node {node} to give up its listen slot")


def _wait_wanting(ctx: Context, wants: bool) -> None:
    _wait_for(lambda: _sql(ctx.database_url, WANTS_WORK) == [(wants,)], f"the node to say wants_work = {wants}")


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"notify: waited {timeout:g} s for {what}")
        time.sleep(0.1)


def _slot_holders(ctx: Context) -> dict[int, str]:
    """The listen slots held now: slot -> the holder's node name ('' for a simulated session)."""
    from scrapyd_pgqueue.store.listen_slots import LISTEN_SLOT_HOLDERS, LISTEN_SLOT_LOCKS

    rows = _sql(ctx.database_url, LISTEN_SLOT_HOLDERS.driver_text, {"locks": LISTEN_SLOT_LOCKS})
    return {slot: node for slot, node in rows}


def _sql(url: str, statement: str, parameters: dict | None = None) -> list | None:
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        cursor.execute(statement, parameters)
        return cursor.fetchall() if cursor.description else None


def _result(series: dict, plans: list[Plan], sizes: dict) -> dict:
    most = max(plan.count for plan in plans)
    ratios = {}
    for mode in ("busy", "wanting"):
        for way in ("schedule", "enqueue"):
            for plan in plans:
                if plan.count:
                    ratios[f"{mode}, {way}: {plan.label()} / none, jobs/s"] = ratio(
                        series[mode][_key(plan)][way]["jobs_per_s"], series[mode]["0 slots"][way]["jobs_per_s"])
                    if way == "schedule" and sizes["rounds"] > 1:
                        for index, (run, none) in enumerate(zip(series[mode][_key(plan)]["rounds"],
                                                                series[mode]["0 slots"]["rounds"], strict=True)):
                            ratios[f"{mode}, {way}: {plan.label()} / none, jobs/s, round {index + 1}"] = ratio(
                                run[way], none[way])
    slots = _plan(most, "slots")
    pickup = series["pickup"][_key(slots)]
    return {
        "parameters": {"session_counts": sorted({plan.count for plan in plans}), "designs": ["slots", "listen"],
                       "clients": CLIENTS, "enqueue_batch": ENQUEUE_BATCH, "channels": list(CHANNELS),
                       "max_proc": MAX_PROC, "listen_slots": LISTEN_SLOTS, "slot_holders": LISTEN_SLOTS - 1,
                       "slot_retry_s": SLOT_RETRY, **sizes},
        "series": series,
        "ratios": ratios,
        "targets": [
            report.target(f"busy: schedule.json with {slots.label()} / none", ratios[
                f"busy, schedule: {slots.label()} / none, jobs/s"], ">=", THROUGHPUT_RATIO_TARGET,
                "the node full: it wants no work, nothing notifies (issue 32)"),
            report.target(f"wanting: schedule.json with {slots.label()} / none", ratios[
                f"wanting, schedule: {slots.label()} / none, jobs/s"], ">=", THROUGHPUT_RATIO_TARGET,
                "one node wants work: every schedule notifies (issue 46)"),
            report.target(f"pickup p50 (ms), idle node, {slots.label()}", pickup["p50_ms"], "<=",
                          PICKUP_P50_TARGET_MS, "schedule.json answer -> spawnProcess"),
            report.target(f"pickup p99 (ms), idle node, {slots.label()}", pickup["p99_ms"], "<=",
                          PICKUP_P99_TARGET_MS, "schedule.json answer -> spawnProcess"),
        ],
        "notes": [
            "wanting: one registered node that wants work and never claims, so every schedule and every batch "
            "notifies; its listener is a stand-in session that holds a slot and LISTENs (in busy mode and with 0 "
            "sessions too)",
            f"listen slots: at most {LISTEN_SLOTS - 1} simulated sessions take a slot and LISTEN (the node or the "
            f"stand-in holds the last); the others try for one every {SLOT_RETRY:g} s each, spread",
            "notifies per listener: notifications the listening simulated sessions read / their number = "
            "notifying transactions that reached them; heard by pollers: what sessions without a slot read (0)",
            "enqueue: one transaction whatever its batches (one NOTIFY); what its listeners read in its window is "
            "mostly the schedules' notifications they had not read yet",
        ],
    }
