"""The connector: one engine per process, migrations under a lock, clear errors without the password."""

import datetime
import hashlib
import logging
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest
from scrapyd.config import Config
from sqlalchemy import make_url

from helpers import node_role, query, wait_for
from scrapyd_pgqueue import PostgresJobStorage, PostgresSpiderQueue
from scrapyd_pgqueue.config import ConfigurationError
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.local.cluster import LocalCluster
from scrapyd_pgqueue.node import notifications
from scrapyd_pgqueue.store import AllJobsStore, JobStore


def connections_to(admin_connection):
    with admin_connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_recreating_queues_does_not_grow_connections(scrapyd_config, admin_connection):
    PostgresSpiderQueue(scrapyd_config, "p0").count()
    before = connections_to(admin_connection)
    for i in range(100):
        queue = PostgresSpiderQueue(scrapyd_config, f"p{i}")  # as Scrapyd does on every deploy
        queue.add("s", _job=str(i))
        queue.count()
        PostgresJobStorage(scrapyd_config).list()
    assert connections_to(admin_connection) == before


def _migrate_in_new_process(url, start_at, results):
    time.sleep(max(0.0, start_at - time.time()))  # start all together
    try:
        db.get_engine(url)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the parent
        results.put(repr(e))


def test_ten_nodes_starting_at_once_create_the_schema_once(database_url, admin_connection):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    start_at = time.time() + 3
    processes = [context.Process(target=_migrate_in_new_process, args=(database_url, start_at, results)) for _ in range(10)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    assert outcomes == ["ok"] * 10
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT version_num FROM scrapyd_pgqueue_version")
        assert cursor.fetchall() == [(newest_schema_version(),)]
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = 'spider_job'")
        assert cursor.fetchone()[0] == 1


def test_the_connection_that_migrated_is_kept_in_the_pool_and_lent_again(database_url, admin_connection):
    """Migrating costs no connection beyond the pool's: a node's budget holds from its first statement on."""
    engine = db.get_engine(database_url)  # a new database: the schema is created on a connection of the pool
    [(migrated_on,)] = query(database_url, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                           "AND application_name = 'scrapyd-pgqueue'")
    with engine.connect() as connection:
        assert connection.execute("SELECT pg_backend_pid()").scalar_one() == migrated_on
    # The package's connections only: the backend of query()'s own connection, closed just before, may not have
    # exited yet (a backend ends after its client closes, not with it).
    assert query(database_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND application_name LIKE 'scrapyd-pgqueue%%'") == [(1,)]


def newest_schema_version():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(db._alembic_config()).get_current_head()


def test_newest_revisions_read_without_alembic_are_alembics_heads():
    from alembic.script import ScriptDirectory

    assert db.newest_revisions() == set(ScriptDirectory.from_config(db._alembic_config()).get_heads())


def test_missing_url_names_the_option_and_the_variable(monkeypatch):
    monkeypatch.delenv("SCRAPYD_DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="database_url.*SCRAPYD_DATABASE_URL"):
        PostgresSpiderQueue(Config(values={}), "p")


def test_environment_variable_overrides_the_config_file(monkeypatch, database_url):
    monkeypatch.setenv("SCRAPYD_DATABASE_URL", database_url)
    queue = PostgresSpiderQueue(Config(values={"database_url": "postgresql://nobody@127.0.0.1:1/none"}), "p")
    assert queue.count() == 0


def test_unreachable_database_is_a_quick_error_with_host_and_port_but_no_password():
    port = devdb.free_port()  # nothing listens there
    config = Config(values={"database_url": f"postgresql://scrapyd:s3cr3t-pw@127.0.0.1:{port}/scrapyd"})
    started = time.monotonic()
    with pytest.raises(db.DatabaseError) as raised:
        PostgresSpiderQueue(config, "p")
    assert time.monotonic() - started < db.CONNECT_TIMEOUT + 2
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message
    assert "s3cr3t-pw" not in message
    assert "s3cr3t-pw" not in repr(raised.value.__cause__)


def test_pooled_connections_killed_by_the_server_are_replaced_before_use(scrapyd_config, admin_connection):
    queue = PostgresSpiderQueue(scrapyd_config, "p")
    queue.add("s", _job="before")
    with admin_connection.cursor() as cursor:  # as a Postgres restart does to every session
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    wait_for(lambda: connections_to(admin_connection) == 0, 10, "the sessions to end")
    queue.add("s", _job="after")  # no error: the dead connection was seen closed and replaced, with no ping
    assert [message["_job"] for message in queue.list()] == ["before", "after"]
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    wait_for(lambda: connections_to(admin_connection) == 0, 10, "the sessions to end")
    assert queue.pop()["_job"] == "before"  # the claim's own path (the driver's cursor) replaces them too


# --- the connection budget -------------------------------------------------------------------------------------


def test_a_busy_pool_makes_work_wait_and_never_opens_more_than_its_size(database_url, admin_connection):
    store = JobStore.for_url(database_url)  # the first engine for this URL: the default pool of 2, no overflow
    peak = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak.append(connections_to(admin_connection))
            time.sleep(0.01)

    def work(worker):
        for i in range(25):
            store.enqueue("p", {"name": "s", "_job": f"{worker}-{i}"})
            # SKIP LOCKED: a claim finds nothing while every pending row is being claimed by another thread
            wait_for(lambda: store.claim_next_jobs(["p"], 1, node="n", worker=str(worker)).jobs, 30, "a claim")

    sampler = threading.Thread(target=sample)
    sampler.start()
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(work, range(12)))  # 12 threads at once over 2 connections: each waits its turn, none fails
    done.set()
    sampler.join()
    assert max(peak) <= db.DEFAULT_POOL_SIZE
    assert store.count_terminated() == 0 and store.count_pending("p") == 0  # 300 enqueued, 300 claimed


@pytest.fixture
def role_with_one_connection(database_url, admin_connection):
    """The test database's URL as a role that may hold one connection at a time (superusers have no limit)."""
    db.get_engine(database_url)  # the schema, as its owner
    return node_role(admin_connection, database_url, f"one_{uuid.uuid4().hex[:8]}", "CONNECTION LIMIT 1")


def test_a_refused_connection_is_waited_for_and_said_once_with_a_count(role_with_one_connection, caplog):
    url = make_url(role_with_one_connection)
    holder = psycopg2.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    threading.Timer(2.0, holder.close).start()  # the server has room again in 2 s
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="scrapyd_pgqueue.database.db"):
        JobStore.for_url(role_with_one_connection).enqueue("p", {"name": "s", "_job": "waited"})
    waited = time.monotonic() - started
    refusals = [record.getMessage() for record in caplog.records if "refused a connection" in record.getMessage()]
    assert 1.5 < waited < 10  # a short wait, not an error
    assert len(refusals) == 1, refusals  # said once, though it tried many times
    assert "too many connections" in refusals[0]


def test_a_statement_the_server_ends_is_sent_again_read_or_write(database_url):
    store = JobStore.for_url(database_url)
    store.enqueue("p", {"name": "s", "_job": "before"})
    locker = psycopg2.connect(database_url.replace("postgresql+psycopg2", "postgresql"))

    def waiting_statements():
        return query(database_url, "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND application_name = 'scrapyd-pgqueue'")

    def end_the_waiting_statement():  # as a server restart ends the statement it was running
        [(pid,)] = wait_for(waiting_statements, 10, "the statement to wait")
        query(database_url, "SELECT pg_terminate_backend(%s)", (pid,))
        wait_for(lambda: waiting_statements() not in ([], [(pid,)]), 10, "the statement to be sent again")
        locker.rollback()

    for read in (True, False):
        with locker.cursor() as cursor:
            cursor.execute("LOCK TABLE spider_job IN ACCESS EXCLUSIVE MODE")
        ender = threading.Thread(target=end_the_waiting_statement)
        ender.start()
        if read:
            assert [message["_job"] for message in store.list_pending("p")] == ["before"]
        else:  # ended before it could commit (its transaction aborted): sent again, stored once
            assert store.enqueue("p", {"name": "s", "_job": "ended"}).job == "ended"
        ender.join()
    locker.close()
    assert [message["_job"] for message in store.list_pending("p")] == ["before", "ended"]


def test_a_stalled_database_is_an_error_within_the_time_allowed_and_leaves_no_ghost_job(stoppable_database):
    url, admin_url, server = stoppable_database
    store = JobStore.for_url(url)
    store.enqueue("p", {"name": "s", "_job": "before"})
    with server.paused():
        started = time.monotonic()
        with pytest.raises(db.DatabaseError, match="no answer within 2 s"), db.deadline(2):
            store.enqueue("p", {"name": "s", "_job": "ghost"})  # reaches the stopped server, runs when it resumes
        assert time.monotonic() - started < 3
        started = time.monotonic()  # the claim's own path (the driver's cursor), on a project with nothing to claim
        with pytest.raises(db.DatabaseError, match="no answer within 2 s"), db.deadline(2):
            store.claim_next_jobs(["nothing"], 1, node="n", worker="w")
        assert time.monotonic() - started < 3
        time.sleep(1)
    wait_for(lambda: query(admin_url, "SELECT 1"), 10, "the server to answer")
    time.sleep(0.5)  # the abandoned statement has run by now, if it was going to
    assert [message["_job"] for message in store.list_pending("p")] == ["before"]
    store.enqueue("p", {"name": "s", "_job": "after"})  # and the store works again at once
    assert [message["_job"] for message in store.list_pending("p")] == ["before", "after"]


# --- PgBouncer -------------------------------------------------------------------------------------------------


def test_every_operation_works_through_pgbouncer_in_transaction_mode(pgbouncer_database_url):
    store = JobStore.for_url(pgbouncer_database_url)  # migrates a new database through the bouncer, too
    store.register_node(worker="w", name="n", url=None, max_proc=2)
    store.enqueue("p", {"name": "s", "_job": "a"}, priority=1)
    store.enqueue("p", {"name": "s", "_job": "b"})
    assert store.heartbeat("w")
    [claimed] = store.claim_next_jobs(None, 1, node="n", worker="w").jobs
    assert claimed.job == "a"
    now = datetime.datetime.now()
    assert store.finish_job(project="p", spider="s", job="a", start_time=now, end_time=now, claimed=claimed, worker="w")
    assert [row.job for row in store.list_terminated(10)] == ["a"]
    AllJobsStore.for_url(pgbouncer_database_url).cancel_job("p", "b")
    assert store.count_pending("p") == 0


def test_the_listener_hears_postgres_directly_and_falls_back_to_polling_behind_pgbouncer(
    database_url, pgbouncer_database_url
):
    JobStore.for_url(database_url)  # the schema
    heard = []
    direct = notifications.Listener(database_url, JobStore.for_url(database_url).notify)
    direct.subscribe("test_channel", heard.append)
    direct.want_slot(True)  # as a node's poller asks while the node wants work: only a slot's holder LISTENs
    direct.start()
    bounced = notifications.Listener(pgbouncer_database_url, JobStore.for_url(pgbouncer_database_url).notify)
    bounced.start()
    try:
        wait_for(direct.connected.is_set, 30, "the direct listener to connect")
        JobStore.for_url(database_url).notify("test_channel", "hello")
        wait_for(lambda: heard == ["hello"], 5, "the notification")
        wait_for(bounced.poll_only.is_set, 30, "the listener behind PgBouncer to give up LISTEN")
        assert not direct.poll_only.is_set()
        # Poll-only listens no more: the listener ends just after it says so (its connection is the lease's now).
        wait_for(lambda: not bounced.is_alive(), 5, "the poll-only listener to end")
    finally:
        direct.stop()
        bounced.stop()


def _migrate_to(url, revision, down=False):
    """Upgrade (or downgrade) the schema of ``url`` to ``revision`` in one transaction, as db.migrate does."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    config = Config()
    config.set_main_option("script_location", db._alembic_config().get_main_option("script_location"))
    engine = create_engine(db.normalise_url(url))
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            (command.downgrade if down else command.upgrade)(config, revision)
    finally:
        engine.dispose()


def test_0003_upgrades_a_populated_queue_and_keeps_every_row(database_url):
    _migrate_to(database_url, "0002")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, worker, end_time, created_time)
        SELECT 'p', 's', 'job-' || i, i %% 10, jsonb_build_object('name', 's', '_job', 'job-' || i),
               (ARRAY['pending', 'ongoing', 'terminated'])[1 + i %% 3],
               CASE WHEN i %% 3 = 1 THEN 'w' END, CASE WHEN i %% 3 = 2 THEN localtimestamp END, localtimestamp
        FROM generate_series(1, %s) AS i
    """, (3000,))
    before = query(database_url, "SELECT id, status, job, priority FROM spider_job ORDER BY id")

    _migrate_to(database_url, "0003")

    assert query(database_url, "SELECT id, status, job, priority FROM spider_job ORDER BY id") == before
    [(options,)] = query(database_url, "SELECT reloptions FROM pg_class WHERE relname = 'spider_job'")
    assert "autovacuum_vacuum_cost_delay=0" in options
    # The indexes still answer: the live key refuses a live duplicate, the job index finds a terminated job.
    with pytest.raises(psycopg2.errors.UniqueViolation):
        query(database_url, "UPDATE spider_job SET job = 'job-1' WHERE job = 'job-3'")
    assert query(database_url, "SELECT status FROM spider_job WHERE job = 'job-2'") == [("terminated",)]

    _migrate_to(database_url, "0002", down=True)
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(3000,)]
    assert query(database_url, "SELECT reloptions FROM pg_class WHERE relname = 'spider_job'") == [(None,)]


