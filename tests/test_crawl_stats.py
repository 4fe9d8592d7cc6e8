"""Stats with every job: real nodes run real crawls of the example project, cold and warm; what the crawls yielded
(their feeds, their own records) is what every node reports in listjobs.json, stats.json, /jobs and /metrics. A
crawl that floods its stats descriptor costs its node, its row and its stats.json no more than the caps of
node/crawl_stats.py, and still reports its progress."""

from __future__ import annotations

import json
import math
import re
import urllib.request
from pathlib import Path

import pytest

from scrapyd_pgqueue.crawl_process.job_stats import SUMMARY_KEYS
from scrapyd_pgqueue.database.throttled_log import ThrottledLog
from scrapyd_pgqueue.local.cluster import NODE_CONFIG
from scrapyd_pgqueue.node import crawl_stats
from scrapyd_pgqueue.node.crawl_stats import KEYS_DROPPED, MAX_KEYS, MAX_STATS_BYTES, CrawlStats
from tests.helpers import ends, jobs, parent_pid, query, spawner_pid, wait_for

COLD, WARM = {"warm_start": "off"}, {"warm_start": "on"}
# Nodes that also bake in the intruder project (example.intruder_settings), with its stats_flood spider.
INTRUDER_CONFIG = NODE_CONFIG.read_text().rstrip("\n") + "\nintruder = example.intruder_settings\n"


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
    assert headers[-6:] == ["Outcome", "Items scraped", "Errors", "Finish reason", "Tags", "Crawl"]
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
    forked = parent_pid(pid) != spawner_pid(node)
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


# --- what a node keeps of a crawl's stats --------------------------------------------------------------------------


def line(event, stats, **extra) -> bytes:
    return json.dumps({"event": event, "stats": stats, **extra}).encode() + b"\n"


@pytest.fixture
def said(monkeypatch) -> list[str]:
    """What the node's throttled log says about stats, from a fresh throttle."""
    messages = []
    monkeypatch.setattr(crawl_stats, "trouble", ThrottledLog(messages.append))
    return messages


SCRAPY_S = {"start_time": "2026-11-27T15:02:11.418263+00:00", "downloader/request_count": 3,
            "response_received_count": 3, "item_scraped_count": 5, "memusage/max": 61_000_000,
            "elapsed_time_seconds": 2.5, "log_count/INFO": 10, "items_per_minute": None}


def test_of_each_message_only_scrapy_like_stats_are_kept(said):
    crawl = CrawlStats("p", "s")
    odd = {"nested": {"a": {"b": 1}}, "list": [1, 2], "text": "not a date", "long": "x" * 10_000, "flag": True,
           "nan": math.nan, "huge": 10 ** 30, "k" * 201: 1, "nul\x00": 1, "\ud800": 1,
           "date\x00": "2026-11-27T15:02:11\x00", "feedexport/success_count/FileFeedStorage": 1}
    crawl.receive(line("progress", {**SCRAPY_S, **odd}))  # NaN as Python's json writes it
    assert crawl.stats == {**SCRAPY_S, "feedexport/success_count/FileFeedStorage": 1, KEYS_DROPPED: len(odd) - 1}
    assert crawl.keys_dropped == len(odd) - 1 and crawl.dropped == 0 and crawl.progress == (3, 3, 5)
    (message,) = said
    assert f"Dropped {len(odd) - 1} of the {len(SCRAPY_S) + len(odd)} keys of a stats message of a crawl of p/s" in (
        message)

    crawl.receive(line("closed", {**SCRAPY_S, "finish_time": "2026-11-27T15:02:14+00:00"}, reason="r" * 1000 + "\x00"))
    assert crawl.finish_reason == crawl.stats["finish_reason"] == "r" * 200
    assert KEYS_DROPPED not in crawl.stats  # this message lost nothing
    json.dumps(crawl.stats, allow_nan=False).encode()  # as jsonb takes it
    assert said == [message]


def test_a_flood_is_capped_in_keys_and_bytes_and_still_reports_progress_and_is_said_once(said):
    crawl = CrawlStats("p", "s")
    flood = {f"flood/{j}": j for j in range(6_000)}
    crawl.receive(line("progress", {**flood, **SCRAPY_S}))  # Scrapy's own after the flood: the summary survives
    assert len(crawl.stats) == MAX_KEYS + 1 and crawl.stats[KEYS_DROPPED] == 6_000 + len(SCRAPY_S) - MAX_KEYS
    assert crawl.progress == (3, 3, 5) and crawl.stats["start_time"] == SCRAPY_S["start_time"]
    assert crawl.stats["elapsed_time_seconds"] == 2.5 and "log_count/INFO" not in crawl.stats  # over the cap

    long_keys = {f"{j:0>190}": j for j in range(1_000)}  # ~200 bytes each: the byte cap bites first
    crawl.receive(line("progress", {**SCRAPY_S, **long_keys}))
    assert len(json.dumps(crawl.stats, separators=(",", ":"))) <= MAX_STATS_BYTES < 200 * 1_000
    assert crawl.progress == (3, 3, 5) and len(crawl.stats) > 300

    for number in range(150):  # "counts": its summary keys alone are merged, new keys or not
        crawl.receive(line("counts", {**{f"flood/{number}/{j}": {"n": j} for j in range(600)},
                                      "downloader/request_count": 4 + number}))
    assert len(crawl.stats) <= MAX_KEYS + 1 and crawl.stats["downloader/request_count"] == 153
    assert crawl.stats[KEYS_DROPPED] == 1_000 + len(SCRAPY_S) - len(crawl.stats) + 1 + 150 * 600
    assert crawl.progress == (153, 3, 5) and crawl.dropped == 0
    assert len(said) == 1 and crawl.keys_dropped == 6_000 + len(SCRAPY_S) - MAX_KEYS + (
        1_000 + len(SCRAPY_S) + 1 - len(crawl.stats)) + 150 * 600


