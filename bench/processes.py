"""CPU accounting from /proc: the CPU seconds of process trees and of the whole machine, and the process tree."""

from __future__ import annotations

import collections
import os
from pathlib import Path

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


def child_pids(stats=None) -> dict[int, list[int]]:
    children = collections.defaultdict(list)
    for pid, (ppid, _, _) in (stats or _all_stats()).items():
        children[ppid].append(pid)
    return children


def cpu_seconds(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each group of process trees: each root's own and reaped children's time, plus
    its live descendants' own time (a child that exits and is reaped moves from the second to the first)."""
    stats = _all_stats()
    children = child_pids(stats)
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
