"""The delayed suite's ratios (over the empty table), targets and notes."""

from __future__ import annotations

from bench import report
from bench.stats import ratio
from bench.suites.delayed.settings import CLAIM_PATHS, COMPARED, LATENCY_TARGET, PERCENTILES


def _ratio_name(path: str, percentile: str, scenario: str) -> str:
    return f"{path} {percentile} {scenario} / empty"


def empty_reference(scenarios: dict, path: str, percentile: str) -> float:
    """The empty table's figure: the mean of its measurements before and after the delayed ones, which bracket
    them in time (a drift of the machine's load between the first and the last cancels out to first order)."""
    return (scenarios["empty"][path][percentile] + scenarios["empty_again"][path][percentile]) / 2


def _ratios(scenarios: dict) -> dict:
    ratios = {}
    for path in CLAIM_PATHS:
        for percentile in PERCENTILES:
            for scenario in COMPARED:
                ratios[_ratio_name(path, percentile, scenario)] = ratio(
                    scenarios[scenario][path][percentile], empty_reference(scenarios, path, percentile))
            # The noise floor: the same empty table measured twice, minutes apart.
            ratios[f"{path} {percentile} empty_again / empty"] = ratio(
                scenarios["empty_again"][path][percentile], scenarios["empty"][path][percentile])
    return ratios


def _targets(ratios: dict, delayed_jobs: int) -> list[dict]:
    note = "" if delayed_jobs >= 1_000_000 else f"quick mode: {delayed_jobs:,} delayed jobs only"
    return [
        report.target(f"claim {percentile[:3]} {path}, {delayed_jobs:,} delayed / empty",
                      ratios.get(_ratio_name(path, percentile, "delayed")), "<=", LATENCY_TARGET, note)
        for path in CLAIM_PATHS
        for percentile in PERCENTILES
    ]


def _notes(scenarios: dict, explains: dict, due_jobs: int) -> list[str]:
    promoted_counts = ", ".join(f"{path} {scenarios['delayed_due'][path].get('promoted', 0)}/{due_jobs}"
                                for path in CLAIM_PATHS)
    return [f"delayed_due: delayed jobs promoted by the measured claims (the rest were not due yet when it ended): "
            f"{promoted_counts}"]
