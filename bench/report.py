"""Tables, targets, the JSON file and the plots."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from pathlib import Path

NOT_MEASURED = "not measured"


def target(name: str, value: float | None, comparison: str, limit: float, note: str = "") -> dict:
    """A goal set for the queue and whether this run met it (``None`` value: the run did not measure it)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        met = None
    elif comparison == ">=":
        met = value >= limit
    else:
        met = value <= limit
    return {"name": name, "value": value, "comparison": comparison, "limit": limit, "met": met, "note": note}


def verdict(met: bool | None) -> str:
    return NOT_MEASURED if met is None else ("met" if met else "MISSED")


def format_targets(targets: Sequence[dict]) -> str:
    rows = [
        [t["name"], number(t["value"], 2), f"{t['comparison']} {t['limit']:g}", verdict(t["met"]), t["note"]]
        for t in targets
    ]
    return format_rows(["target", "value", "goal", "verdict", "note"], rows)


def format_ratios(result: dict, heading: str = "ratio", digits: int = 2) -> str:
    """A suite's ratios, a row each."""
    return format_rows([heading, "value"], [[name, number(value, digits)] for name, value in result["ratios"].items()])


def table_text(result: dict, lines: Sequence[str], ratios: str | None = None, ratio_digits: int = 2) -> str:
    """A suite's table as text: its lines, its ratios (under the heading ``ratios``, when given), then its targets
    and its notes."""
    if ratios is not None:
        lines = [*lines, format_ratios(result, ratios, ratio_digits), ""]
    return "\n".join([*lines, format_targets(result["targets"]), *(f"note: {note}" for note in result["notes"])])


def number(value, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int) and digits == 0:
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 1_048_576:,.1f} MB"


def format_rows(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain text table: first column left-aligned, the others right-aligned."""
    cells = [list(map(str, headers))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]

    def line(row):
        parts = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(cells[0]), rule, *(line(row) for row in cells[1:])])


def heading(title: str) -> str:
    return f"\n{title}\n{'=' * len(title)}"


def write_json(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=2, default=str, allow_nan=True) + "\n")
    temporary.replace(path)  # never leave a half-written file for a reader


def pyplot():
    """matplotlib's pyplot with the Agg backend, or None when the ``bench`` extra is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plotting(draw):
    """A suite's ``plot(result, directory)`` from ``draw(plt, result, directory)``: it draws with pyplot, and
    plots nothing (an empty list of files) when the ``bench`` extra is not installed."""

    @functools.wraps(draw)
    def plot(result: dict, directory: Path) -> list[Path]:
        plt = pyplot()
        return [] if plt is None else draw(plt, result, directory)

    return plot


def finish_axes(axes, *, title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
                legend_size: int | None = 8, grid: str | None = "major", grid_axis: str = "both") -> None:
    """A plot's title, axis labels, legend (None: the default size) and light grid (``grid``: which ticks, None:
    no grid), the same in every suite."""
    if title is not None:
        axes.set_title(title)
    if xlabel is not None:
        axes.set_xlabel(xlabel)
    if ylabel is not None:
        axes.set_ylabel(ylabel)
    axes.legend(**({} if legend_size is None else {"fontsize": legend_size}))
    if grid is not None:
        axes.grid(True, which=grid, axis=grid_axis, alpha=0.3)


def log_axes(axes, ticks: Sequence[float], labels: Sequence[str] | None = None) -> None:
    """Both scales logarithmic, ticks at ``ticks`` only (the values measured), no minor ticks."""
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(ticks, [f"{tick:,}" for tick in ticks] if labels is None else labels)
    axes.minorticks_off()


def save_figure(plt, figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
