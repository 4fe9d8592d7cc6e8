"""Smoke test of the benchmark (bench/): quick mode against the suite's Postgres writes every suite's series.

No timing is asserted: the figures depend on the machine. What is checked is that the one command runs the
throughput, depth and churn suites and every claim path to the end (spawned claimers, barrier, Scrapyd's sqlite
queue, the seed tables, depth fills, concurrent churn) and writes the JSON with each suite's series. Sizes are cut
below --quick's to stay well under two minutes; concurrency (4 claimers, 4 churn processes) is kept, as that is
where things break. A new suite adds its name and series to EXPECTED_SERIES.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

EXPECTED_SERIES = {
    "throughput": {
        "pgqueue_pop",
        "pgqueue_claim_next_jobs",
        "seed_lock_table",
        "seed_lock_table_as_published",
        "scrapyd_sqlite",
        "bare_claim_statement",
        "lean_claim",
        "claim_0013",
    },
    "depth": {"claim_latency", "reads", "claim_latency_small_project"},
    "churn": {"stages", "during_churn"},
}

SMOKE_OPTIONS = [
    "--quick",
    # The suites this test covers (a suite that starts real Scrapyd nodes takes minutes: not in this smoke test).
    "--suites", ",".join(EXPECTED_SERIES),
    "--claimers", "1,4",
    "--duration", "0.3",
    "--depths", "1000,20000",
    "--latency-samples", "30",
    "--churn-jobs", "1000",
]


def _run_bench(database_url: str, output: Path) -> subprocess.CompletedProcess:
    # Exactly the user's command, from the repository root; the environment without a database URL of its own.
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SCRAPYD_")}
    command = [sys.executable, "-m", "bench", *SMOKE_OPTIONS, "--database-url", database_url, "--output", str(output)]
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=170)


@pytest.mark.timeout(180)
def test_quick_benchmark_writes_every_series(database_url, tmp_path):
    output = tmp_path / "results.json"

    completed = _run_bench(database_url, output)

    assert completed.returncode == 0, completed.stderr[-4000:]
    document = json.loads(output.read_text())
    assert set(document["suites"]) == set(EXPECTED_SERIES)
    for suite, series in EXPECTED_SERIES.items():
        assert set(document["suites"][suite]["series"]) == series, suite
    for name, data in document["suites"]["throughput"]["series"].items():
        assert [point["claimers"] for point in data["points"]] == [1, 4], name
    server_only = document["suites"]["throughput"]["server_only"]  # pgbench at the highest level run
    assert server_only["claimers"] == 4 and all(rate > 0 for rate in server_only["transactions_per_second"].values())
    assert [p["pending"] for p in document["suites"]["depth"]["series"]["claim_latency"]["points"]] == [1000, 20000]
    assert set(document["suites"]["churn"]["series"]["stages"]) == {"fresh", "after_churn", "after_manual_vacuum"}
    assert output.with_suffix(".txt").exists()


DELAYED_INDEXES = {"spider_job_delayed_idx", "spider_job_delayed_project_idx"}


@pytest.mark.timeout(60)
def test_quick_delayed_suite_writes_its_series(database_url, tmp_path):
    # The delayed suite on its own (quick: 20,000 delayed jobs), few samples: about 10 s.
    output = tmp_path / "results.json"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SCRAPYD_")}
    command = [sys.executable, "-m", "bench", "--quick", "--suites", "delayed", "--latency-samples", "20",
               "--database-url", database_url, "--output", str(output)]

    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=50)

    assert completed.returncode == 0, completed.stderr[-4000:]
    result = json.loads(output.read_text())["suites"]["delayed"]
    assert set(result["series"]) == {"claim_latency", "explain"}
    points = result["series"]["claim_latency"]["points"]
    assert [point["scenario"] for point in points] == ["empty", "delayed", "delayed_due", "empty_again"]
    assert result["parameters"]["delayed_counted"] == 20_000
    # The claims of delayed_due promoted delayed jobs, and the claim's plans read a delayed index in every state.
    assert any(points[2][path]["promoted"] > 0 for path in ("pgqueue_pop", "claim_next_jobs_projects"))
    for point in result["series"]["explain"]["points"]:
        assert any(scan["index"] in DELAYED_INDEXES for scan in point["claim_project"]["scans"])


@pytest.mark.timeout(60)
def test_quick_tickstats_suite_writes_its_series(database_url, tmp_path):
    # The node's tick with and without its running jobs' stats (quick: 4 and 16 jobs, 40 ticks each): a few seconds.
    output = tmp_path / "results.json"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SCRAPYD_")}
    command = [sys.executable, "-m", "bench", "--quick", "--suites", "tickstats", "--database-url", database_url,
               "--output", str(output)]

    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=50)

    assert completed.returncode == 0, completed.stderr[-4000:]
    points = json.loads(output.read_text())["suites"]["tickstats"]["series"]["ticks"]["points"]
    assert [point["running"] for point in points] == [4, 16]
    for point in points:  # every tick wrote its jobs' stats (the suite checks each tick's count), most of them HOT
        assert point["rows_updated"] >= 40 * point["running"] and point["hot_updates"] > 0
        assert point["with_stats"]["wal_bytes_per_tick"] > point["without_stats"]["wal_bytes_per_tick"]


@pytest.mark.timeout(120)
def test_quick_frontierstore_suite_writes_its_series(database_url, tmp_path):
    # The frontier's store at 1,000 and 50,000 queued requests (quick): about 30 s.
    output = tmp_path / "results.json"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("SCRAPYD_")}
    command = [sys.executable, "-m", "bench", "--quick", "--suites", "frontierstore", "--database-url", database_url,
               "--output", str(output)]

    completed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=110)

    assert completed.returncode == 0, completed.stderr[-4000:]
    series = json.loads(output.read_text())["suites"]["frontierstore"]["series"]
    assert {point["queued"] for point in series["lease"]["points"]} == {1_000, 50_000}
    assert all(point["steps"] > 0 and point["requests"] > 0 for point in series["lease"]["points"])
    assert series["sizes"]["queued"] == 50_000 and series["sizes"]["bytes_per_request"] > 300  # the blob and more
