"""The watchdog (node/watchdog.py): real nodes stop real crawls that run too long, make no progress, never reach
their spider or ignore a stop. The crawls' own records (runs.jsonl, ends.jsonl), the table, the crawl's log and the
node's log are the measures; listjobs.json, /jobs, the CLI and /metrics are read as a user reads them.

The stall and start-timeout tests need the crawl -> node stats channel (each crawl reports when its spider opened
and when its counts last changed: ``spider_opened_at`` and ``progress_at`` of the launcher's protocol).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from helpers import ends, jobs, query, runs_of, schedule, wait_for
from scrapyd_pgqueue import cli
from scrapyd_pgqueue.config import ConfigurationError, settings
from scrapyd_pgqueue.job_rules.job_requests import RefusedJob, job_from_json, options_from_fields
from scrapyd_pgqueue.node.watchdog import CHECK_INTERVAL

# Seconds a crawl asked to stop has before it is SIGKILLed, in these tests.
CANCEL_TIMEOUT = 5


def terminated(url, *names, timeout: float = 60):
    wait_for(lambda: all(state[0] == "terminated" for state in jobs(url, *names).values())
             and len(jobs(url, *names)) == len(names), timeout, f"{names} to end")
    return jobs(url, *names)


def row(url, job):
    [found] = query(url, "SELECT outcome, reason, failures, attempts, extract(epoch FROM end_time - start_time) "
                         "FROM spider_job WHERE job = %s", (job,))
    return found


def ran_for(tmp_path, job) -> float | None:
    """Seconds from the crawl's own start record (its spider created) to its end record (its spider closed); None
    when it never started or closed (stopped before its spider opened, on a busy machine)."""
    started = [run["started"] for run in runs_of(tmp_path, job)]
    ended = [end["ended"] for end in ends(tmp_path) if end["job"] == job]
    return round(ended[0] - started[0], 2) if started and ended else None


def crawl_log(node, spider, job) -> str | None:
    path = node.directory / "logs" / "example" / spider / f"{job}.log"
    return path.read_text() if path.exists() else None


def page(node, path: str) -> str:
    with urllib.request.urlopen(f"{node.url}{path}", timeout=30) as response:
        return response.read().decode()


# --- options and settings (pure functions) ------------------------------------------------------------------------


def test_the_watchdog_options_are_checked_and_never_reach_the_spider():
    options = options_from_fields({"_max_runtime": "3", "_stall_timeout": "1.5"})
    assert (options.max_runtime, options.stall_timeout) == (3.0, 1.5)
    request = job_from_json({"spider": "s", "max_runtime": 60, "args": {"page": "1"}})
    assert request.options.max_runtime == 60.0 and request.message == {**request.message, "page": "1"}
    assert not any("runtime" in key or "stall" in key for key in request.message)
    for fields, message in (({"_max_runtime": "0"}, "max_runtime must be more than 0"),
                            ({"_stall_timeout": "-1"}, "stall_timeout must be more than 0"),
                            ({"_max_runtime": "soon"}, "max_runtime must be a number")):
        with pytest.raises(RefusedJob, match=message):
            options_from_fields(fields)


def test_the_node_settings_default_to_no_limit_but_a_kill_and_a_start_bound():
    defaults = settings(_config({}))
    assert (defaults.max_runtime, defaults.stall_timeout, defaults.cancel_timeout, defaults.start_timeout) == (
        None, None, 300.0, 120.0)
    assert settings(_config({"max_runtime": "3600", "start_timeout": "0"})).max_runtime == 3600.0
    assert settings(_config({"start_timeout": "0"})).start_timeout is None
    with pytest.raises(ConfigurationError, match="cancel_timeout"):
        settings(_config({"cancel_timeout": "0"}))


def _config(values):
    from scrapyd.config import Config

    return Config(values={"database_url": "postgresql://u@h/d", **values})


# --- through real nodes -------------------------------------------------------------------------------------------


def test_max_runtime_ends_crawls_timeout_the_job_s_own_or_the_node_s_and_retries_them(
        database, start_cluster, tmp_path):
    url, admin_url = database
    [node] = start_cluster(url, 1, max_proc="4", max_runtime="8", cancel_timeout=str(CANCEL_TIMEOUT)).nodes
    schedule(node, "bounded", spider="ticker", seconds="60", _max_runtime="3")
    schedule(node, "defaulted", spider="ticker", seconds="60")  # the node's max_runtime, 8 s
    schedule(node, "longer", spider="ticker", seconds="10", _max_runtime="60")  # its own, beyond the node's
    schedule(node, "retried", spider="ticker", seconds="60", _max_runtime="2", _retries="1")
    states = terminated(admin_url, "bounded", "defaulted", "longer", "retried")

    assert {job: state[1] for job, state in states.items()} == {
        "bounded": "timeout", "defaulted": "timeout", "longer": "finished", "retried": "dead"}
    # The crawl's start and end as its node recorded them (process spawned, process ended): the watchdog looks
    # once a second, then the crawl stops gracefully, or is killed cancel_timeout later.
    _, reason, _, _, bounded = row(admin_url, "bounded")
    _, _, _, _, defaulted = row(admin_url, "defaulted")
    print(f"_max_runtime=3 ran {bounded:.2f}s, node max_runtime=8 ran {defaulted:.2f}s (process start to end); "
          f"from spider to close: {ran_for(tmp_path, 'bounded')}, {ran_for(tmp_path, 'defaulted')}")
    assert 3 <= bounded < 3 + CHECK_INTERVAL + CANCEL_TIMEOUT + 1
    assert 8 <= defaulted < 8 + CHECK_INTERVAL + CANCEL_TIMEOUT + 1
    assert reason.startswith("ran past its max_runtime of 3s; "), reason
    assert row(admin_url, "longer")[4] >= 10

    # A timeout is a failure for _retries: it ran twice, then ended dead.
    assert node.logfile.read_text().count("job='retried' pid=") == 2 * 2  # two crawls: "Process started", "finished"
    _, reason, failures, attempts, _ = row(admin_url, "retried")
    assert (failures, attempts) == (2, 2) and "max_runtime of 2s" in reason

    # As a user sees it: listjobs.json, /jobs, the CLI, /metrics.
    finished = {entry["id"]: entry for entry in node.get("listjobs.json", project="example")["finished"]}
    assert finished["bounded"]["outcome"] == "timeout" and finished["retried"]["outcome"] == "dead"
    assert "<td>timeout</td>" in page(node, "jobs")
    assert '\nscrapyd_pgqueue_crawls_ended_total{outcome="timeout"} 4.0\n' in page(node, "metrics")


def test_status_counts_the_new_outcomes(database_url, store, capsys):
    import datetime

    for job, outcome in (("slow", "timeout"), ("stuck", "stalled")):
        store.enqueue("p", {"name": "s", "_job": job})
        [claimed] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
        now = datetime.datetime.now()
        store.finish_job(project="p", spider="s", job=job, start_time=now, end_time=now, outcome=outcome,
                         reason="stopped by the watchdog", claimed=claimed, worker="w")
    assert cli.main(["status", "--json", "--database-url", database_url]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["finished"]["by_outcome"] == {"stalled": 1, "timeout": 1}
    assert sorted(job["outcome"] for job in status["troubled"]) == ["stalled", "timeout"]


def test_a_crawl_that_ignores_sigint_and_sigterm_is_killed_cancel_timeout_after_a_stop(
        database, start_cluster, tmp_path):
    url, admin_url = database
    [node] = start_cluster(url, 1, max_proc="2", cancel_timeout="3").nodes
    schedule(node, "deaf", spider="stubborn")
    schedule(node, "deaf-bounded", spider="stubborn", _max_runtime="6")  # its spider ignores SIGINT by then
    wait_for(lambda: "Ignoring SIGINT and SIGTERM" in (crawl_log(node, "stubborn", "deaf") or ""), 60,
             "the spider to ignore signals")
    cancelled_at = time.monotonic()
    assert node.post("cancel.json", project="example", job="deaf")["status"] == "ok"
    terminated(admin_url, "deaf", timeout=30)
    waited = time.monotonic() - cancelled_at
    print(f"cancelled, then killed after {waited:.2f}s (cancel_timeout 3)")
    assert 3 <= waited < 3 + CHECK_INTERVAL + 2  # the kill, then the finish written and read
    outcome, reason, *_ = row(admin_url, "deaf")
    assert outcome == "cancelled" and "killed by signal 9" in reason, reason
    assert not [end for end in ends(tmp_path) if end["job"] == "deaf"]  # it never closed: killed
    [line] = [line for line in crawl_log(node, "stubborn", "deaf").splitlines() if "SIGKILL" in line]
    assert "still running 3s after it was asked to stop: killed (SIGKILL)" in line
    assert "Job deaf of project example (pid" in node.logfile.read_text()

    # The watchdog's own stop is ignored as well: killed cancel_timeout later, still a timeout.
    terminated(admin_url, "deaf-bounded", timeout=30)
    outcome, reason, _, _, seconds = row(admin_url, "deaf-bounded")
    assert outcome == "timeout" and "killed by signal 9" in reason and 6 + 3 <= seconds, (outcome, reason)
    assert "killed (SIGKILL)" in crawl_log(node, "stubborn", "deaf-bounded")


def test_a_crawl_with_no_progress_ends_stalled(database, start_cluster, tmp_path):
    """Needs the stats channel (progress_at), reporting a crawl's progress more often than its _stall_timeout."""
    url, admin_url = database
    [node] = start_cluster(url, 1, max_proc="2", cancel_timeout="3").nodes
    schedule(node, "stuck", seconds="60", _stall_timeout="3")  # a sleeper: one response, then a minute of nothing
    schedule(node, "busy", spider="ticker", seconds="8", _stall_timeout="3")  # an item every 0.5 s
    states = terminated(admin_url, "stuck", "busy", timeout=40)
    assert {job: state[1] for job, state in states.items()} == {"stuck": "stalled", "busy": "finished"}
    _, reason, *_ = row(admin_url, "stuck")
    assert reason.startswith("no new request, response or item for 3s; killed by signal 9"), reason
    # From its spider's creation (its own record) to its end (the node's record, same machine's clock): the stall,
    # then cancel_timeout, as the sleeping callback holds Scrapy's graceful stop; the watchdog looks once a second.
    [(ended,)] = query(admin_url, "SELECT extract(epoch FROM end_time) FROM spider_job WHERE job = 'stuck'")
    [run] = runs_of(tmp_path, "stuck")
    assert float(ended) - run["started"] < 3 + 3 + 2 * CHECK_INTERVAL + 2


