"""What the soak's raw material says: exactly-once from the crawls' records, schedule.json per minute against the
restarts, the nodes' logs, the tables, connections and memory."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

from bench import report
from bench.stats import percentile

MINUTE = 60.0
LOG_PATTERNS = ("Traceback", "KeyboardInterrupt", "Process died")
SLOWEST = 10
STARTING_RSS = 60 * 2**20  # a node process below this is still importing (a started node: ~73 MB)


def figures(cluster, feeder, chaos, sampler, records: Path, started: float, fed: float, ended: float) -> dict:
    restarts = chaos.restarts
    runs, ends = _records(records / "runs.jsonl"), _records(records / "ends.jsonl")
    return {
        "window": {"started": started, "fed": fed, "ended": ended, "feed_seconds": fed - started},
        "jobs": exactly_once(feeder.jobs, runs, ends, restarts),
        "odd_jobs": odd_jobs(cluster, feeder.jobs, runs, ends, restarts, started),
        "schedule": latency(feeder.calls, restarts, started),
        "cancel_calls": _call_summary([c for c in feeder.calls if c["endpoint"] == "cancel.json"]),
        "restarts": restarts,
        "restart_failures": chaos.failures,
        "logs": scan_logs(cluster),
        "samples": sampler.samples,
        "sampler_failures": sampler.failures,
        "tables": tables(sampler.samples),
        "connections": connections(sampler.samples),
        "rss": rss(sampler.samples),
    }


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [record for record in map(json.loads, path.read_text().splitlines())
            if not str(record.get("job")).startswith("warmup-")]


def exactly_once(jobs: dict, runs: list[dict], ends: list[dict], restarts: list[dict]) -> dict:
    """Every accepted job that was not cancelled while it waited ran once; nothing else ran.

    A job whose crawl was running on a node when it was SIGKILLed is run again once its lease expires (the node's
    finish of it, if the crawl even ended, died with the node): at least once across a crash, as documented
    (docs/explanation/leases.md). Such re-runs are counted apart from any other second run, and from two runs at once
    (a later run started before an earlier one's close)."""
    starts = collections.Counter(run["job"] for run in runs)
    closes = collections.Counter(end["job"] for end in ends)
    accepted = {job: plan for job, plan in jobs.items() if plan.get("accepted")}
    # A unique key that found a waiting job: the answer names that job, and this id never exists.
    existing = {job for job, plan in accepted.items() if (plan.get("answer") or {}).get("existing")}
    prevstate = {job: (plan.get("cancel") or {}).get("prevstate") for job, plan in accepted.items()
                 if "cancel" in plan}
    cancelled_waiting = {job for job, state in prevstate.items() if state == "pending"}
    # A running job cancelled before its spider exists exits early without a spider (and without a record): not
    # lost, so cancelled running jobs are not expected to have run; how many did is kept.
    cancelled_running = {job for job, state in prevstate.items() if state == "running"}
    expected = set(accepted) - existing - cancelled_waiting - cancelled_running
    kinds = collections.Counter(plan["kind"] for plan in jobs.values())
    twice = sorted(job for job, count in starts.items() if count > 1)
    after_kill, overlapping = [], []
    for job in twice:
        ordered = sorted((run for run in runs if run["job"] == job), key=lambda run: run["started"])
        first, again = ordered[0], ordered[1]
        if any(r["node"] == first["node"] and first["started"] <= r["killed"] <= again["started"] for r in restarts):
            after_kill.append(job)
        closed = [end["ended"] for end in ends if end["job"] == job and end["pid"] == first["pid"]]
        if closed and again["started"] < closed[0]:
            overlapping.append(job)
    return {
        "scheduled": len(jobs),
        "accepted": len(accepted),
        "refused": sorted(set(jobs) - set(accepted)),
        "by_kind": dict(kinds),
        "unique_existing": len(existing),
        "cancels": dict(collections.Counter(str(state) for state in prevstate.values())),
        "cancel_failed": sorted(job for job, plan in accepted.items() if "cancel" in plan and not plan["cancel"]["ok"]),
        "expected_to_run": len(expected),
        "ran": len(starts),
        "ran_twice": twice,
        "ran_twice_after_node_kill": after_kill,
        "ran_twice_otherwise": sorted(set(twice) - set(after_kill)),
        "ran_twice_at_once": overlapping,
        "lost": sorted(expected - set(starts)),
        "cancelled_running": len(cancelled_running),
        "cancelled_running_spider_created": len(cancelled_running & set(starts)),
        "cancelled_waiting_ran": sorted(cancelled_waiting & set(starts)),
        "existing_ran": sorted(existing & set(starts)),
        "unknown_ran": sorted(set(starts) - set(jobs)),
        "started_not_closed": sorted(job for job in starts if not closes[job]),
        "started_not_closed_cancelled": sorted(job for job in starts if not closes[job] and job in prevstate),
    }


def odd_jobs(cluster, jobs: dict, runs: list[dict], ends: list[dict], restarts: list[dict], started: float) -> dict:
    """For each job that ran twice, was lost, ran though cancelled while waiting, or started and never closed: its
    plan, its runs and closes (seconds from the feed's start) and the nodes' log lines that name it, so that the page
    can say why (the work directory, records included, is removed at the end)."""
    found = exactly_once(jobs, runs, ends, restarts)
    odd = set(found["ran_twice"] + found["lost"] + found["cancelled_waiting_ran"] + found["started_not_closed"])
    lines = collections.defaultdict(list)
    for node in cluster.nodes:
        try:
            text = node.logfile.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in text:
            for job in odd:
                if job in line and len(lines[job]) < 20:
                    lines[job].append(f"{node.name}: {line.strip()[:300]}")
        for job in odd:  # the crawl's own log: its last lines
            crawl_log = node.directory / "logs" / "example" / "sleeper" / f"{job}.log"
            if crawl_log.exists():
                tail = crawl_log.read_text(errors="replace").splitlines()[-6:]
                lines[job] += [f"{node.name} {crawl_log.name}: {line.strip()[:300]}" for line in tail]
    return {job: {"plan": {k: v for k, v in jobs.get(job, {}).items() if k != "answer"},
                  "runs": [{"node": r["node"], "pid": r["pid"], "at_s": r["started"] - started}
                           for r in runs if r["job"] == job],
                  "ends": [{"node": e["node"], "pid": e["pid"], "at_s": e["ended"] - started, "reason": e["reason"]}
                           for e in ends if e["job"] == job],
                  "restarts_s": [{"node": r["node"], "killed_s": r["killed"] - started, "ready_s": r["ready"] - started}
                                 for r in restarts],
                  "log_lines": lines[job]} for job in sorted(odd)}


def _call_summary(calls: list[dict]) -> dict:
    milliseconds = [call["seconds"] * 1000 for call in calls]
    return {"calls": len(calls), "errors": [call for call in calls if not call["ok"]],
            "p50_ms": percentile(milliseconds, 0.5), "p99_ms": percentile(milliseconds, 0.99),
            "max_ms": max(milliseconds, default=math.nan)}


def latency(calls: list[dict], restarts: list[dict], started: float) -> dict:
    """schedule.json per minute of the feed; a minute 'with a restart' holds a kill or a ready again."""
    schedules = [call for call in calls if call["endpoint"] == "schedule.json"]
    restart_minutes = {int((restart[moment] - started) // MINUTE) for restart in restarts
                       for moment in ("killed", "ready")}
    by_minute = collections.defaultdict(list)
    for call in schedules:
        by_minute[int((call["sent"] - started) // MINUTE)].append(call["seconds"] * 1000)
    minutes = [{"minute": minute, "calls": len(values), "p50_ms": percentile(values, 0.5),
                "p99_ms": percentile(values, 0.99), "max_ms": max(values), "restart": minute in restart_minutes}
               for minute, values in sorted(by_minute.items())]

    def spread(rows: list[dict], key: str) -> list[float] | None:
        return [min(row[key] for row in rows), max(row[key] for row in rows)] if rows else None

    quiet = [row for row in minutes if not row["restart"]]
    restarting = [row for row in minutes if row["restart"]]
    slowest = sorted(schedules, key=lambda call: call["seconds"], reverse=True)[:SLOWEST]
    return {
        **_call_summary(schedules),
        "minutes": minutes,
        "p99_ms_without_restart": spread(quiet, "p99_ms"), "p50_ms_without_restart": spread(quiet, "p50_ms"),
        "p99_ms_with_restart": spread(restarting, "p99_ms"), "p50_ms_with_restart": spread(restarting, "p50_ms"),
        "slowest": [_against_restarts(call, restarts, started) for call in slowest],
    }


def _against_restarts(call: dict, restarts: list[dict], started: float) -> dict:
    """A slow call, and where it falls against the last restart before it (of its own node, and of any)."""
    own = [r for r in restarts if r["node"] == call["node"] and r["ready"] <= call["sent"]]
    before = [r for r in restarts if r["killed"] <= call["sent"]]
    return {"at_s": call["sent"] - started, "ms": call["seconds"] * 1000, "node": call["node"], "ok": call["ok"],
            "after_own_ready_s": call["sent"] - own[-1]["ready"] if own else None,
            "after_last_restart_ready_s": call["sent"] - before[-1]["ready"] if before else None,
            "last_restart_node": before[-1]["node"] if before else None}


def scan_logs(cluster) -> dict:
    """Lines with each pattern in each node's log (what Scrapyd logs of its crawls' stderr goes there) and in the
    crawls' own logs; the first few lines of each for the page."""
    counts = {"node_logs": dict.fromkeys(LOG_PATTERNS, 0), "crawl_logs": dict.fromkeys(LOG_PATTERNS, 0)}
    examples: list[str] = []
    for node in cluster.nodes:
        sources = [("node_logs", node.logfile)]
        sources += [("crawl_logs", path) for path in sorted((node.directory / "logs").rglob("*.log"))]
        for where, path in sources:
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                for pattern in LOG_PATTERNS:
                    if pattern in line:
                        counts[where][pattern] += 1
                        if len(examples) < 12:
                            examples.append(f"{node.name} {path.name}: {line.strip()[:200]}")
    counts["examples"] = examples
    return counts


def tables(samples: list[dict]) -> dict:
    out = {}
    for name in ("spider_job", "job_log", "scrapyd_node"):
        rows = [sample["tables"][name] for sample in samples if name in sample["tables"]]
        if rows:
            out[name] = {"first_bytes": rows[0]["bytes"], "last_bytes": rows[-1]["bytes"],
                         "max_bytes": max(r["bytes"] for r in rows), "max_dead": max(r["dead"] for r in rows),
                         "last_dead": rows[-1]["dead"], "last_live": rows[-1]["live"],
                         "vacuums": rows[-1]["vacuums"] - rows[0]["vacuums"],
                         "autovacuums": rows[-1]["autovacuums"] - rows[0]["autovacuums"]}
    return out


def connections(samples: list[dict]) -> dict:
    nodes = sorted({node for sample in samples for node in sample["connections"]})
    return {node: {"max": max(s["connections"].get(node, 0) for s in samples),
                   "last": samples[-1]["connections"].get(node, 0),
                   "roles_last": samples[-1]["connection_roles"].get(node, {})} for node in nodes}


def rss(samples: list[dict]) -> dict:
    """Per node: each process's life (restarts start new ones), RSS at its first and last sample, and the node's RSS
    at the soak's first and last sample. A restarted process's first sample is dropped when it is taken in its
    first seconds (under 60 MB: still importing), as a life's growth would then count its start-up."""
    first_pids = {node: entry["pid"] for node, entry in samples[0]["rss"].items()} if samples else {}
    lives: dict[tuple[str, int], list[tuple[float, int]]] = collections.defaultdict(list)
    for sample in samples:
        for node, entry in sample["rss"].items():
            if entry["bytes"] is not None:
                lives[(node, entry["pid"])].append((sample["at"], entry["bytes"]))
    out: dict[str, dict] = {}
    for (node, pid), values in lives.items():
        if pid != first_pids.get(node) and values[0][1] < STARTING_RSS:
            values = values[1:]
        if not values:
            continue
        node_out = out.setdefault(node, {"lives": []})
        node_out["lives"].append({"pid": pid, "first": values[0][1], "last": values[-1][1],
                                  "minutes": (values[-1][0] - values[0][0]) / 60, "growth": values[-1][1] / values[0][1] - 1})
    for node, node_out in out.items():
        node_out["start"] = samples[0]["rss"].get(node, {}).get("bytes")
        node_out["end"] = samples[-1]["rss"].get(node, {}).get("bytes")
        longest = max(node_out["lives"], key=lambda life: life["minutes"])
        node_out.update(first=longest["first"], last=longest["last"], growth=longest["growth"],
                        longest_minutes=longest["minutes"])
    return out


def targets(result: dict) -> list[dict]:
    jobs, schedule, tables_ = result["jobs"], result["schedule"], result["tables"]
    quiet = schedule["p99_ms_without_restart"]
    restarting = schedule["p99_ms_with_restart"]
    logs = result["logs"]["node_logs"]
    return [
        report.target("jobs run twice, but for a crawl lost with its SIGKILLed node", len(jobs["ran_twice_otherwise"]),
                      "<=", 0, f"re-runs after a SIGKILL: {len(jobs['ran_twice_after_node_kill'])}"),
        report.target("jobs run twice at once", len(jobs["ran_twice_at_once"]), "<=", 0),
        report.target("jobs lost", len(jobs["lost"]), "<=", 0),
        report.target("jobs cancelled while waiting that ran", len(jobs["cancelled_waiting_ran"]), "<=", 0),
        report.target("schedule.json errors", len(schedule["errors"]), "<=", 0),
        report.target("worst minute p99 with a restart / without", (restarting[1] / quiet[1])
                      if restarting and quiet else None, "<=", 3, "before: 1.0-4.6 s against 22-58 ms"),
        report.target("Traceback lines in the nodes' logs", logs["Traceback"], "<=", 0, "before: 7-8 per 15 min"),
        report.target("job_log MB, largest sample", tables_.get("job_log", {}).get("max_bytes", math.nan) / 2**20,
                      "<=", 2, "before: 7.4 MB"),
        report.target("scrapyd_node dead rows, most", tables_.get("scrapyd_node", {}).get("max_dead"), "<=", 500,
                      "before: 2,523"),
    ]
