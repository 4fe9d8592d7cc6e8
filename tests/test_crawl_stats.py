"""Stats with every job: real nodes run real crawls of the example project, cold and warm; what the crawls yielded
(their feeds, their own records) is what every node reports in listjobs.json, stats.json, /jobs and /metrics."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from tests.helpers import ends, query, wait_for

COLD, WARM = {"warm_start": "off"}, {"warm_start": "on"}


def deploy(node, egg):
    answer = node.post("addversion.json", project="example", version="1", egg=egg.read_bytes())
    assert answer["status"] == "ok", answer


def feed_items(tmp_path, spider, job) -> list[dict]:
    """The items the crawl wrote to its feed (Scrapyd's items_dir): what the spider yielded."""
    path = tmp_path / "items" / "example" / spider / f"{job}.jl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def listed(node, job, state):
    """The job's entry in node's listjobs.json under ``state`` (running or finished), None when not there."""
    answer = node.get("listjobs.json", project="example")
    assert answer["status"] == "ok", answer
    return next((entry for entry in answer[state] if entry["id"] == job), None)


def metric(node, name, **labels) -> float:
    with urllib.request.urlopen(f"{node.url}metrics", timeout=30) as response:
        text = response.read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    found = re.search(rf"^{name}{{{re.escape(wanted)}}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def warm_up(node, url):
    """The first crawl of a project version is cold while its warm process starts; later ones are forked."""
    node.post("schedule.json", project="example", spider="sleeper", jobid="warmup")
    wait_for(lambda: "of project example ready" in node.logfile.read_text(), 60, "the warm process to be ready")
    wait_for(lambda: query(url, "SELECT status FROM spider_job WHERE job = 'warmup'")[0][0] == "terminated", 60,
             "the warm-up crawl to end")


def parent_pid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_a_crawl_s_items_and_finish_reason_are_what_it_yielded_on_a_node_that_did_not_run_it(
        database_url, start_cluster, egg, tmp_path):
    nodes = start_cluster(database_url, 2, items_dir=str(tmp_path / "items"), **COLD).nodes
    deploy(nodes[0], egg)
    assert nodes[0].post("schedule.json", project="example", spider="quotes", jobid="q1")["status"] == "ok"
    wait_for(lambda: query(database_url, "SELECT status FROM spider_job WHERE job = 'q1'")[0][0] == "terminated", 60,
             "q1 to end")
    (ran_on,) = query(database_url, "SELECT node FROM spider_job WHERE job = 'q1'")[0]
    runner, other = sorted(nodes, key=lambda node: node.name != ran_on)

    entry = listed(other, "q1", "finished")

    items = feed_items(tmp_path, "quotes", "q1")
    (end,) = [record for record in ends(tmp_path) if record["job"] == "q1"]
    assert len(items) == 5 and entry["items"] == len(items)
    assert entry["finish_reason"] == end["reason"] == "finished"
    assert entry["requests"] == len({item["page"] for item in items}) == 3  # one request per page
    assert entry["errors"] == 0 and entry["outcome"] == "finished" and entry["node_name"] == runner.name
    # The project's own extension ran beside the node's.
    extension_records = (tmp_path / "records" / "extensions.jsonl").read_text().splitlines()
    assert {"job": "q1", "reason": "finished"} in [json.loads(line) for line in extension_records]

    answer = other.get("stats.json", project="example", job="q1")
    assert answer["status"] == "ok" and answer["node_name"] == other.name, answer
    assert (answer["project"], answer["job"]) == ("example", "q1")
    stats = answer["stats"]
    assert stats["item_scraped_count"] == 5 and stats["finish_reason"] == "finished"
    assert stats["response_received_count"] == 3 and re.match(r"\d{4}-\d\d-\d\dT", stats["start_time"])
    assert isinstance(stats["elapsed_time_seconds"], float)

    # /jobs: the job's stats in the last columns, after every column it had before.
    with urllib.request.urlopen(f"{other.url}jobs", timeout=30) as response:
        page = response.read().decode()
    headers = re.findall(r"<th>([^<]*)</th>", page.split("</thead>")[0])
    (row,) = [row for row in re.findall(r"<tr>(.*?)</tr>", page, re.DOTALL) if "<td>q1</td>" in row]
    cells = dict(zip(headers, re.findall(r"<td>(.*?)</td>", row, re.DOTALL)))
    assert headers[-5:] == ["Outcome", "Items scraped", "Errors", "Finish reason", "Tags"]
    assert (cells["Items scraped"], cells["Errors"], cells["Finish reason"]) == ("5", "0", "finished")

    # The dashboard: items per minute of each spider, over its jobs' run time.
    with urllib.request.urlopen(f"{other.url}dashboard", timeout=30) as response:
        dashboard = response.read().decode()
    (quotes,) = re.findall(r'<tr class="items">(.*?)</tr>', dashboard)
    project, spider, job_count, item_count, per_minute = re.findall(r"<td[^>]*>(.*?)</td>", quotes)
    assert (project, spider, job_count, item_count) == ("example", "quotes", "1", "5") and float(per_minute) > 0

    unknown = other.get("stats.json", project="example", job="nope")
    assert unknown["status"] == "error" and "nope" in unknown["message"], unknown
    assert other.get("stats.json", project="example")["status"] == "error"  # job missing


@pytest.mark.parametrize("starts", ["cold", "warm"])
def test_a_running_crawl_s_items_grow_while_it_runs_and_prints_do_not_mix_in(
        database_url, start_cluster, egg, tmp_path, starts):
    (node,) = start_cluster(database_url, 1, items_dir=str(tmp_path / "items"), stats_interval="0.5",
                            **(WARM if starts == "warm" else COLD)).nodes
    deploy(node, egg)
    if starts == "warm":
        warm_up(node, database_url)
    node.post("schedule.json", project="example", spider="sleeper", jobid="drip", seconds="6", items="12",
              noise="1")
    pid = wait_for(lambda: query(database_url, "SELECT pid FROM spider_job WHERE job = 'drip'")[0][0], 30, "its pid")
    forked = parent_pid(pid) != node.process.pid
    assert forked == (starts == "warm")

    seen = []  # the items listjobs.json gives while the crawl runs, and this node's counter

    def grown():
        entry = listed(node, "drip", "running")
        if entry is None:
            return None
        assert entry["finish_reason"] is None
        seen.append((entry["items"] or 0, metric(node, "scrapyd_pgqueue_items_scraped_total", project="example",
                                            spider="sleeper")))
        return len({items for items, _ in seen if items}) >= 3

    wait_for(grown, 30, "items to grow while the crawl runs", interval=0.3)
    assert [items for items, _ in seen] == sorted(items for items, _ in seen)
    assert 0 < max(items for items, _ in seen) < 12
    assert 0 < max(counter for _, counter in seen) < 12  # the counter moves as the crawl goes

    entry = wait_for(lambda: listed(node, "drip", "finished"), 60, "drip to end")
    assert entry["items"] == len(feed_items(tmp_path, "sleeper", "drip")) == 12
    assert entry["finish_reason"] == "finished" and entry["errors"] == 1
    assert metric(node, "scrapyd_pgqueue_items_scraped_total", project="example", spider="sleeper") == 12 + (
        starts == "warm")  # the warm-up crawl's one item
    assert metric(node, "scrapyd_pgqueue_crawl_errors_total", project="example", spider="sleeper") == 1
    # The forged lines went to the crawl's stdout, which the node logs as the crawl's output.
    assert node.logfile.read_text().count('"reason": "forged"') == 12


def test_a_cancelled_crawl_keeps_its_stats_with_scrapy_s_close_reason(database_url, start_cluster, egg, tmp_path):
    (node,) = start_cluster(database_url, 1, **COLD).nodes
    deploy(node, egg)
    node.post("schedule.json", project="example", spider="sleeper", jobid="stopped", seconds="6")
    log = node.directory / "logs" / "example" / "sleeper" / "stopped.log"
    wait_for(lambda: log.exists() and "Sleeping in the callback" in log.read_text(), 60, "the crawl to sleep")

    assert node.post("cancel.json", project="example", job="stopped")["prevstate"] == "running"

    entry = wait_for(lambda: listed(node, "stopped", "finished"), 60, "the cancelled crawl to end")
    (end,) = [record for record in ends(tmp_path) if record["job"] == "stopped"]
    assert entry["outcome"] == "cancelled" and entry["finish_reason"] == end["reason"] == "shutdown"
    assert entry["requests"] == 1  # its one page; the graceful close waited for the sleeping callback
