"""The spiders of a deployed egg are listed once for the cluster (node/spider_list.py): a node that has just started
checks a schedule against them at the cluster's usual speed, instead of running ``scrapy list`` first (real nodes)."""

from __future__ import annotations

import statistics
import time

from helpers import query, timed

SPIDERS = ["quotes", "site", "sleeper", "stubborn", "ticker"]


def test_a_node_that_just_started_checks_a_schedule_against_the_spiders_listed_once_for_the_cluster(
        database_url, start_cluster, egg):
    first, second = start_cluster(database_url, 2, max_proc="1").nodes
    first.wait_serving()
    answer = first.post("addversion.json", project="deployed", version="1", egg=egg.read_bytes())
    assert answer["status"] == "ok" and answer["spiders"] == len(SPIDERS), answer
    # The deploy listed them (Scrapyd's addversion.json runs `scrapy list`), once, for every node.
    [(spiders,)] = query(database_url, "SELECT s.spiders FROM project_egg_spiders AS s "
                                       "JOIN project_egg AS e ON e.id = s.egg_id WHERE e.project = 'deployed'")
    assert sorted(spiders) == SPIDERS

    assert first.post("schedule.json", project="deployed", spider="sleeper", seconds="0")["status"] == "ok"
    usual = []  # the cluster's usual schedule.json, on a node that has answered one before
    for n in range(20):
        seconds, answer = timed(first, "post", "schedule.json", project="deployed", spider="sleeper", seconds="0",
                                jobid=f"usual-{n}")
        assert answer["status"] == "ok", answer
        usual.append(seconds)
    p99 = statistics.quantiles(usual, n=100)[98]

    second.stop()
    second.start()
    second.wait_ready()
    second.wait_serving()
    time.sleep(1)  # the measure: a schedule 1 s after the node is ready (it reads the spiders meanwhile)
    first_answers = []
    for n in range(3):  # its first schedules
        seconds, answer = timed(second, "post", "schedule.json", project="deployed", spider="sleeper", seconds="0",
                                jobid=f"fresh-{n}")
        assert answer["status"] == "ok", answer
        first_answers.append(seconds)
    print(f"schedule.json: usual p99 {p99 * 1000:.0f} ms; a node just started: "
          f"{[round(s * 1000) for s in first_answers]} ms")
    assert max(first_answers) <= 2 * p99, (first_answers, p99)
    refused = second.post("schedule.json", project="deployed", spider="nope")
    assert refused["status"] == "error" and "spider 'nope' not found" in refused["message"], refused

