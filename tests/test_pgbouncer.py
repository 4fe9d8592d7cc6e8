"""Any number of nodes: a fixed connection budget per node, and a whole cluster through PgBouncer.

Real ``scrapyd`` nodes, a real PgBouncer (Debian's, transaction pooling) in front of a real Postgres, real crawls
that record their own runs (runs.jsonl). What a user counts: jobs run exactly once, connections Postgres sees,
every ``schedule.json`` answered ``ok``.
"""

from __future__ import annotations

import collections
import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import make_url

from helpers import ConnectionSampler, database_with_secret_owner, jobs, query, runs, runs_of, schedule, timed, wait_for
from scrapyd_pgqueue.local import devdb

FAST = {"max_proc": "2", "poll_interval": "1", "heartbeat_interval": "1", "lease_seconds": "5",
        "finished_to_keep": "1000"}


@pytest.fixture
def bounced(postgres_server, pgbouncer, tmp_path):
    """(nodes' URL through PgBouncer, direct nodes' URL, superuser URL, server, bouncer): a Postgres the test may
    restart, with PgBouncer in front. The suite's server, or a private one when the suite uses a shared server."""
    server_url, server = postgres_server
    private = bouncer = None
    if server is None:
        private = server = devdb.throwaway_postgres()
        bouncer = pgbouncer = devdb.LocalPgBouncer(server.url)
        bouncer.start()
        server_url = server.url
    url, admin_url = database_with_secret_owner(server_url)
    pgbouncer.allow(make_url(url).username)
    try:
        yield pgbouncer.url_for(url), url, admin_url, server, pgbouncer
    finally:
        for owned in (bouncer, private):
            if owned is not None:
                owned.remove()


def test_six_nodes_through_pgbouncer_run_every_job_once_cancel_deploy_and_survive_a_postgres_restart(
    bounced, start_cluster, tmp_path, egg
):
    bounced_url, direct_url, admin_url, server, bouncer = bounced
    # Nodes 1-3 poll-only (everything through PgBouncer); 4-6 with their one listener straight to Postgres.
    polling = start_cluster(bounced_url, 3, name_prefix="polling", **FAST).nodes
    listening = start_cluster(bounced_url, 3, name_prefix="listening", listen_url=direct_url, **FAST).nodes
    nodes = polling + listening
    for node in nodes:
        assert node.get("listspiders.json", project="example")["spiders"] == ["quotes", "site", "sleeper", "stubborn", "ticker"]

    # An egg deployed once, through one node, runs on every node: 12 slots, 12 crawls of it at once.
    assert polling[0].post("addversion.json", project="eggproject", version="1", egg=egg.read_bytes())["status"] == "ok"
    for node in nodes:
        wait_for(lambda: "eggproject" in node.get("listprojects.json")["projects"], 15, f"{node.name} to learn it")
        assert node.get("listspiders.json", project="eggproject")["spiders"] == [
            "quotes", "site", "sleeper", "stubborn", "ticker"]
    egg_jobs = [
        node.post("schedule.json", project="eggproject", spider="sleeper", seconds="8")["jobid"]
        for node in nodes for _ in range(2)
    ]
    wait_for(lambda: all(runs_of(tmp_path, job) for job in egg_jobs), 90, "every egg job to start")
    ran_on = collections.Counter(runs_of(tmp_path, job)[0]["node"] for job in egg_jobs)
    assert set(ran_on) == {node.name for node in nodes}, ran_on
    wait_for(lambda: {state[0] for state in jobs(admin_url, *egg_jobs).values()} == {"terminated"}, 60,
             "the egg jobs to finish")

    # A running job cancelled through another node. As in Scrapyd, the first cancel.json asks Scrapy to shut down
    # gracefully, which waits for the sleeping callback, and the second forces it: sent once the callback sleeps,
    # each after the crawl logged the previous one (two signals at once are one to Python).
    schedule(listening[0], "to-cancel", seconds="120")
    [run] = wait_for(lambda: runs_of(tmp_path, "to-cancel"), 30, "it to start")
    runner = next(node for node in nodes if node.name == run["node"])
    crawl_log = runner.directory / "logs" / "example" / "sleeper" / "to-cancel.log"
    wait_for(lambda: "Sleeping in the callback" in crawl_log.read_text(), 30, "the crawl's callback to sleep")
    other = next(node for node in nodes if node.name != run["node"])
    for delivered in ("Received SIGINT, shutting down gracefully", "Received SIGINT twice"):
        assert other.post("cancel.json", project="example", job="to-cancel")["prevstate"] == "running"
        wait_for(lambda: delivered in crawl_log.read_text(), 30, f"the crawl to be signalled ({delivered})")
    wait_for(lambda: jobs(admin_url, "to-cancel")["to-cancel"][:2] == ("terminated", "cancelled"), 30,
             "the crawl to be cancelled")

    # 60 jobs through every node, Postgres restarted while they run: each runs exactly once.
    names = [f"job{i:02}" for i in range(60)]
    for i, job in enumerate(names):
        schedule(nodes[i % 6], job, seconds="0.5")

    def finished():
        return sum(1 for state in jobs(admin_url, *names).values() if state[0] == "terminated")

    wait_for(lambda: finished() >= 15, 120, "a quarter of the jobs to finish")
    server.restart()
    wait_for(lambda: finished() == 60, 180, "every job to finish after the restart")
    table = jobs(admin_url, *names)
    assert {state[:2] for state in table.values()} == {("terminated", "finished")}
    assert sorted(run["job"] for run in runs(tmp_path) if run["job"] in names) == names

    # Poll-only is said once, by the nodes behind the pooler only.
    for node in polling:
        assert node.logfile.read_text().count("runs poll-only") == 1, node.name
    for node in listening:
        assert "runs poll-only" not in node.logfile.read_text(), node.name
    # Besides PgBouncer's own server connections, Postgres sees exactly the three direct listeners.
    bouncer_ports = {server["local_port"] for server in bouncer.show("SHOW SERVERS")}
    direct = query(admin_url, "SELECT application_name, client_port FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    assert sorted(name for name, port in direct if port not in bouncer_ports) == [
        f"scrapyd-pgqueue-listener {node.name}" for node in listening
    ]
    assert len(bouncer_ports) <= 20  # PgBouncer's pool, whatever the number of nodes


