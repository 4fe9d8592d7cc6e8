"""The delayed suite's table: claim latency per path and state, and what each claim's statements read."""

from __future__ import annotations

from bench import report
from bench.stats import ratio
from bench.suites.delayed.explain import DELAYED_INDEXES, EXPLAINED, _delayed_index_blocks
from bench.suites.delayed.figures import empty_reference
from bench.suites.delayed.settings import CLAIM_PATHS, COMPARED, PERCENTILES, SCENARIOS


def format_table(result: dict) -> str:
    parameters = result["parameters"]
    points = {point["scenario"]: point for point in result["series"]["claim_latency"]["points"]}
    rows = []
    for path in CLAIM_PATHS:
        for scenario in SCENARIOS:
            figures = points[scenario][path]
            ratios = [report.number(ratio(figures[key], empty_reference(points, path, key)), 2)
                      if scenario in COMPARED else "" for key in PERCENTILES]
            rows.append([path, scenario, *(report.number(figures[key], 3) for key in ("p50_ms", "p99_ms", "mean_ms")),
                         str(figures["samples"]), str(figures["promoted"]) if "promoted" in figures else "", *ratios])
    explain_rows = []
    for point in result["series"]["explain"]["points"]:
        for statement, _ in EXPLAINED:
            explained = point[statement]
            delayed_scans = [scan for scan in explained["scans"] if scan["index"] in DELAYED_INDEXES]
            explain_rows.append([
                point["scenario"], statement,
                report.number(explained["shared_hit"] + explained["shared_read"]),
                report.number(explained["shared_read"]),
                report.number(_delayed_index_blocks(explained)),
                " + ".join(f"{scan['node'].replace(' Scan', '')} {scan['shared_hit'] + scan['shared_read']}"
                           for scan in delayed_scans) or "-",
                report.number(explained["execution_ms"], 3),
            ])
    return report.table_text(result, [
        report.heading("Delayed"),
        f"one claimer; {parameters['latency_samples']:,} timed claims per path and state; {parameters['pending_jobs']:,} "
        f"pending jobs over {len(parameters['projects'])} projects kept constant; 'delayed': + "
        f"{parameters['delayed_counted']:,} delayed jobs due in 1 h to 3 days (inserted in "
        f"{parameters['delayed_fill_seconds']:.1f} s); 'delayed_due': + {parameters['due_jobs_per_path']} more per path "
        "falling due during its measurement; 'empty_again': delayed jobs removed",
        report.format_rows(["claim path", "table", "p50 ms", "p99 ms", "mean ms", "samples", "promoted",
                            "p50 / empty", "p99 / empty"], rows),
        "x / empty: over the mean of 'empty' and 'empty_again' (measured before and after); same table twice, "
        "empty_again / empty (p50, p99): " + ", ".join(
            f"{path} {ratio(points['empty_again'][path]['p50_ms'], points['empty'][path]['p50_ms']):.2f}, "
            f"{ratio(points['empty_again'][path]['p99_ms'], points['empty'][path]['p99_ms']):.2f}"
            for path in CLAIM_PATHS),
        "",
        "Each statement of one claim explained (auto_explain: ANALYZE, BUFFERS; rolled back), shared buffers summed; "
        "pop() and claim_next_jobs([p]) send claim_project, claim_next_jobs(5 projects) claim_projects",
        report.format_rows(["table", "statement", "buffers", "read", "delayed idx", "delayed idx scans",
                            "exec ms"], explain_rows),
        "",
    ])
