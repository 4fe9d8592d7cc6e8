"""Small statistics over timings, in plain Python so the benchmark needs no numpy."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was actually observed (p99 of 300 samples is the 297th)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(math.ceil(fraction * len(ordered)), 1)
    return ordered[rank - 1]


def summarise(values: Sequence[float]) -> dict:
    """How many values, their p50, p99, mean, min and max (NaN for none)."""
    return {
        "samples": len(values),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "mean": statistics.fmean(values) if values else math.nan,
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def summarise_ms(seconds: Sequence[float]) -> dict:
    """p50, p99, mean and max of durations given in seconds, in milliseconds.

    Also the p50 of the first and of the last tenth of the samples, in the order taken: a claim whose cost grows
    with every claim (index entries to step over) shows as a last tenth slower than the first.
    """
    milliseconds = [value * 1000 for value in seconds]
    tenth = max(len(milliseconds) // 10, 1)
    summary = summarise(milliseconds)
    return {
        "samples": summary["samples"],
        **{f"{key}_ms": summary[key] for key in ("p50", "p99", "mean", "max")},
        "p50_first_tenth_ms": percentile(milliseconds[:tenth], 0.50),
        "p50_last_tenth_ms": percentile(milliseconds[-tenth:], 0.50),
    }


def time_calls(call: Callable[[], object], repeats: int) -> list[float]:
    """Durations in seconds of ``repeats`` calls of ``call``."""
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        durations.append(time.perf_counter() - start)
    return durations


def ratio(numerator: float, denominator: float) -> float:
    if not denominator or math.isnan(denominator) or math.isnan(numerator):
        return math.nan
    return numerator / denominator
