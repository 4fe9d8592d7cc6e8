"""The benchmark's command: ``python -m bench [--quick] [--database-url URL] [--suites ...]``.

Runs the selected suites against one Postgres (a throwaway server by default), prints each suite's table,
writes every raw figure to a JSON file and one PNG per series next to it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as ``python bench/run.py``: make ``bench`` importable here and in the spawned claimers.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import context as bench_context
from bench import database, report
from bench.suites import SUITES, SUITES_BY_NAME, implemented

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "results.json"


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark scrapyd_pgqueue's claim path against the seed design, Scrapyd's sqlite queue and "
        "the bare claim statement, on a real Postgres.",
        epilog="suites: " + "; ".join(
            f"{suite.name}: {suite.summary}" for suite in SUITES
        ),
    )
    parser.add_argument("--quick", action="store_true",
                        help="the CI smoke test: small sizes, under 2 minutes on 2 cores (default: the full run)")
    parser.add_argument("--database-url", metavar="URL",
                        help="an existing, empty database to use (default: start a throwaway Postgres and remove it)")
    parser.add_argument("--suites", default=",".join(suite.name for suite in implemented()),
                        help="comma-separated suites to run (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help="JSON file for the raw figures; the table (.txt) and plots (.png) go next to it "
                        "(default: bench/results/results.json)")
    parser.add_argument("--claimers", type=_integers, help="throughput concurrency levels, e.g. 1,4,16,64")
    parser.add_argument("--duration", type=float, dest="run_seconds", help="seconds per throughput run")
    parser.add_argument("--repeats", type=int, help="throughput runs per path and level (median reported)")
    parser.add_argument("--depths", type=_integers, help="pending jobs for the depth suite, e.g. 1000,100000")
    parser.add_argument("--latency-samples", type=int, help="timed claims per path for depth and churn")
    parser.add_argument("--churn-jobs", type=int, help="jobs claimed and finished by the churn suite")
    parser.add_argument("--churn-processes", type=int, help="processes doing the churn")
    return parser.parse_args(argv)


def _integers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def select_suites(names: str) -> list:
    selected = []
    for name in (part.strip() for part in names.split(",") if part.strip()):
        suite = SUITES_BY_NAME.get(name)
        if suite is None:
            raise SystemExit(f"unknown suite {name!r}; suites: {', '.join(SUITES_BY_NAME)}")
        if not suite.implemented:
            raise SystemExit(f"suite {name!r} is planned but not implemented yet (see bench/suites/{name}.py)")
        selected.append(suite)
    return selected


def build_profile(arguments: argparse.Namespace) -> bench_context.Profile:
    base = bench_context.QUICK if arguments.quick else bench_context.FULL
    return bench_context.with_overrides(
        base,
        claimers=arguments.claimers,
        run_seconds=arguments.run_seconds,
        repeats=arguments.repeats,
        depths=arguments.depths,
        latency_samples=arguments.latency_samples,
        churn_jobs=arguments.churn_jobs,
        churn_processes=arguments.churn_processes,
    )


def machine_description() -> dict:
    return {
        "nproc": os.cpu_count(),
        "memory_total": _meminfo_total(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
        "git_revision": _git_revision(),
    }


def _meminfo_total() -> str | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _git_revision() -> str | None:
    try:
        completed = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                   cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def run_suites(ctx: bench_context.Context, suites: list, document: dict, output: Path) -> list[str]:
    """Run each suite, printing its table and saving the JSON after each, so a failure keeps earlier figures."""
    tables = []
    for suite in suites:
        ctx.log(f"suite {suite.name}: starting")
        start, load_before = time.monotonic(), os.getloadavg()
        result = suite.module.run(ctx)
        result["seconds"] = time.monotonic() - start
        # Other work on the machine moves every figure here: keep the load next to them.
        result["load_average"] = {"start": load_before, "end": os.getloadavg()}
        document["suites"][suite.name] = result
        report.write_json(output, document)
        table = suite.module.format_table(result) + (
            f"\n({suite.name}: {result['seconds']:.0f} s; load average {_load(load_before)} at start, "
            f"{_load(result['load_average']['end'])} at end)"
        )
        print(table, flush=True)
        tables.append(table)
        ctx.log(f"suite {suite.name}: done in {result['seconds']:.0f} s")
    return tables


def _load(load_average) -> str:
    return "/".join(f"{value:.1f}" for value in load_average)


def draw_plots(suites: list, document: dict, directory: Path, log) -> list[str]:
    if report.pyplot() is None:
        log("matplotlib is not installed: no plots (pip install -e '.[bench]')")
        return []
    paths = []
    for suite in suites:
        paths += [str(path) for path in suite.module.plot(document["suites"][suite.name], directory)]
    return paths


def describe_run(meta: dict) -> str:
    machine, postgres = meta["machine"], meta["postgres"]
    settings = postgres["settings"]
    return "\n".join([
        f"scrapyd_pgqueue benchmark, {meta['mode']} mode, {meta['started']}",
        f"machine: nproc {machine['nproc']}, memory {machine['memory_total']}, {machine['platform']}, "
        f"Python {machine['python']}, load average at start {_load(machine['load_average_at_start'])}",
        f"postgres: {postgres['server_version']} at {postgres['where']}; "
        f"max_connections {settings['max_connections']}, shared_buffers {settings['shared_buffers']}, "
        f"fsync {settings['fsync']}, synchronous_commit {settings['synchronous_commit']}, "
        f"autovacuum {settings['autovacuum']} (naptime {settings['autovacuum_naptime']}, "
        f"scale factor {settings['autovacuum_vacuum_scale_factor']})",
    ])


def summary_table(document: dict) -> str:
    rows = []
    for name, result in document["suites"].items():
        for target in result.get("targets", []):
            rows.append([name, target["name"], report.number(target["value"], 2),
                         f"{target['comparison']} {target['limit']:g}", report.verdict(target["met"])])
    return "\n".join([report.heading("Targets"),
                      report.format_rows(["suite", "target", "value", "goal", "verdict"], rows)])


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    suites = select_suites(arguments.suites)
    profile = build_profile(arguments)
    output = arguments.output.resolve()
    workdir = Path(tempfile.mkdtemp(prefix="scrapyd-pgqueue-bench-"))
    workdir.chmod(0o711)  # nodes started by root run as node_user and their crawls as project users: they pass through
    ctx = bench_context.Context(database_url="", profile=profile, workdir=workdir)
    removed = database.remove_scrapyd_environment()
    if removed:
        ctx.log(f"ignoring {', '.join(removed)} from the environment: the benchmark chooses its own database")
    document = {
        "meta": {
            "mode": profile.name,
            "profile": profile.__dict__,
            "suites": [suite.name for suite in suites],
            "planned_suites": [suite.name for suite in SUITES if not suite.implemented],
            "machine": machine_description(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "suites": {},
    }
    ctx.log(f"{profile.name} run of {', '.join(suite.name for suite in suites)}; load average "
            f"{document['meta']['machine']['load_average_at_start']}")
    try:
        with database.benchmark_database(arguments.database_url, ctx.log) as url:
            ctx.database_url = url
            database.prepare_schema(url)
            document["meta"]["postgres"] = database.server_description(url)
            header = describe_run(document["meta"])
            print(header, flush=True)
            tables = [header, *run_suites(ctx, suites, document, output)]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    document["meta"]["seconds"] = time.monotonic() - ctx.started
    document["meta"]["machine"]["load_average_at_end"] = os.getloadavg()
    document["meta"]["plots"] = draw_plots(suites, document, output.parent, ctx.log)
    report.write_json(output, document)
    summary = summary_table(document) + f"\n\ntotal: {document['meta']['seconds']:.0f} s ({profile.name} mode)"
    print(summary)
    output.with_suffix(".txt").write_text("\n".join([*tables, summary]) + "\n")
    ctx.log(f"wrote {output}, {output.with_suffix('.txt')} and {len(document['meta']['plots'])} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