def test_0006_upgrades_a_populated_queue_whose_claim_then_promotes_and_claims_in_one_call(database_url):
    _migrate_to(database_url, "0005")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
        SELECT 'p', 's', 'job-' || i, i %% 10, jsonb_build_object('name', 's', '_job', 'job-' || i),
               CASE WHEN i %% 2 = 0 THEN 'pending' ELSE 'delayed' END,
               CASE WHEN i %% 4 = 1 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END, localtimestamp
        FROM generate_series(1, %s) AS i
    """, (3000,))

    _migrate_to(database_url, "0006")

    claim = JobStore.for_url(database_url).claim_next_jobs(["p"], 5, node="n", worker="w")
    assert claim.became_due == 750  # the delayed jobs already due (i % 4 == 1)
    # The best of them (priority 9, above any pending job's 8) are claimed by the call that promoted them.
    assert [int(job.job.split("-")[1]) % 20 for job in claim.jobs] == [9] * 5
    assert 3590 < claim.next_due_in <= 3600
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE status = 'pending'") == [(1500 + 750 - 5,)]

    _migrate_to(database_url, "0005", down=True)
    assert query(database_url, "SELECT count(*) FROM pg_proc WHERE proname = 'claim_spider_jobs'") == [(0,)]
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(3000,)]


def test_0007_reads_the_stored_naive_times_in_the_sessions_time_zone_and_claims_on_the_database_clock(
    database_url, monkeypatch
):
    monkeypatch.setenv("PGTZ", "America/Adak")  # this test's sessions (libpq), the migration's among them
    _migrate_to(database_url, "0006")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, created_time, start_time, end_time)
        SELECT 'p', 's', 'job-' || i, 0, jsonb_build_object('name', 's', '_job', 'job-' || i), status,
               naive, CASE WHEN status = 'terminated' THEN naive + interval '1 second' END,
               CASE WHEN status = 'terminated' THEN naive + interval '1 minute' END
        FROM generate_series(1, %s) AS i,
             LATERAL (SELECT timestamp '2026-01-15 10:00:00.123456' + i * interval '7 seconds' AS naive,
                             CASE WHEN i %% 2 = 0 THEN 'pending' ELSE 'terminated' END AS status) AS row
    """, (3000,))
    times = "SELECT job, created_time, start_time, end_time FROM spider_job ORDER BY id"
    before = query(database_url, times)

    _migrate_to(database_url, "0007")

    in_adak = "SELECT job, {} FROM spider_job ORDER BY id".format(
        ", ".join(f"{column} AT TIME ZONE 'America/Adak'" for column in ("created_time", "start_time", "end_time")))
    assert query(database_url, in_adak) == before
    [(first, second)] = query(database_url, "SELECT min(end_time), max(end_time) FROM spider_job")
    assert first.utcoffset() is not None and second - first == datetime.timedelta(seconds=7 * 2998)
    store = JobStore.for_url(database_url)
    [claimed] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
    [(started_ago,)] = query(database_url, "SELECT now() - start_time FROM spider_job WHERE id = %s", (claimed.id,))
    assert datetime.timedelta(0) <= started_ago < datetime.timedelta(minutes=1)
    now = datetime.datetime.now()
    store.finish_job(project="p", spider="s", job=claimed.job, start_time=now, end_time=now, claimed=claimed,
                     worker="w")
    assert [row.job for row in store.list_terminated(2)] == [claimed.job, "job-2999"]  # the newest end first
    assert query(database_url, "SELECT count(*) FROM pg_proc WHERE prosrc LIKE '%%localtimestamp%%'") == [(0,)]

    _migrate_to(database_url, "0006", down=True)
    untouched = [row for row in query(database_url, times) if row[0] != claimed.job]
    assert untouched == [row for row in before if row[0] != claimed.job]
    assert query(database_url, "SELECT pg_get_function_identity_arguments(oid) FROM pg_proc "
                               "WHERE proname = 'claim_spider_jobs'") == [
        ("p_projects text[], p_limit integer, p_node text, p_worker text, p_start timestamp without time zone, "
         "p_channel text",)]