def test_twenty_idle_then_busy_nodes_stay_within_three_connections_each(database, start_cluster, tmp_path):
    url, admin_url = database
    cluster = start_cluster(url, 20, max_proc="2", poll_interval="1", heartbeat_interval="1")
    nodes = cluster.nodes
    for node in nodes:  # Scrapyd's `scrapy list` once per node (it reads the egg itself: one short connection)
        node.get("listspiders.json", project="example")
    with ConnectionSampler(admin_url) as sampler:
        time.sleep(5)  # idle: heartbeats, polls, egg catalogue checks
        idle_peak = sampler.peak_total

        def schedule_on_a_random_node(i):
            return random.choice(nodes).post("schedule.json", project="example", spider="sleeper",
                                             jobid=f"busy{i:03}", seconds="0.5")

        with ThreadPoolExecutor(20) as pool:  # 40 schedules, 20 at once, then crawls on every node (2 slots each)
            answers = list(pool.map(schedule_on_a_random_node, range(40)))
        names = [f"busy{i:03}" for i in range(40)]
        wait_for(lambda: {state[0] for state in jobs(admin_url, *names).values()} == {"terminated"}, 180,
                 "every job to finish")

    print(f"20 nodes: peak {idle_peak} connections idle, {sampler.peak_total} busy; by name {sampler.peak}")
    assert [answer["status"] for answer in answers] == ["ok"] * 40
    assert sorted(run["job"] for run in runs(tmp_path)) == names
    assert sampler.peak_total <= 20 * 3
    for node in nodes:  # the pool, 2 at most, and one listener that carries the lease too; crawls open none
        assert sampler.peak.get(f"scrapyd-pgqueue {node.name}", 0) <= 2, sampler.peak
        assert sampler.peak.get(f"scrapyd-pgqueue-listener {node.name}", 0) <= 1, sampler.peak
        assert sampler.peak.get(f"scrapyd-pgqueue-lease {node.name}", 0) == 0, sampler.peak


def test_a_postgres_restart_behind_pgbouncer_costs_clients_a_wait_never_an_error(bounced, start_cluster):
    bounced_url, _, admin_url, server, _ = bounced
    nodes = start_cluster(bounced_url, 3, **FAST).nodes
    answers = []  # (node, endpoint, seconds, answer) of every request, before, during and after the restart
    scheduled = []
    stopping = threading.Event()

    def client(node):  # one client per node, one request after another, as a user's script would
        for i in itertools.count():
            if stopping.wait(0.5 if i else 0):  # paced: a round of requests every half second or so
                return
            job = f"{node.name}-{i:03}"
            requests = [("post", "schedule.json", {"project": "example", "spider": "sleeper", "jobid": job,
                                                   "seconds": "0.1"}),
                        ("get", "listjobs.json", {"project": "example"}), ("get", "daemonstatus.json", {}),
                        ("get", "listprojects.json", {})]
            for method, endpoint, params in requests:
                seconds, answer = timed(node, method, endpoint, timeout=90, **params)
                answers.append((node.name, endpoint, seconds, answer))
                if endpoint == "schedule.json" and answer["status"] == "ok":
                    scheduled.append(job)

    clients = [threading.Thread(target=client, args=(node,)) for node in nodes]
    for thread in clients:
        thread.start()
    wait_for(lambda: len(answers) >= 24, 60, "a few rounds of requests before the restart")
    server.restart()
    restarted = len(answers)
    time.sleep(25)  # PgBouncer's server_login_retry (15 s) and then some: the clients keep asking meanwhile
    stopping.set()
    for thread in clients:
        thread.join(120)

    # A refusal (the server shutting down or starting up, PgBouncer's server_login_retry) is waited for, a statement
    # the shutdown ended (it did not commit) is sent again, and a read that lost its connection reads again.
    # daemonstatus.json is the readiness probe: it answers within a second whatever the database does, and says so
    # while the database is away (its own test: test_stalls). Every other answer is ok.
    errors = [answer for answer in answers if answer[3]["status"] != "ok"]
    unready = [answer for answer in errors if answer[1] == "daemonstatus.json"]
    assert [answer for answer in errors if answer not in unready] == []
    assert all(answer[3]["database"] == "unreachable" and answer[2] < 5 for answer in unready), unready
    assert len(answers) > restarted + 12, "requests after the restart"
    logs = "".join(node.logfile.read_text() for node in nodes)
    # The refusals that came were waited for; a restart quick enough for PgBouncer's next login brings none.
    waits = ("refused a statement (it did not run), waiting", "refused a connection, waiting",
             "ended a statement (it did not commit), waiting")
    print(f"{len(answers)} answers, {len(errors)} errors, the slowest {max(answer[2] for answer in answers):.1f} s, "
          f"refusals waited for: {sum(logs.count(wait) for wait in waits)}")
    assert sorted(jobs(admin_url, *scheduled)) == sorted(scheduled)  # every job answered ok is stored, once
