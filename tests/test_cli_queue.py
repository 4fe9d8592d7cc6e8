"""The operator command, ``scrapyd-pgqueue status|requeue|cancel|prune``, run as a real console script.

The queue's state is made through the store, as nodes make it, in the test's own database.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import time

import pytest
from sqlalchemy import make_url

from helpers import COMMAND, finish, heard, query, run, run_json, skewed_clock
from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store import CANCEL_CHANNEL, NOTIFY_CHANNEL
from scrapyd_pgqueue.store.statuses import FAILED, LOST


def notifications(connection, timeout=10):
    received = heard(connection, timeout)
    assert received, "no notification"
    return received


@pytest.fixture
def busy_queue(store, admin_connection):
    """Two nodes (node2 silent for a minute), jobs pending in two projects, two running on node1, two ended badly."""
    store.register_node(worker="w1", name="node1", url="http://node1:6800/", max_proc=4)
    store.register_node(worker="w2", name="node2", url="http://node2:6800/", max_proc=4)
    with admin_connection.cursor() as cursor:
        cursor.execute("UPDATE scrapyd_node SET heartbeat_time = now() - interval '60 seconds' WHERE id = 'w2'")
    for job in ("failed-1", "lost-1", "run-1", "run-2"):
        store.enqueue("shop", {"name": "prices", "_job": job})
    failed, lost, *running = store.claim_next_jobs(None, 4, node="node1", worker="w1").jobs
    finish(store, failed, outcome=FAILED, reason="exit code 1")
    finish(store, lost, outcome=LOST, reason="node node9 stopped heart-beating during attempt 3 of 3")
    for job in ("p-1", "p-2", "p-3"):
        store.enqueue("shop", {"name": "prices", "_job": job, "day": "monday"})
    store.enqueue("shop", {"name": "stock", "_job": "p-4"})
    store.enqueue("news", {"name": "headlines", "_job": "p-5"}, priority=5)
    return running


def test_status_shows_the_queue_at_a_glance(database_url, busy_queue):
    status = run_json(database_url, "status")
    assert status["pending"]["total"] == 5
    assert [(group["project"], group["spider"], group["pending"]) for group in status["pending"]["by_spider"]] == [
        ("news", "headlines", 1), ("shop", "prices", 3), ("shop", "stock", 1)
    ]
    assert all(datetime.datetime.fromisoformat(group["oldest"]) for group in status["pending"]["by_spider"])
    assert status["running"]["total"] == 2
    assert {(job["job"], job["node"]) for job in status["running"]["jobs"]} == {("run-1", "node1"), ("run-2", "node1")}
    nodes = status["nodes"]
    assert [(node["name"], node["state"], node["running"], node["max_proc"], node["url"]) for node in nodes] == [
        ("node1", "live", 2, 4, "http://node1:6800/"),
        ("node2", "silent", 0, 4, "http://node2:6800/"),
    ]
    assert status["nodes"][1]["heartbeat_age"] >= 60
    assert status["finished"] == {"total": 2, "by_outcome": {"failed": 1, "lost": 1}}
    assert [(job["job"], job["outcome"], job["reason"]) for job in status["troubled"]] == [
        ("lost-1", "lost", "node node9 stopped heart-beating during attempt 3 of 3"),
        ("failed-1", "failed", "exit code 1"),
    ]

    table = run(database_url, "status").stdout
    assert "Pending: 5" in table and "Running: 2" in table and "Nodes: 1 live" in table
    assert "Finished (kept): 2 (failed 1, lost 1)" in table
    lines = [line.split() for line in table.splitlines()]
    assert ["shop", "prices", "3"] == lines[[line[:2] for line in lines].index(["shop", "prices"])][:3]
    assert ["node2", "silent", "0", "4"] == next(line for line in lines if line[:1] == ["node2"])[:4]
    assert ["shop", "prices", "failed-1", "failed", "node1"] == next(line for line in lines if "failed-1" in line)[:5]


def test_status_of_an_empty_queue(database_url):
    assert run_json(database_url, "status") == {
        "pending": {"total": 0, "by_spider": []},
        "queue": {"totals": {"delayed": 0, "pending": 0, "past_due": 0, "running": 0, "dead": 0}, "by_spider": []},
        "running": {"total": 0, "jobs": []},
        "nodes": [],
        "finished": {"total": 0, "by_outcome": {}},
        "troubled": [],
        "recovered": [],
        "unroutable": [],
        "listening": [],
        "warnings": [],
    }
    assert "Pending: 0" in run(database_url, "status").stdout


def test_status_warns_of_the_churned_tables_autovacuum_leaves_alone(database_url, store, admin_connection):
    with admin_connection.cursor() as cursor:
        cursor.execute("ALTER TABLE job_log SET (autovacuum_enabled = false)")
    [warning] = run_json(database_url, "status")["warnings"]
    assert warning.startswith("autovacuum is off for job_log: ")
    assert f"Warning: {warning}" in run(database_url, "status").stdout


def test_status_shows_jobs_recovered_from_a_node_that_went_away(database_url, store, admin_connection):
    store.enqueue("shop", {"name": "prices", "_job": "again"})
    store.claim_next_jobs(None, 1, node="node9", worker="w9")
    with admin_connection.cursor() as cursor:  # node9's lease expired and another node gave the job back
        cursor.execute("UPDATE spider_job SET status = 'pending' WHERE job = 'again'")
    store.claim_next_jobs(None, 1, node="node1", worker="w1")
    recovered = run_json(database_url, "status")["recovered"]
    assert [(job["job"], job["status"], job["node"], job["attempts"]) for job in recovered] == [
        ("again", "ongoing", "node1", 2)
    ]


def test_requeue_puts_a_failed_job_back_as_it_was_scheduled(database_url, store, busy_queue, admin_connection):
    admin_connection.cursor().execute(f"LISTEN {NOTIFY_CHANNEL}")
    assert "Job failed-1 of project shop is pending again." in run(database_url, "requeue", "failed-1").stdout
    assert notifications(admin_connection) == [(NOTIFY_CHANNEL, "")]  # idle nodes wake at once
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT status, outcome, reason, node, pid, end_time, message FROM spider_job "
                       "WHERE job = 'failed-1'")
        assert cursor.fetchone() == ("pending", None, None, None, None, None, {"name": "prices", "_job": "failed-1"})
    claimed = store.claim_next_jobs(["shop"], 10, node="node1", worker="w1").jobs
    assert "failed-1" in [job.job for job in claimed]

    # Live already: refused, with the reason.
    assert "already pending or running" in run(database_url, "requeue", "failed-1", expect=1).stderr
    assert "no job 'nope'" in run(database_url, "requeue", "nope", expect=1).stderr
    assert run_json(database_url, "requeue", "lost-1") == {"project": "shop", "job": "lost-1", "status": "pending"}


def test_cancel_a_pending_job_or_the_running_one_wherever_it_runs(database_url, busy_queue, admin_connection):
    admin_connection.cursor().execute(f"LISTEN {CANCEL_CHANNEL}")
    assert "was pending: cancelled" in run(database_url, "cancel", "p-1").stdout
    assert run_json(database_url, "cancel", "run-1", "--signal", "TERM") == {
        "project": "shop", "job": "run-1", "prevstate": "running"}
    # The node running it (worker w1) is told, and signals it; the request is counted for its heartbeat too.
    ((channel, payload),) = notifications(admin_connection)
    request = json.loads(payload)
    assert (channel, request["job"], request["worker"], request["requests"], request["signal"]) == (
        CANCEL_CHANNEL, "run-1", "w1", 1, "TERM")
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT job, status, outcome, cancel_requests FROM spider_job "
                       "WHERE job IN ('p-1', 'run-1') ORDER BY job")
        assert cursor.fetchall() == [("p-1", "terminated", "cancelled", 0), ("run-1", "ongoing", None, 1)]
    assert "nothing to cancel" in run(database_url, "cancel", "failed-1", expect=1).stdout
    assert "--signal must be" in run(database_url, "cancel", "run-1", "--signal", "BOGUS", expect=1).stderr


def test_a_job_id_in_two_projects_needs_the_project(database_url, store):
    store.enqueue("shop", {"name": "prices", "_job": "daily"})
    store.enqueue("news", {"name": "headlines", "_job": "daily"})
    error = run(database_url, "cancel", "daily", expect=1).stderr
    assert "in several projects (news, shop): give --project" in error
    assert run_json(database_url, "cancel", "daily", "--project", "news")["prevstate"] == "pending"


def test_prune_deletes_old_finished_jobs(database_url, store, admin_connection):
    for i in range(5):
        store.enqueue("shop", {"name": "prices", "_job": f"old-{i}"})
    for i, claimed in enumerate(store.claim_next_jobs(None, 5, node="node1", worker="w1").jobs):
        finish(store, claimed, ended_minutes_ago=[10, 120, 180, 240, 300][i])
    store.enqueue("shop", {"name": "prices", "_job": "waiting"})

    assert run(database_url, "prune", "--older-than", "2.5h").stdout.strip() == "Deleted 3 finished jobs."
    assert run_json(database_url, "prune", "--keep", "1") == {"deleted": 1}
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT job FROM spider_job ORDER BY job")
        assert cursor.fetchall() == [("old-0",), ("waiting",)]  # pending jobs are never pruned
    assert "needs --keep N, --older-than AGE" in run(database_url, "prune", expect=1).stderr
    assert "not a duration" in run(database_url, "prune", "--older-than", "soon", expect=2).stderr


def test_prune_older_than_counts_on_the_databases_clock_not_the_operators(database_url, store):
    for i in range(2):
        store.enqueue("shop", {"name": "prices", "_job": f"j{i}"})
    for claimed, minutes_ago in zip(store.claim_next_jobs(None, 2, node="node1", worker="w1").jobs, [10, 180]):
        finish(store, claimed, ended_minutes_ago=minutes_ago)
    # An operator fourteen hours ahead (time zone) whose clock is a day fast: an hour ago is still the database's.
    operator = {"TZ": "Pacific/Kiritimati", **skewed_clock("+1d")}
    assert run(database_url, "prune", "--older-than", "1h", env=operator).stdout.strip() == "Deleted 1 finished job."
    assert [job.job for job in store.list_terminated(10)] == ["j0"]


def test_an_unreachable_database_is_named_without_its_password(database_url):
    result = run("postgresql://scrapyd:s3cret-pw@127.0.0.1:1/queue", "status", expect=2)
    assert "127.0.0.1:1/queue" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_the_database_url_comes_from_a_file_or_the_environment_and_a_password_in_argv_is_warned_of(
        database_url, tmp_path):
    url_file = tmp_path / "database-url"
    url_file.write_text(database_url + "\n")
    from_file = run("", "status", "--database-url-file", str(url_file))
    assert from_file.stdout.startswith("Queue in ") and from_file.stderr == ""
    assert run("", "status", expect=2).stderr.endswith(
        "status: give the database URL in $SCRAPYD_DATABASE_URL or --database-url-file\n")
    assert "cannot read" in run("", "status", "--database-url-file", str(tmp_path / "missing"), expect=2).stderr
    with_password = make_url(database_url).set(password="argv-s3cret").render_as_string(hide_password=False)
    warned = run("", "status", "--database-url", with_password)
    assert "a password on the command line is visible to every user of this host (ps)" in warned.stderr
    assert "argv-s3cret" not in warned.stderr + warned.stdout
    assert run("", "status", "--database-url", database_url).stderr == ""  # no password in it: nothing to say


# --- enqueue ---------------------------------------------------------------------------------------------------


def test_enqueue_lands_a_100000_job_file_completely_in_priority_then_file_order(database_url, store, tmp_path,
                                                                                  admin_connection):
    jobs = [{"spider": "sleeper", "jobid": f"bulk-{i:06}", "priority": i % 3, "args": {"url": f"https://e.x/{i}"}}
            for i in range(100_000)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    result = run_json(database_url, "enqueue", "--project", "example", str(path))
    assert result["queued"] == 100_000
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT job, message->>'url' FROM spider_job WHERE status = 'pending' ORDER BY priority DESC, id")
        claim_order = cursor.fetchall()
    expected = sorted(jobs, key=lambda job: -job["priority"])  # stable: file order within a priority
    assert claim_order == [(job["jobid"], job["args"]["url"]) for job in expected]


def test_enqueue_from_standard_input_stops_at_a_bad_line_and_says_which(database_url, store):
    lines = [json.dumps({"spider": "sleeper", "jobid": f"ok-{i}"}) for i in range(5)]
    lines.insert(3, json.dumps({"spider": "sleeper", "priority": "high"}))
    env = {key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}
    if database_url:
        env["SCRAPYD_DATABASE_URL"] = database_url
    result = subprocess.run([COMMAND, "enqueue", "--project", "example", "--batch-size", "2", "-"], env=env,
                            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "line 4: priority must be a finite number" in result.stderr
    assert "nothing was queued" in result.stderr
    assert store.list_pending("example") == []  # the batch before the bad line too: all or none


def test_enqueue_in_batches_keeps_unique_keys_trees_delays_priority_and_file_order(database_url, store,
                                                                                    admin_connection, tmp_path):
    """Batches big enough to be copied through the staging table, in one transaction: every rule of a schedule holds,
    the values arrive exactly as written, and idle nodes are woken once."""
    replaced = store.enqueue("example", {"name": "s", "_job": "held-r", "v": "old"},
                             options=JobOptions(unique_key="k-replace", delay=600))
    store.enqueue("example", {"name": "s", "_job": "held-k", "v": "old"}, options=JobOptions(unique_key="k-keep"))
    store.enqueue("example", {"name": "s", "_job": "root"}, options=JobOptions(on_complete="report"))
    odd = "tab\there, line\nbreak, back\\slash, \\N, quote\" and é"
    lines = [{"spider": "s", "jobid": f"j{i:03}", "priority": i % 3, "args": {"i": str(i), "odd": odd}}
             for i in range(300)]
    lines[10].update(unique_key="k-replace", args={"v": "new"})
    lines[20].update(unique_key="k-keep", on_conflict="keep", args={"v": "new"})
    for i in (100, 101, 250):  # keys no waiting job holds: copied straight in, in their place
        lines[i]["unique_key"] = f"k-new-{i}"
    for i in range(30, 60):
        lines[i]["delay"] = 3600
    for i in range(200, 210):
        lines[i]["parent"] = "root"
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    store.register_node(worker="w1", name="n1", url=None, max_proc=2)  # an idle node, which wants work
    admin_connection.cursor().execute(f"LISTEN {NOTIFY_CHANNEL}")
    assert run_json(database_url, "enqueue", "--project", "example", "--batch-size", "150", str(path))["queued"] == 300
    assert notifications(admin_connection) == [(NOTIFY_CHANNEL, "")]
    rows = {row[0]: row[1:] for row in query(database_url, """
        SELECT s.job, s.status, s.message, s.tree_id, root.tree_id FROM spider_job AS s, spider_job AS root
        WHERE root.job = 'root'""")}
    assert rows["held-r"][:2] == ("pending", {"v": "new", "name": "s", "_job": "held-r", "settings": {}})
    assert rows["held-k"][1]["v"] == "old"
    assert "j010" not in rows and "j020" not in rows
    assert {job for job, (status, *_) in rows.items() if status == "delayed"} == {f"j{i:03}" for i in range(30, 60)}
    assert all(rows[f"j{i:03}"][2] == rows[f"j{i:03}"][3] is not None for i in range(200, 210))
    assert rows["j299"][1]["odd"] == odd
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT job FROM spider_job WHERE status = 'pending' AND job LIKE 'j%' ORDER BY priority DESC, id")
        claim_order = [job for job, in cursor.fetchall()]
        cursor.execute("SELECT count(*) FROM spider_job_staging")
        assert cursor.fetchone() == (0,)
    waiting = [line for i, line in enumerate(lines) if i not in (10, 20) and not 30 <= i < 60]
    assert claim_order == [line["jobid"] for line in sorted(waiting, key=lambda line: -line["priority"])]
    assert replaced.job == "held-r"
    new_keys = query(database_url, "SELECT job, unique_key FROM spider_job WHERE unique_key LIKE 'k-new-%%'")
    assert dict(new_keys) == {f"j{i:03}": f"k-new-{i}" for i in (100, 101, 250)}


def test_enqueue_refusing_a_held_key_in_its_second_batch_stores_nothing_and_names_the_line(database_url, store,
                                                                                            tmp_path):
    store.enqueue("example", {"name": "s", "_job": "held"}, options=JobOptions(unique_key="k"))
    lines = [{"spider": "s", "jobid": f"j{i}"} for i in range(300)]
    lines[250].update(unique_key="k", on_conflict="error")
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = run(database_url, "enqueue", "--project", "example", "--batch-size", "150", str(path), expect=1)
    assert "line 251: unique_key 'k' is held by waiting job 'held'" in result.stderr
    assert "nothing was queued" in result.stderr
    assert [message["_job"] for message in store.list_pending("example")] == ["held"]


def test_a_new_key_another_client_schedules_meanwhile_stops_the_enqueue_naming_its_line(database_url, store,
                                                                                        admin_connection, tmp_path):
    """A key no waiting job held when the batch was checked, taken by a schedule that commits while the command copies
    its batch: the command stops with that key named, and nothing of its input is queued."""
    lines = [{"spider": "s", "jobid": f"j{i}", **({"unique_key": "k"} if i == 150 else {})} for i in range(300)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    admin_connection.autocommit = False
    with admin_connection.cursor() as cursor:  # the other client's schedule, not committed yet
        cursor.execute("INSERT INTO spider_job (project, spider, job, priority, message, status, unique_key, "
                       "created_time) VALUES ('example', 's', 'other', 0, '{}', 'pending', 'k', now())")
    env = {key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}
    env["SCRAPYD_DATABASE_URL"] = database_url
    command = subprocess.Popen([COMMAND, "enqueue", "--project", "example", str(path)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'COPY spider_job %%'"
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=60)
    while query(database_url, waiting) != [(1,)]:  # the command's COPY waits for the other schedule's key
        assert command.poll() is None and datetime.datetime.now() < deadline, command.communicate()
        time.sleep(0.05)
    admin_connection.commit()
    _, stderr = command.communicate(timeout=60)
    assert command.returncode == 1
    assert "line 151: unique_key 'k' was taken by a job scheduled meanwhile" in stderr and "nothing was queued" in stderr
    assert [message.get("_job") for message in store.list_pending("example")] == [None]  # the other client's only


def test_a_held_key_whose_job_is_claimed_while_the_command_waits_for_it_becomes_a_new_job(database_url, store,
                                                                                         admin_connection, tmp_path):
    """A batch's held key, whose waiting job a node claims (not committed yet) as the command replaces it: the command
    waits for that claim, finds the job running, and queues the line as a new job with the key; the running job
    keeps what it was claimed with."""
    store.enqueue("example", {"name": "s", "_job": "held", "v": "old"}, options=JobOptions(unique_key="k"))
    lines = [{"spider": "s", "jobid": f"j{i}", "unique_key": f"k{i}"} for i in range(300)]
    lines[150] = {"spider": "s", "jobid": "again", "unique_key": "k", "args": {"v": "new"}}
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    admin_connection.autocommit = False
    with admin_connection.cursor() as cursor:  # a node's claim of the held job, not committed yet
        cursor.execute("UPDATE spider_job SET status = 'ongoing', start_time = now() WHERE job = 'held'")
    env = {key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}
    env["SCRAPYD_DATABASE_URL"] = database_url
    command = subprocess.Popen([COMMAND, "enqueue", "--project", "example", "--batch-size", "200", str(path)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting = ("SELECT count(*) FROM pg_stat_activity "
               "WHERE wait_event_type = 'Lock' AND query LIKE '%%UPDATE spider_job AS j%%'")
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=60)
    while query(database_url, waiting) != [(1,)]:  # the command's replace waits for the claim
        assert command.poll() is None and datetime.datetime.now() < deadline, command.communicate()
        time.sleep(0.05)
    admin_connection.commit()
    stdout, stderr = command.communicate(timeout=60)
    assert command.returncode == 0, stderr
    rows = query(database_url, "SELECT job, status, message->>'v' FROM spider_job WHERE unique_key = 'k' ORDER BY id")
    assert rows == [("held", "ongoing", "old"), ("again", "pending", "new")]
    assert store.count_pending("example") == 300


def test_a_batch_size_out_of_range_is_refused_before_anything_is_read(database_url, store, tmp_path):
    path = tmp_path / "jobs.jsonl"
    path.write_text('{"spider": "s"}\n')
    for size in ("0", "100001", "many"):
        result = run(database_url, "enqueue", "--project", "example", "--batch-size", size, str(path), expect=2)
        assert f"not a number of jobs from 1 to 100,000: '{size}'" in result.stderr
    assert store.count_pending("example") == 0


def test_a_bad_line_in_the_middle_of_a_million_stores_nothing_and_names_its_line(database_url, store):
    """The lines are made as the command reads them (standard input): memory stays flat on both sides."""
    bad = 500_001
    env = {key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}
    env["SCRAPYD_DATABASE_URL"] = database_url
    command = subprocess.Popen([COMMAND, "enqueue", "--project", "example", "-"], env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with contextlib.suppress(BrokenPipeError):  # the command stops reading at the bad line
        for start in range(1, 1_000_001, 10_000):
            command.stdin.write("".join(
                '{"spider": "s", "priority": "high"}\n' if number == bad else
                f'{{"spider": "s", "jobid": "j{number}", "args": {{"n": "{number}"}}}}\n'
                for number in range(start, start + 10_000)))
        command.stdin.close()
    _, stderr = command.communicate(timeout=600)
    assert command.returncode == 1
    assert f"line {bad}: priority must be a finite number" in stderr and "nothing was queued" in stderr
    assert store.count_pending("example") == 0