def test_a_crawl_that_never_reaches_its_spider_is_handed_back_after_start_timeout(
        database, start_cluster, tmp_path):
    """Needs the stats channel (spider_opened_at): a crawl whose spider opened runs on past start_timeout."""
    url, admin_url = database
    # 15 s: two cold starts at once took over 4 s to their spiders on 2 busy cores.
    [node] = start_cluster(url, 1, max_proc="2", start_timeout="15", max_attempts="2").nodes
    schedule(node, "hung", spider="stubborn", hang="1")
    schedule(node, "slow", seconds="20")  # reaches its spider at once: runs its 20 s
    states = terminated(admin_url, "hung", "slow", timeout=90)
    assert {job: state[1] for job, state in states.items()} == {"hung": "interrupted", "slow": "finished"}
    assert len(runs_of(tmp_path, "slow")) == 1
    # Handed back once, then out of attempts: two crawls killed, each named in one line.
    killed = re.findall(r"Job hung of project example \(pid (\d+), (spawned cold|forked warm)\) did not reach its "
                        r"spider within start_timeout \(15s\)", node.logfile.read_text())
    assert len(killed) == 2 and killed[0][0] != killed[1][0], killed
    assert {str(run["pid"]) for run in runs_of(tmp_path, "hung")} <= {pid for pid, _ in killed}