def test_scrapy_s_own_messages_lose_nothing(said):
    crawl = CrawlStats("p", "s")
    crawl.receive(line("opened", SCRAPY_S))
    crawl.receive(line("counts", {key: SCRAPY_S[key] for key in SUMMARY_KEYS if key in SCRAPY_S}))
    crawl.receive(line("progress", SCRAPY_S))
    crawl.receive(line("closed", {**SCRAPY_S, "finish_reason": "finished"}, reason="finished"))
    assert crawl.stats == {**SCRAPY_S, "finish_reason": "finished"} and said == [] and crawl.keys_dropped == 0


# --- a flood on a real node ---------------------------------------------------------------------------------------

FLOOD_SAID = "keys of a stats message of a crawl of intruder/stats_flood"


def rss(pid: int) -> int:
    """Resident bytes of a process (/proc/<pid>/status VmRSS)."""
    (kilobytes,) = re.findall(r"^VmRSS:\s+(\d+) kB$", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
    return int(kilobytes) * 1024


def test_a_stats_flood_leaves_the_node_within_20_mb_of_idle_and_a_small_row_with_scrapy_s_counters(
        database_url, start_cluster, tmp_path):
    (node,) = start_cluster(database_url, 1, base_config=INTRUDER_CONFIG).nodes
    pid = node.process.pid

    def ended(job):
        return jobs(database_url, job)[job][:2] == ("terminated", "finished")

    # An ordinary crawl of the same spider first: the node's imports and paths are warm when idle is measured.
    answer = node.post("schedule.json", project="intruder", spider="stats_flood", jobid="calm", lines="0",
                       counters="0")
    assert answer["status"] == "ok", answer
    wait_for(lambda: ended("calm"), 60, "the ordinary crawl to end")
    assert "a crawl of intruder/stats_flood" not in node.logfile.read_text()  # Scrapy's own stats lose nothing
    idle = rss(pid)

    answer = node.post("schedule.json", project="intruder", spider="stats_flood", jobid="flood")
    assert answer["status"] == "ok", answer
    peak = [idle]

    def flood_ended():
        peak.append(rss(pid))
        return ended("flood")

    wait_for(flood_ended, 120, "the flood to end")
    after = rss(pid)
    print(f"\nnode RSS: idle {idle / 2**20:.1f} MB, peak {max(peak) / 2**20:.1f} MB, after {after / 2**20:.1f} MB")
    (record,) = [json.loads(text) for text in (tmp_path / "records" / "stats_floods.jsonl").read_text().splitlines()
                 if json.loads(text)["job"] == "flood"]
    assert record["lines"] == 150 and record["bytes"] > 150 * 250_000  # the whole flood was written
    assert after - idle < 20 * 2**20

    (size, stats), = query(database_url, "SELECT length(stats::text), stats FROM spider_job WHERE job = 'flood'")
    assert size < 100_000, size
    assert stats["finish_reason"] == "finished" and re.match(r"\d{4}-\d\d-\d\dT", stats["start_time"])
    assert stats["downloader/request_count"] == stats["response_received_count"] == 1
    assert isinstance(stats["elapsed_time_seconds"], float) and stats["finish_time"] > stats["start_time"]
    assert stats[KEYS_DROPPED] > 2_000 and len(stats) <= MAX_KEYS + 1  # Scrapy's and the first of its 3,000
    assert not any(isinstance(value, (dict, list)) or value == "text" for value in stats.values())
    answer = node.get("listjobs.json", project="intruder")
    (entry,) = [entry for entry in answer["finished"] if entry["id"] == "flood"]
    assert (entry["requests"], entry["items"], entry["errors"], entry["finish_reason"]) == (1, 0, 0, "finished")
    served = node.get("stats.json", project="intruder", job="flood")
    assert served["stats"] == stats and len(json.dumps(served)) < 100_000

    log = node.logfile.read_text()
    assert log.count(FLOOD_SAID) == 1 and re.search(rf"Dropped \d+ of the \d+ {FLOOD_SAID}", log)
