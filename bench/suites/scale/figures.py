"""The result's ratios and notes, and helpers for reading a result whose parts may have failed."""

from __future__ import annotations

import math

from bench.suites.scale.settings import MODES, SLOW_MS, Sizes


def _get(data: dict, *keys):
    """``data[k1][k2]...``, None when a part is missing (a part that failed)."""
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


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