def test_0008_upgrades_a_populated_queue_whose_wanted_nodes_then_count_its_work(database_url):
    _migrate_to(database_url, "0007")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, status, run_at, created_time)
        SELECT 'p', 's', 'job-' || i, (ARRAY['pending', 'delayed', 'terminated'])[1 + i %% 3],
               now() + CASE WHEN i %% 2 = 0 THEN interval '-1 minute' ELSE interval '1 hour' END, now()
        FROM generate_series(1, %s) AS i
    """, (3000,))

    _migrate_to(database_url, "0008")

    # 1,000 pending jobs and the 500 delayed ones already due (i % 3 = 1 and i even), 4 slots a node.
    assert query(database_url, "SELECT scrapyd_pgqueue_wanted_nodes(4)") == [(375,)]
    _migrate_to(database_url, "0007", down=True)
    assert query(database_url, "SELECT count(*) FROM pg_proc WHERE proname = 'scrapyd_pgqueue_wanted_nodes'") == [(0,)]
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(3000,)]


def test_0009_upgrades_a_populated_queue_whose_claim_then_takes_one_statement_when_nothing_is_due(database_url):
    _migrate_to(database_url, "0008")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
        SELECT 'p', 's', 'job-' || i, i %% 10, jsonb_build_object('name', 's', '_job', 'job-' || i),
               (ARRAY['pending', 'delayed', 'terminated'])[1 + i %% 3],
               CASE WHEN i %% 6 = 1 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END, now()
        FROM generate_series(1, %s) AS i
    """, (3000,))
    settings = "SELECT proname, proconfig FROM pg_proc WHERE proname IN ('claim_spider_jobs', 'spider_job_next_due')"
    assert sorted(query(database_url, settings)) == [("claim_spider_jobs", None), ("spider_job_next_due", None)]

    _migrate_to(database_url, "0009")

    assert query(database_url, settings) == [
        ("claim_spider_jobs", ["plan_cache_mode=force_generic_plan", "lock_timeout=15s"])]
    store = JobStore.for_url(database_url)
    due = store.claim_next_jobs(["p"], 5, node="n", worker="w")
    assert due.became_due == 500  # the delayed jobs already due (i % 6 == 1), promoted before the claim
    assert [int(job.job.split("-")[1]) % 10 for job in due.jobs] == [9] * 5  # the best of all, due ones included
    assert 3590 < due.next_due_in <= 3600
    at_once = store.claim_next_jobs(["p"], 3, node="n", worker="w")  # nothing due: the first statement alone
    assert len(at_once.jobs) == 3 and at_once.became_due == 0 and 3590 < at_once.next_due_in <= 3600
    assert query(database_url, "SELECT count(*) FROM spider_job WHERE status = 'pending'") == [(1000 + 500 - 8,)]

    _migrate_to(database_url, "0008", down=True)
    assert sorted(query(database_url, settings)) == [("claim_spider_jobs", None), ("spider_job_next_due", None)]
    assert len(store.claim_next_jobs(["p"], 2, node="n", worker="w").jobs) == 2
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(3000,)]


