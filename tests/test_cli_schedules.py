"""The operator's schedules: ``scrapyd-pgqueue periodic ...`` and ``limit ...``, the periodic jobs' HTTP services on a
real node, and a per-spider limit held by three real nodes with four slots each.

What the crawls record (runs.jsonl, ends.jsonl) is the measure of what ran when.
"""

from __future__ import annotations

import json

import pytest
import requests

from helpers import ends, query, runs, wait_for
from scrapyd_pgqueue import cli

# --- periodic ----------------------------------------------------------------------------------------------------


def test_periodic_add_list_pause_resume_remove(command):
    code, added, _ = command("periodic", "add", "nightly", "--project", "shop", "--spider", "prices", "--cron",
                             "0 3 * * *", "--timezone", "Europe/Paris", "-a", "day=monday", "-s",
                             "DOWNLOAD_DELAY=2", "--priority", "5", "--json")
    assert code == 0 and added["name"] == "nightly" and added["next_fire_time"].endswith("+00:00")
    assert command("periodic", "add", "tick", "--project", "shop", "--spider", "stock", "--every", "30",
                   "--overlap", "queue", "--max-runtime", "20", "--stall-timeout", "10")[0] == 0

    code, listed, _ = command("periodic", "list", "--json")
    nightly, tick = listed["periodic"]
    assert (nightly["name"], nightly["cron"], nightly["timezone"], nightly["every_seconds"]) == (
        "nightly", "0 3 * * *", "Europe/Paris", None
    )
    assert nightly["args"] == {"day": "monday"} and nightly["settings"] == {"DOWNLOAD_DELAY": "2"}
    assert (nightly["priority"], nightly["overlap"], nightly["paused"], nightly["fired"]) == (5.0, "skip", False, 0)
    assert (tick["every_seconds"], tick["overlap"]) == (30.0, "queue")
    assert (tick["max_runtime"], tick["stall_timeout"], nightly["max_runtime"]) == (20.0, 10.0, None)
    code, table, _ = command("periodic", "list", "--project", "shop")
    assert "Periodic jobs: 2" in table and "cron '0 3 * * *' Europe/Paris" in table and "every 30s" in table

    assert command("periodic", "pause", "tick", "--json")[1] == {"name": "tick", "paused": True}
    assert "paused" in command("periodic", "list")[1]
    code, resumed, _ = command("periodic", "resume", "tick", "--json")
    assert code == 0 and resumed["paused"] is False and resumed["next_fire_time"]
    code, out, _ = command("periodic", "remove", "tick")
    assert code == 0 and "removed" in out
    assert [job["name"] for job in command("periodic", "list", "--json")[1]["periodic"]] == ["nightly"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "61 * * * *"], "invalid cron expression '61 * * * *'"),
        (["--cron", "0 3 * * *", "--timezone", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["--every", "0.1"], "every must be at least 1 second"),
        (["--every", "5", "-a", "page"], "-a must be NAME=VALUE"),
        (["--every", "5", "-a", "_job=mine"], "'_job' is reserved"),
        (["--every", "5", "-s", "=1"], "-s must be NAME=VALUE"),
        (["--every", "5", "--max-runtime", "0"], "max_runtime must be more than 0"),
    ],
)
def test_periodic_add_refuses_what_cannot_fire_and_says_why(command, args, message):
    code, out, err = command("periodic", "add", "bad", "--project", "p", "--spider", "s", *args)
    assert code == 1 and message in err and not out
    assert command("periodic", "list", "--json")[1] == {"periodic": []}


def test_a_duplicate_or_missing_name_is_an_error(command, capsys):
    assert command("periodic", "add", "once", "--project", "p", "--spider", "s", "--every", "60")[0] == 0
    code, _, err = command("periodic", "add", "once", "--project", "p", "--spider", "s", "--every", "5")
    assert code == 1 and "a periodic job named 'once' exists already" in err
    for action in ("remove", "pause", "resume"):
        code, _, err = command("periodic", action, "other")
        assert code == 1 and "no periodic job named 'other'" in err, action
    with pytest.raises(SystemExit) as exit_:  # argparse: no --cron nor --every
        cli.main(["periodic", "add", "x", "--project", "p", "--spider", "s", "--database-url", "postgresql://x/y"])
    assert exit_.value.code == 2 and "one of the arguments --cron --every is required" in capsys.readouterr().err


# --- limit -------------------------------------------------------------------------------------------------------


def test_limit_set_list_remove(command, admin_connection):
    assert command("limit", "set", "shop", "prices", "2")[0] == 0
    code, out, _ = command("limit", "set", "shop", "prices", "3", "--json")  # again: changes it
    assert code == 0 and out == {"project": "shop", "spider": "prices", "max_running": 3}
    assert command("limit", "set", "shop", "stock", "1")[0] == 0
    code, listed, _ = command("limit", "list", "--json")
    assert listed == {"limits": [
        {"project": "shop", "spider": "prices", "max_running": 3, "running": 0},
        {"project": "shop", "spider": "stock", "max_running": 1, "running": 0},
    ]}
    assert "MAX RUNNING" in command("limit", "list")[1]
    code, _, err = command("limit", "set", "shop", "prices", "0")
    assert code == 1 and "at least 1" in err
    assert command("limit", "remove", "shop", "stock", "--json")[1]["removed"] is True
    code, _, err = command("limit", "remove", "shop", "stock")
    assert code == 1 and "no limit for spider 'stock' of project 'shop'" in err
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT project, spider, max_running FROM spider_limit")
        assert cursor.fetchall() == [("shop", "prices", 3)]


# --- through real nodes ------------------------------------------------------------------------------------------


