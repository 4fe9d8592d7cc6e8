"""/metrics, read with Prometheus's own parser: the cluster's gauges match the database, this node's counters match
the crawls it ran, and no label names a job."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from helpers import jobs, query, runs_of, schedule, scrape, value, wait_for
from scrapyd_pgqueue.web.prometheus import documented_metrics


def exported(node) -> set[tuple[str, str]]:
    """(name as exposed, type) of every metric family of one scrape."""
    with urllib.request.urlopen(f"{node.url}metrics", timeout=30) as response:
        families = text_string_to_metric_families(response.read().decode())
    return {(family.name + ("_total" if family.type == "counter" else ""), family.type) for family in families}


def test_metrics_match_the_database_and_the_node_s_crawls(database_url, start_cluster, tmp_path):
    (node,) = start_cluster(database_url, 1, max_proc="1").nodes
    schedule(node, "quick")
    schedule(node, "broken", fail="1")
    wait_for(lambda: [state[0] for state in jobs(database_url, "quick", "broken").values()] == ["terminated"] * 2,
             60, "two crawls to end")
    schedule(node, "blocker", seconds="300")
    wait_for(lambda: runs_of(tmp_path, "blocker"), 60, "the node's only slot busy")
    for index in range(3):
        schedule(node, f"waiting-{index}")
    schedule(node, "quote", spider="quotes", priority="-1")

    samples = scrape(node)
    assert value(samples, "scrapyd_pgqueue_cluster_up") == 1
    assert value(samples, "scrapyd_pgqueue_live_nodes") == 1
    assert value(samples, "scrapyd_pgqueue_pending_jobs") == 4
    assert value(samples, "scrapyd_pgqueue_running_jobs") == 1
    rows = query(database_url, """
        SELECT project, spider, CASE status WHEN 'ongoing' THEN 'running' ELSE status END, count(*) FROM spider_job
        WHERE status IN ('pending', 'ongoing') GROUP BY 1, 2, 3""")
    gauges = {key: v for key, v in samples.items() if key[0] == "scrapyd_pgqueue_jobs"}
    assert gauges == {("scrapyd_pgqueue_jobs", frozenset({"project": p, "spider": s, "state": st}.items())): c
                      for p, s, st, c in rows}
    ((age,),) = query(database_url,
                      "SELECT extract(epoch FROM now() - min(run_at)) FROM spider_job WHERE status = 'pending'")
    assert abs(value(samples, "scrapyd_pgqueue_oldest_pending_age_seconds") - float(age)) < 5
    assert value(samples, "scrapyd_pgqueue_past_due_jobs") == 0
    assert value(samples, "scrapyd_pgqueue_wanted_nodes") == 5  # 1 running and 4 due jobs, 1 slot a node

    # This node's own: three claims and crawls, one finished, one failed, a latency observed for each start.
    assert value(samples, "scrapyd_pgqueue_claims_total") == 3
    assert value(samples, "scrapyd_pgqueue_crawls_started_total") == 3
    assert value(samples, "scrapyd_pgqueue_crawls_ended_total", outcome="finished") == 1
    assert value(samples, "scrapyd_pgqueue_crawls_ended_total", outcome="failed") == 1
    observed = wait_for(lambda: value(scrape(node), "scrapyd_pgqueue_schedule_to_start_seconds_count") == 3 or None,
                        10, "three latencies observed")
    assert observed
    assert value(samples, "scrapyd_pgqueue_database_errors_total", operation="claim") == 0
    assert not any(label in ("job", "id", "jobid") for _, labels in samples for label, _ in labels)
    # The reference page (docs/reference/metrics.md) lists exactly what a node exports.
    assert exported(node) == {(name, kind) for name, kind, _, _ in documented_metrics()}
    node.post("cancel.json", project="example", job="blocker")