def test_0010_pins_every_function_s_search_path_and_gives_each_stored_egg_its_sha256(database_url):
    _migrate_to(database_url, "0009")
    eggs = {f"{version}": os.urandom(100_000) for version in range(3)}
    for version, egg in eggs.items():
        query(database_url, "INSERT INTO project_egg (project, version, egg) VALUES ('p', %s, %s)",
              (version, psycopg2.Binary(egg)))
    paths = "SELECT proname, (SELECT s FROM unnest(proconfig) AS s WHERE s LIKE 'search_path=%%') FROM pg_proc " \
            "WHERE pronamespace = 'public'::regnamespace ORDER BY 1"
    assert dict(query(database_url, paths)) == {
        "claim_spider_jobs": None, "scrapyd_pgqueue_wanted_nodes": "search_path=public, pg_temp",
        "spider_job_running": None, "spider_tree_count": None}

    _migrate_to(database_url, "0010")

    assert set(dict(query(database_url, paths)).values()) == {"search_path=public, pg_temp"}
    digests = query(database_url, "SELECT version, sha256 FROM project_egg")
    stored = {version: bytes(digest) for version, digest in digests}
    assert stored == {version: hashlib.sha256(egg).digest() for version, egg in eggs.items()}
    with pytest.raises(psycopg2.errors.NotNullViolation):  # every egg has one from now on
        query(database_url, "INSERT INTO project_egg (project, version, egg) VALUES ('p', 'x', 'egg')")

    _migrate_to(database_url, "0009", down=True)
    assert dict(query(database_url, paths))["claim_spider_jobs"] is None
    assert query(database_url, "SELECT count(*) FROM project_egg") == [(3,)]


