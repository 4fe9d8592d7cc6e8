"""/jobs in a real browser against three real nodes: a job scheduled through node 1 and running on node 3 is listed on
node 2 with its node, and node 2's Cancel button stops it; pending jobs in run order; cancelled pending jobs without
a start; job ids and arguments from users shown as text, never run; a page parameter out of range or malformed
answers a 400 page with the reason (/jobs and /dashboard alike); a crawl spread over workers on /dashboard and each of
its workers' rows of /jobs."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
import requests
from selenium.webdriver.common.by import By

from helpers import (
    CLAIM_AT_START_ONLY,
    SiteServer,
    csp_violations,
    jobs,
    query,
    runs_of,
    schedule,
    screenshot,
    table_rows,
    wait_for,
)

STOCK = ["Project", "Spider", "Job", "PID", "Start", "Runtime", "Finish", "Log"]
INJECTED_JOB = "<img src=x onerror=window.injected=1>"


@pytest.fixture
def cluster(database_url, start_cluster):
    """Nodes 1 and 2 claim only at start-up: every job scheduled later runs on node 3."""
    return start_cluster(database_url, 3, max_proc="1",
                         node_config={"node1": CLAIM_AT_START_ONLY, "node2": CLAIM_AT_START_ONLY})


def section_rows(browser, section: str) -> list[dict[str, str]]:
    """The rows of one section (Pending, Running, Finished) of /jobs as {header: cell text}."""
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#jobs thead th")]
    body = browser.find_element(By.XPATH, f"//table[@id='jobs']/tbody[tr/th[text()='{section}']]")
    return [
        dict(zip(headers, (cell.text for cell in row.find_elements(By.TAG_NAME, "td"))))
        for row in body.find_elements(By.XPATH, "tr[td]")
    ]


def row_of(browser, job: str):
    return browser.find_element(By.XPATH, f"//table[@id='jobs']//tr[td[3][text()={xpath_literal(job)}]]")


def xpath_literal(value: str) -> str:
    return f"'{value}'" if "'" not in value else f'"{value}"'


def test_a_job_scheduled_on_node1_running_on_node3_is_cancelled_from_node2s_page(
    cluster, database_url, browser, artifacts, tmp_path
):
    node1, node2, node3 = cluster.nodes
    schedule(node1, "steered", seconds="300")
    run = wait_for(lambda: runs_of(tmp_path, "steered"), 60, "the crawl's own record")[0]
    assert run["node"] == "node3"

    browser.get(f"{node2.url}jobs")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Jobs"
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#jobs thead th")]
    # Scrapyd's columns first, ours after them (ScrapydWeb reads by position), the job's stats last.
    assert headers == [*STOCK, "Cancel", "Node", "Outcome", "Items scraped", "Errors", "Finish reason", "Tags",
                       "Crawl"]
    running = {row["Job"]: row for row in section_rows(browser, "Running")}
    assert running["steered"]["Node"] == "node3" and running["steered"]["PID"] == str(run["pid"])
    assert running["steered"]["Crawl"] == ""  # a job of its own, no worker of a crawl
    log = row_of(browser, "steered").find_element(By.LINK_TEXT, "Log").get_attribute("href")
    assert log == f"{node3.url}logs/example/sleeper/steered.log"
    screenshot(browser, artifacts, "jobs-running-on-node3")

    # As in Scrapyd, the first Cancel asks Scrapy to shut down gracefully (it waits for the sleeping callback), the
    # second forces it: a person clicks twice.
    # Only once the callback sleeps: a graceful shutdown asked before the page is fetched ends the crawl at once,
    # and a second click could then come before its end is recorded, for a crawl that is no more.
    steered_log = node3.directory / "logs" / "example" / "sleeper" / "steered.log"
    wait_for(lambda: "Sleeping in the callback" in steered_log.read_text(), 30, "the crawl's callback to sleep")
    for click, delivered in enumerate(("Received SIGINT, shutting down gracefully", "Received SIGINT twice")):
        if click:
            browser.get(f"{node2.url}jobs")
        row_of(browser, "steered").find_element(By.CSS_SELECTOR, "input[type=submit][value=Cancel]").click()
        browser.switch_to.alert.accept()  # Scrapyd's "Are you sure?"
        wait_for(lambda: "cancel.json" in browser.current_url, 10, "the cancel form to be sent")
        assert '"prevstate": "running"' in browser.page_source
        wait_for(lambda: delivered in steered_log.read_text(), 30, f"node 3 to signal the crawl ({delivered})")
    wait_for(lambda: jobs(database_url, "steered")["steered"][:2] == ("terminated", "cancelled"), 60,
             "the crawl on node 3 to end as cancelled")
    assert len(runs_of(tmp_path, "steered")) == 1  # it ran once, on node 3, and was stopped there

    browser.get(f"{node2.url}jobs")
    finished = {row["Job"]: row for row in section_rows(browser, "Finished")}
    assert finished["steered"]["Outcome"] == "cancelled" and finished["steered"]["Node"] == "node3"
    screenshot(browser, artifacts, "jobs-cancelled")
    assert csp_violations(browser) == []  # the Cancel buttons' confirmation is the one script the policy allows


def test_pending_jobs_in_run_order_cancelled_ones_without_start_and_user_text_escaped(
    cluster, database_url, browser, artifacts, tmp_path
):
    node1, node2, node3 = cluster.nodes
    schedule(node1, "blocker", seconds="300")
    wait_for(lambda: runs_of(tmp_path, "blocker"), 60, "node 3's only slot to be busy")
    schedule(node1, "low", priority="1")
    schedule(node1, INJECTED_JOB, note="<script>window.injected=2</script>", priority="2")
    schedule(node1, "gone", priority="3")
    assert node2.post("cancel.json", project="example", job="gone")["prevstate"] == "pending"

    browser.get(f"{node2.url}jobs")
    assert [row["Job"] for row in section_rows(browser, "Pending")] == [INJECTED_JOB, "low"]  # run order
    assert browser.execute_script("return window.injected") is None  # shown as text, never run
    assert "<script>window.injected" not in browser.page_source
    assert "Pending jobs 1–2 of 2" in browser.find_element(By.ID, "pending-note").text
    gone = {row["Job"]: row for row in section_rows(browser, "Finished")}["gone"]
    assert gone["Outcome"] == "cancelled" and gone["Start"] == "" and gone["Runtime"] == "" and gone["Node"] == ""
    assert gone["Finish"]
    screenshot(browser, artifacts, "jobs-pending")

    # The injected job's Cancel button sends its id back unchanged.
    row_of(browser, INJECTED_JOB).find_element(By.CSS_SELECTOR, "input[value=Cancel]").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: "cancel.json" in browser.current_url, 10, "the cancel form to be sent")
    assert jobs(database_url, INJECTED_JOB)[INJECTED_JOB][:2] == ("terminated", "cancelled")
    node2.post("cancel.json", project="example", job="blocker")


@pytest.mark.parametrize("hostile", ['"><script>window.injected=3</script>', "//evil.example", "/a b", "javascript:x"])
def test_a_forwarded_prefix_is_put_in_links_only_when_it_is_a_path(database_url, start_cluster, hostile):
    [node] = start_cluster(database_url, 1).nodes
    for page in ("", "jobs", "dashboard"):  # Scrapyd's home page, and the cluster's
        behind_a_proxy = requests.get(f"{node.url}{page}", headers={"X-Forwarded-Prefix": "/scrapyd/"}, timeout=30)
        assert 'href="/scrapyd/' in behind_a_proxy.text and 'href="/scrapyd//' not in behind_a_proxy.text
        served = requests.get(f"{node.url}{page}", headers={"X-Forwarded-Prefix": hostile}, timeout=30)
        assert served.status_code == 200
        assert hostile not in served.text and "evil.example" not in served.text and 'href="/' in served.text


BAD_PAGE_PARAMETERS = [
    ("jobs", "pending_offset", "100000000000000000000", "0 to 4,611,686,018,427,387,904"),
    ("jobs", "pending_offset", "-1", "0 to 4,611,686,018,427,387,904"),
    ("jobs", "pending_offset", "<script>window.injected=3</script>", "0 to 4,611,686,018,427,387,904"),
    ("dashboard", "hours", "0", "1 to 48"),
    ("dashboard", "hours", "49", "1 to 48"),
    ("dashboard", "hours", "three", "1 to 48"),
]


def test_a_page_parameter_out_of_range_or_malformed_answers_400_with_the_reason(database_url, start_cluster, browser):
    (node,) = start_cluster(database_url, 1).nodes
    for page, parameter, given, accepted in BAD_PAGE_PARAMETERS:
        url = f"{node.url}{page}?{urlencode({parameter: given})}"
        answer = requests.get(url, timeout=30)
        assert (answer.status_code, answer.headers["Content-Type"]) == (400, "text/html; charset=utf-8"), url
        browser.get(url)
        assert browser.find_element(By.TAG_NAME, "h1").text == "Bad request"
        assert browser.find_element(By.TAG_NAME, "p").text == f"{parameter} must be a whole number from {accepted}, " \
                                                             f"not {given!r}"
        assert browser.execute_script("return window.injected") is None  # shown as text, never run

    # In range: the page as asked, with no number nobody asked for.
    browser.get(f"{node.url}jobs?pending_offset=4611686018427387904")
    assert browser.find_element(By.ID, "pending-note").text == (
        "No pending jobs from 4,611,686,018,427,387,905 on: 0 in all. first page")
    browser.find_element(By.LINK_TEXT, "first page").click()
    assert "of 0, in the order they will run" in browser.find_element(By.ID, "pending-note").text
    assert requests.get(f"{node.url}dashboard?hours=48", timeout=30).status_code == 200
    # listjobs.json keeps its JSON error.
    assert node.get("listjobs.json", pending_offset="100000000000000000000") == {
        "status": "error", "message": "pending_offset may be at most 4611686018427387904", "node_name": "node1"}


CRAWL = "<b>wide&co"  # the crawl's id, its first worker's: shown as text, never as markup
SITE_PAGES = 200


def test_a_crawl_spread_over_workers_is_on_the_dashboard_and_each_worker_s_row_of_jobs(
    cluster, database_url, browser, artifacts
):
    node1, node2, node3 = cluster.nodes
    workers = [CRAWL, f"{CRAWL}-2", f"{CRAWL}-3"]
    # Each page links to 4 new ones: requests queue up. Slow enough to be running when the pages are read: node 3's
    # one slot runs one worker, 2 requests in flight at most.
    site_links = {str(i): [str(j) for j in range(4 * i + 1, 4 * i + 5) if j < SITE_PAGES] for i in range(SITE_PAGES)}
    with SiteServer(site_links, delay=0.3) as site:
        answer = node1.post("schedule.json", project="example", spider="site", jobid=CRAWL, site=site.url,
                            _workers="3", setting="CONCURRENT_REQUESTS_PER_DOMAIN=2")
        assert answer["status"] == "ok" and answer["workers"] == workers, answer
        wait_for(lambda: node2.get("crawl.json", project="example", crawl=CRAWL)["done"] >= 3, 60,
                 "the crawl to fetch pages")

        # The dashboard's row, between two reads of crawl.json: stored requests only grow, and so do those done.
        before = node2.get("crawl.json", project="example", crawl=CRAWL)
        browser.get(f"{node2.url}dashboard")
        after = node2.get("crawl.json", project="example", crawl=CRAWL)
        [row] = [row for row in table_rows(browser, "crawls") if row]
        assert row[:4] == [CRAWL, "example", "site", "1 / 3"]  # node 3's one slot runs one worker of three
        queued, in_flight = int(row[4].replace(",", "")), int(row[5])
        assert 0 <= queued <= SITE_PAGES and 0 <= in_flight <= 2
        assert stored(before) - ended(after) <= queued + in_flight <= stored(after) - ended(before)
        assert browser.find_elements(By.CSS_SELECTOR, "#crawls b") == []  # the id's markup shown as text
        screenshot(browser, artifacts, "dashboard-crawls")
        assert csp_violations(browser) == []

        # Every worker's row of /jobs names its crawl, running or pending.
        browser.get(f"{node2.url}jobs")
        running, pending = section_rows(browser, "Running"), section_rows(browser, "Pending")
        assert (len(running), len(pending)) == (1, 2)
        assert sorted((row["Job"], row["Crawl"]) for row in running + pending) == [(job, CRAWL) for job in workers]
        assert browser.find_elements(By.CSS_SELECTOR, "#jobs b") == []
        screenshot(browser, artifacts, "jobs-crawl")

        # The crawl's link reaches its crawl.json, the id quoted in the URL.
        row_of(browser, CRAWL).find_element(By.LINK_TEXT, CRAWL).click()
        assert json.loads(browser.find_element(By.TAG_NAME, "body").text)["crawl"] == CRAWL

        assert node2.post("cancel.json", project="example", job=CRAWL, _tree="1")["status"] == "ok"
        wait_for(lambda: query(database_url, "SELECT count(*) FROM spider_job WHERE job = ANY(%s) "
                                             "AND status = 'terminated'", (workers,))[0][0] == 3, 60,
                 "every worker to end")

    # Ended: off the dashboard, and still named on each finished worker's row.
    browser.get(f"{node2.url}jobs")
    assert sorted((row["Job"], row["Crawl"]) for row in section_rows(browser, "Finished")) == [
        (job, CRAWL) for job in workers]
    browser.get(f"{node2.url}dashboard")
    assert browser.find_element(By.ID, "crawls").text == "No crawl spread over workers is running."


def stored(view: dict) -> int:
    """A crawl.json answer's requests stored in all."""
    return view["queued"] + view["in_flight"] + view["done"] + view["failed"]


def ended(view: dict) -> int:
    return view["done"] + view["failed"]