def test_periodic_jobs_over_http_in_scrapyd_style(database, start_cluster, tmp_path):
    url, admin_url = database
    [node] = start_cluster(url, 1).nodes
    added = node.post("addperiodic.json", name="soon", project="example", spider="sleeper", every="2",
                      priority="1", setting=["DOWNLOAD_DELAY=0"], tag="http", _max_runtime="60")
    assert added["status"] == "ok" and added["name"] == "soon", added
    [run] = wait_for(lambda: [r for r in runs(tmp_path) if r["args"].get("tag") == "http"], 30, "its first firing")
    assert set(run["args"]) == {"tag", "_job"}  # the periodic job's own fields never reach the spider

    assert node.post("pauseperiodic.json", name="soon")["paused"] is True
    [listed] = node.get("listperiodic.json", project="example")["periodic"]
    assert (listed["name"], listed["every"], listed["paused"], listed["settings"]) == (
        "soon", 2.0, True, {"DOWNLOAD_DELAY": "0"}
    )
    assert query(admin_url, "SELECT DISTINCT max_runtime FROM spider_job WHERE periodic = 'soon'") == [(60.0,)]
    assert listed["fired"] >= 1 and listed["last_job"] and listed["next_fire_time"].endswith("+00:00")
    assert node.post("resumeperiodic.json", name="soon")["paused"] is False
    assert node.post("delperiodic.json", name="soon")["status"] == "ok"
    assert node.get("listperiodic.json")["periodic"] == []

    for fields, message in [
        ({"name": "x", "project": "example", "spider": "nope", "every": "5"}, "spider 'nope' not found"),
        ({"name": "x", "project": "nope", "spider": "sleeper", "every": "5"}, "project 'nope' not found"),
        ({"name": "x", "project": "example", "spider": "sleeper", "cron": "bad"}, "invalid cron expression"),
        ({"name": "x", "project": "example", "spider": "sleeper"}, "give a cron expression or every seconds"),
        ({"project": "example", "spider": "sleeper", "every": "5"}, "'name' parameter is required"),
    ]:
        answer = node.post("addperiodic.json", **fields)
        assert answer["status"] == "error" and message in answer["message"], (fields, answer)
    answer = node.post("delperiodic.json", name="gone")
    assert answer["status"] == "error" and "no periodic job named 'gone'" in answer["message"]
    assert query(admin_url, "SELECT count(*) FROM periodic_job") == [(0,)]


def max_overlap(intervals) -> int:
    """The most intervals (start, end) open at one instant (one ending as another starts: not overlapping)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = open_ = 0
    for _, change in events:
        open_ += change
        most = max(most, open_)
    return most


def test_a_limited_spider_never_overlaps_beyond_its_limit_while_others_fill_the_slots(
    database, start_cluster, tmp_path
):
    url, admin_url = database
    cluster = start_cluster(url, 3, max_proc="4")  # 12 slots
    assert cli.main(["limit", "set", "example", "sleeper", "2", "--database-url", admin_url]) == 0
    # The limited spider's jobs rank first; quotes (three pages 3 s apart: few crawl start-ups to share the two
    # cores with) fill every other slot meanwhile. Three waves of 4 s sleepers: a window long beside a quotes crawl
    # (6 s and more), so the quotes crawls that start within it are counted in tens even when the cores are busy.
    sleepers = [{"spider": "sleeper", "priority": 10, "jobid": f"s{i}", "args": {"seconds": "4"}} for i in range(6)]
    quotes = [{"spider": "quotes", "jobid": f"q{i}", "settings": {"DOWNLOAD_DELAY": "3",
                                                                  "RANDOMIZE_DOWNLOAD_DELAY": "False"}}
              for i in range(40)]
    body = json.dumps({"project": "example", "jobs": sleepers + quotes})
    answer = requests.post(f"{cluster.nodes[0].url}schedule_batch.json", data=body, timeout=60,
                           headers={"Content-Type": "application/json"}).json()
    assert answer["status"] == "ok", answer

    def running():
        return dict(query(admin_url, "SELECT spider, count(*) FROM spider_job WHERE status = 'ongoing' GROUP BY 1"))

    # No head-of-line blocking: all 12 slots busy, 2 with the limited spider, while its next jobs wait.
    busy = wait_for(lambda: (r := running()).get("sleeper") == 2 and sum(r.values()) == 12
                    and query(admin_url, "SELECT count(*) FROM spider_job WHERE spider = 'sleeper' "
                                         "AND status = 'pending'")[0][0] > 0 and r, 60, "every slot busy")
    wait_for(lambda: len([end for end in ends(tmp_path) if end["spider"] == "sleeper"]) == len(sleepers), 120,
             "every sleeper to end")
    query(admin_url, "DELETE FROM spider_job WHERE status = 'pending'")  # the quotes left: the test is over

    started = {run["job"]: run["started"] for run in runs(tmp_path) if run["spider"] == "sleeper"}
    ended = {end["job"]: end["ended"] for end in ends(tmp_path) if end["spider"] == "sleeper"}
    assert started.keys() == ended.keys() == {job["jobid"] for job in sleepers}
    overlap = max_overlap([(started[job], ended[job]) for job in started])
    quotes_during = [run for run in runs(tmp_path) if run["spider"] == "quotes"
                     and min(started.values()) < run["started"] < max(ended.values())]
    print(f"busy {busy}; sleepers overlapped at most {overlap}, over {max(ended.values()) - min(started.values()):.1f}s; "
          f"{len(quotes_during)} quotes crawls started meanwhile")
    assert overlap == 2  # the limit, reached and never passed
    assert len(quotes_during) >= 10