# A password with an unencoded '@' and '/': libpq would take "Zk9" for the host and "Wm3@..." for the database.
AMBIGUOUS_URL = "postgresql://scrapyd:Xq7@Zk9/Wm3@db.internal:5432/scrapyd"
PASSWORD_PARTS = ("Xq7", "Zk9", "Wm3")


def test_an_ambiguous_database_url_is_refused_before_any_connection_and_never_shown(tmp_path):
    with pytest.raises(db.DatabaseError) as raised:
        db.get_engine(AMBIGUOUS_URL)
    assert "ambiguous database URL" in str(raised.value)
    assert db.describe(AMBIGUOUS_URL) == "(a database URL that is not valid)"  # not "Zk9:5432/Wm3@..."
    cli = subprocess.run([str(Path(sys.executable).parent / "scrapyd-pgqueue"), "migrate"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "SCRAPYD_DATABASE_URL": AMBIGUOUS_URL})
    assert cli.returncode == 2 and "ambiguous database URL" in cli.stderr, cli.stderr
    with pytest.raises(RuntimeError, match="exited at start-up") as refused:
        LocalCluster(AMBIGUOUS_URL, 1, directory=tmp_path / "node").start()
    assert "database URL of SCRAPYD_DATABASE_URL or 'database_url' is ambiguous" in str(refused.value)
    shown = [str(raised.value), cli.stdout + cli.stderr, str(refused.value)]
    shown += [log.read_text(errors="replace") for log in (tmp_path / "node").rglob("*.log")]
    assert not any(part in text for part in PASSWORD_PARTS for text in shown)


