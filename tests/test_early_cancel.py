"""A crawl cancelled at any moment of its start, before Scrapy's own signal handlers are in place or after, ends
cancelled and quietly: no traceback in its log, no "Process died" in its node's (real nodes, cold and warm)."""

from __future__ import annotations

import time

import pytest

from helpers import jobs, query, schedule, wait_for

# Seconds from the crawl's pid being known to its cancel: from its first instructions to its spider running.
CANCEL_AFTER = (0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8, 1.6)


@pytest.mark.parametrize("warm_start", ["off", "on"])
def test_a_crawl_cancelled_at_any_moment_of_its_start_ends_cancelled_without_a_traceback(
        database_url, start_cluster, warm_start):
    (node,) = start_cluster(database_url, 1, max_proc="2", warm_start=warm_start).nodes
    if warm_start == "on":  # a warm process ready: the crawls below are forked from it
        schedule(node, "warm-up", seconds="0")
        wait_for(lambda: "ready in" in node.logfile.read_text(), 60, "the warm process")
    for index, delay in enumerate(CANCEL_AFTER):
        job = f"cancel-{index}"
        schedule(node, job, seconds="3")  # long enough for every cancel, short once Scrapy's shutdown waits for it
        wait_for(lambda: query(database_url, "SELECT pid FROM spider_job WHERE job = %s", (job,))[0][0], 30,
                 "its pid", interval=0.002)
        time.sleep(delay)  # the moment of its start the cancel reaches
        assert node.post("cancel.json", project="example", job=job)["status"] == "ok"
        wait_for(lambda: jobs(database_url, job)[job][0] == "terminated", 30, f"{job} to end")

    outcomes = {job: state[1] for job, state in jobs(database_url, *(f"cancel-{i}" for i in range(len(CANCEL_AFTER))))
                .items()}
    assert set(outcomes.values()) == {"cancelled"}, outcomes
    node_log = node.logfile.read_text()
    assert "Process died" not in node_log and "Traceback" not in node_log
    for log in node.directory.glob("logs/example/sleeper/cancel-*.log"):
        text = log.read_text(errors="replace")
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, (log.name, text[-2000:])
