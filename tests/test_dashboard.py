"""/dashboard in a real browser shows the numbers the database holds; its queries stay bounded with a large backlog
(their plans read indexes, never the whole table)."""

from __future__ import annotations

import json

import pytest
from selenium.webdriver.common.by import By

from helpers import csp_violations, jobs, query, runs_of, schedule, screenshot, table_rows, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.sql import text
from scrapyd_pgqueue.store import COUNT_CAP, OverviewStore, overview

BACKLOG = 126_000  # 21 spiders of 6,000: each counted exactly, under the cap


def test_the_dashboard_shows_what_the_database_holds(database_url, start_cluster, browser, artifacts, tmp_path):
    cluster = start_cluster(database_url, 3, max_proc="1")
    node1, node2, node3 = cluster.nodes
    schedule(node1, "broken", fail="1")
    wait_for(lambda: jobs(database_url, "broken")["broken"][:2] == ("terminated", "failed"), 60, "a failed crawl")
    for blocker in ("b1", "b2", "b3"):
        schedule(node1, blocker, seconds="300")
    wait_for(lambda: len(query(database_url, "SELECT 1 FROM spider_job WHERE status = 'ongoing' AND pid IS NOT NULL"))
             == 3, 60, "every slot of the cluster busy")
    for index in range(4):
        schedule(node1, f"waiting-{index}")
    schedule(node1, "quote-waiting", spider="quotes")

    browser.get(f"{node2.url}dashboard")
    summary = {key: browser.find_element(By.ID, key).text for key in ("live-nodes", "pending-total", "running-total")}
    assert summary == {"live-nodes": "3", "pending-total": "5", "running-total": "3"}
    assert browser.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')  # refreshes itself

    by_node = dict(query(database_url, "SELECT node, count(*) FROM spider_job WHERE status = 'ongoing' GROUP BY node"))
    nodes = {row[0]: row for row in table_rows(browser, "nodes") if row}
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for name, row in nodes.items():
        assert row[1] == "live" and row[3] == str(by_node.get(name, 0)) and row[4] == str(1 - by_node.get(name, 0))

    expected = {
        (project, spider, state): count
        for project, spider, state, count in query(database_url, """
            SELECT project, spider, CASE status WHEN 'ongoing' THEN 'running' ELSE status END, count(*)
            FROM spider_job WHERE status IN ('pending', 'ongoing') GROUP BY 1, 2, 3""")
    }
    headers = [th.text.lower() for th in browser.find_elements(By.CSS_SELECTOR, "#depth thead th")]
    shown = {}
    for row in table_rows(browser, "depth"):
        for state in ("pending", "running"):
            if row and row[headers.index(state)] != "0":
                shown[(row[0], row[1], state)] = int(row[headers.index(state)])
    assert shown == expected

    failure = table_rows(browser, "failures")[1]
    assert failure[:4] == ["example", "sleeper", "broken", "failed"]
    assert json.loads(browser.find_element(By.ID, "chart-failed").get_attribute("data-total")) == 1
    screenshot(browser, artifacts, "dashboard")
    assert csp_violations(browser) == []  # drawn as it is without anything the pages' policy refuses
    browser.find_element(By.XPATH, "//table[@id='failures']//a[text()='Log']").click()
    assert "asked to fail" in browser.find_element(By.TAG_NAME, "body").text  # the stored log, served by node 2
    assert len(runs_of(tmp_path, "broken")) == 1


@pytest.fixture
def backlog_url(database_url, admin_connection):
    """A database with BACKLOG pending jobs over a few spiders and priorities, vacuumed as autovacuum would."""
    db.get_engine(database_url)  # the schema
    with admin_connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO spider_job (project, spider, job, message, priority, created_time, run_at)
            SELECT 'p' || mod(i, 3), 's' || mod(i, 7), 'j' || i, jsonb_build_object('name', 's' || mod(i, 7)), mod(i, 5),
                   localtimestamp - make_interval(secs => i), now() - make_interval(secs => i)
            FROM generate_series(1, %s) AS i""", (BACKLOG,))
        cursor.execute("VACUUM ANALYZE spider_job")
    return database_url


def test_the_overview_reads_indexes_whatever_the_backlog(backlog_url):
    store = OverviewStore.for_url(backlog_url)
    params = {"cap": COUNT_CAP, "spiders": overview.MAX_SPIDERS, "since": "2000-01-01"}
    with store.engine.connect() as connection:
        for name in ("PENDING_BY_SPIDER", "DELAYED_BY_SPIDER", "RUNNING_BY_SPIDER", "OUTCOMES_BY_SPIDER", "PER_MINUTE",
                     "OLDEST_KEPT", "OLDEST_PENDING_AGE", "ANY_DELAYED", "ITEMS_BY_SPIDER"):
            plan = connection.execute(text("EXPLAIN " + getattr(overview, name).text), params).scalars().all()
            assert not any("Seq Scan on spider_job" in line for line in plan), (name, plan)

    depths = store.depth_by_spider()
    assert len(depths) == 21 and all(d.counts["pending"] == BACKLOG // 21 for d in depths)  # under the cap: exact
    assert store.oldest_pending_age() >= BACKLOG - 5  # the oldest was due BACKLOG seconds ago