def test_0013_upgrades_a_populated_queue_whose_jobs_then_take_watchdog_limits_and_outcomes(database_url):
    _migrate_to(database_url, "0009")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, status, outcome, run_at, created_time, end_time)
        SELECT 'p', 's', 'job-' || i, 'terminated', (ARRAY['finished', 'failed', 'dead'])[1 + i %% 3], now(), now(),
               now()
        FROM generate_series(1, %s) AS i
    """, (3000,))
    query(database_url, "INSERT INTO periodic_job (name, project, spider, every_seconds, next_fire_time) "
                        "VALUES ('often', 'p', 's', 60, now())")

    _migrate_to(database_url, "0013")

    assert query(database_url, "SELECT count(*), count(max_runtime), count(stall_timeout) FROM spider_job") == [
        (3000, 0, 0)]
    query(database_url, "UPDATE spider_job SET outcome = 'timeout', max_runtime = 3 WHERE job = 'job-1'")
    query(database_url, "UPDATE spider_job SET outcome = 'stalled', stall_timeout = 60 WHERE job = 'job-2'")
    query(database_url, "UPDATE periodic_job SET max_runtime = 3600")
    _migrate_to(database_url, "0009", down=True)
    assert query(database_url, "SELECT outcome, count(*) FROM spider_job GROUP BY outcome ORDER BY outcome") == [
        ("dead", 999), ("failed", 1001), ("finished", 1000)]  # timeout and stalled read as failed, as before


def test_0014_upgrades_a_populated_queue_whose_jobs_require_no_tag_and_downgrades(database_url):
    _migrate_to(database_url, "0013")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
        SELECT 'p', 's', 'job-' || i, i %% 5, jsonb_build_object('name', 's', '_job', 'job-' || i), 'pending', now(),
               now()
        FROM generate_series(1, 2000) AS i
    """)
    before = query(database_url, "SELECT id, job, priority FROM spider_job ORDER BY priority DESC, id")

    _migrate_to(database_url, "0014")
    assert query(database_url, "SELECT DISTINCT pool FROM spider_job") == [("",)]
    from scrapyd_pgqueue.store import JobStore

    store = JobStore.for_url(database_url)
    claimed = store.claim_next_jobs(["p"], 3, node="n", worker="w").jobs
    assert [job.id for job in claimed] == [row[0] for row in before[:3]]  # a node without tags: the same order
    query(database_url, "UPDATE spider_job SET pool = 'browser' WHERE id = %s", (before[3][0],))
    store.engine.dispose()

    _migrate_to(database_url, "0013", down=True)
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(2000,)]
    [(job,)] = query(database_url, "SELECT job FROM claim_spider_jobs(ARRAY['p'], 1, 'n', 'w', 'c') "
                                   "WHERE id IS NOT NULL")
    assert job == before[3][1]  # required tags forgotten: it runs anywhere, in its place


