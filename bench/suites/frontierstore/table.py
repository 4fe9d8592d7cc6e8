"""The frontierstore suite's table (no plot: a few rows, which the table says)."""

from __future__ import annotations

from pathlib import Path

from bench import report

STEP_STATEMENTS = ("store", "finish", "lock", "lease", "commit")  # a lease step's statements, timed one by one


def format_table(result: dict) -> str:
    parameters, series = result["parameters"], result["series"]
    lease_rows = [[f"{p['queued']:,}", p["mode"].replace("_", " "), str(p["clients"]), f"{p['steps']:,}",
                   report.number(p["per_second"]), *_latency_cells(p)] for p in series["lease"]["points"]]
    enqueue_rows = [[f"{p['queued']:,}", str(p["clients"]), f"{p['steps']:,}", report.number(p["per_second"]),
                     *_latency_cells(p)] for p in series["enqueue"]["points"]]
    statements = series["statements"]["points"]
    return report.table_text(result, [
        report.heading("Frontier store"),
        f"one crawl, {parameters['slots']} slots; each cell {parameters['runs']} x {parameters['run_seconds']:g} s, "
        f"the median rate; lease: a worker's step (its pages' new requests, its previous lease done, lease "
        f"{parameters['lease']} at {parameters['per_slot']} per slot); lease only: the same, nothing stored",
        report.format_rows(["queued", "step", "workers", "steps", "leased/s", "p50 ms", "p99 ms", "server ms/step"],
                           lease_rows),
        "",
        f"enqueue: steps of {parameters['enqueue_batch']} new requests, "
        f"{parameters['duplicate_share']:.0%} of them duplicates of stored ones",
        report.format_rows(["queued", "clients", "steps", "stored/s", "p50 ms", "p99 ms", "server ms/step"],
                           enqueue_rows),
        "",
        f"the lease step taken apart, one worker, {parameters['statement_steps']} steps: client time per statement",
        report.format_rows(["statement", *(f"p50 ms at {p['queued']:,}" for p in statements),
                            *(f"mean ms at {p['queued']:,}" for p in statements)],
                           [[name, *(report.number(p[name]["p50_ms"], 3) for p in statements),
                             *(report.number(p[name]["mean_ms"], 3) for p in statements)]
                            for name in STEP_STATEMENTS]),
        "",
        f"crawl_request at {series['sizes']['queued']:,} queued requests, fresh after the fill",
        report.format_rows(["relation", "size", "bytes/request"], _size_rows(series["sizes"])),
        "",
    ], ratios="ratio")


def _latency_cells(point: dict) -> list[str]:
    return [report.number(point["latency"]["p50_ms"], 2), report.number(point["latency"]["p99_ms"], 2),
            report.number(point["server_cpu_ms_per_step"], 3)]


def _size_rows(sizes: dict) -> list[list[str]]:
    parts = {"table (heap + TOAST + indexes)": sizes["total_bytes"], "heap": sizes["heap_bytes"],
             "TOAST": sizes["toast_bytes"], **sizes["index_bytes"]}
    return [[name, report.megabytes(size), report.number(size / sizes["queued"])] for name, size in parts.items()]


def plot(result: dict, directory: Path) -> list[Path]:
    return []  # a few rows: the table says it