def test_0016_upgrades_populated_nodes_which_then_count_as_wanting_work_until_they_say(database_url):
    _migrate_to(database_url, "0013")
    query(database_url, "INSERT INTO scrapyd_node (id, name, max_proc, stopped_time) "
                        "SELECT 'w' || i, 'n' || i, 2, CASE WHEN i %% 2 = 0 THEN now() END "
                        "FROM generate_series(1, 500) AS i")

    _migrate_to(database_url, "0016")

    wanting = "SELECT count(*) FROM scrapyd_node WHERE wants_work IS NOT FALSE AND stopped_time IS NULL"
    assert query(database_url, wanting) == [(250,)]  # older nodes never say: they are woken as before
    query(database_url, "UPDATE scrapyd_node SET wants_work = false WHERE id <> 'w1'")
    assert query(database_url, wanting) == [(1,)]
    _migrate_to(database_url, "0013", down=True)
    assert query(database_url, "SELECT count(*) FROM scrapyd_node") == [(500,)]


def test_0022_upgrades_a_populated_queue_whose_wanted_nodes_pass_1000_and_whose_scaler_keeps_its_rights(
    database_url, admin_connection
):
    _migrate_to(database_url, "0021")
    query(database_url, """
        INSERT INTO spider_job (project, spider, job, status, run_at, created_time, pool)
        SELECT 'p', 's', 'job-' || i, (ARRAY['pending', 'delayed', 'terminated'])[1 + i %% 3],
               now() + CASE WHEN i %% 2 = 0 THEN interval '-1 minute' ELSE interval '1 hour' END, now(),
               CASE WHEN i %% 5 = 0 THEN 'browser' ELSE '' END
        FROM generate_series(1, %s) AS i
    """, (9000,))
    scaler = f"scaler_{uuid.uuid4().hex[:8]}"  # roles belong to the whole server
    with admin_connection.cursor() as cursor:  # docs/how-to/kubernetes.md's scaler role, as granted before 0022
        cursor.execute(f"CREATE ROLE {scaler} LOGIN PASSWORD 'scaler-pw'")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION scrapyd_pgqueue_wanted_nodes(integer) TO {scaler}")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION scrapyd_pgqueue_wanted_nodes(integer, text[]) TO {scaler}")
    scaler_url = make_url(database_url).set(username=scaler, password="scaler-pw").render_as_string(False)
    # 3,000 pending jobs and the 1,500 delayed ones already due; 3,600 of them require no tag.
    asked = ("SELECT scrapyd_pgqueue_wanted_nodes(1)", "SELECT scrapyd_pgqueue_wanted_nodes(1, ARRAY['eu'])")
    assert [query(scaler_url, statement) for statement in asked] == [[(1000,)], [(1000,)]]

    _migrate_to(database_url, "0022")

    assert [query(scaler_url, statement) for statement in asked] == [[(4500,)], [(3600,)]]
    assert query(scaler_url, "SELECT scrapyd_pgqueue_wanted_nodes(1, 2000), "
                             "scrapyd_pgqueue_wanted_nodes(1, ARRAY['browser'], 4000)") == [(2000, 4000)]
    assert query(database_url, "SELECT p.oid::regprocedure::text FROM pg_proc AS p "
                               "WHERE p.proname = 'scrapyd_pgqueue_wanted_nodes' "
                               "AND has_function_privilege('public', p.oid, 'EXECUTE')") == []
    _migrate_to(database_url, "0021", down=True)
    assert [query(scaler_url, statement) for statement in asked] == [[(1000,)], [(1000,)]]
    assert query(database_url, "SELECT count(*) FROM spider_job") == [(9000,)]
