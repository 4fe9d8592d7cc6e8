"""PostgresJobStorage: finished jobs of the whole cluster, newest first, trimmed to finished_to_keep."""

import datetime
import os
import time
import uuid

import pytest
from scrapyd.config import Config
from scrapyd.interfaces import IJobStorage
from scrapyd.launcher import ScrapyProcessProtocol
from zope.interface.verify import verifyObject

from helpers import jobs, node_role, schedule, wait_for
from scrapyd_pgqueue import PostgresJobStorage, PostgresSpiderQueue
from scrapyd_pgqueue.store import JobStore


def finished_process(project, spider, job, minutes_ago=0, env=None):
    process = ScrapyProcessProtocol(project, spider, job, env=env or {}, args=["crawl", spider])
    process.pid = 4242
    process.start_time = datetime.datetime.now() - datetime.timedelta(minutes=minutes_ago + 1, microseconds=17)
    process.end_time = datetime.datetime.now() - datetime.timedelta(minutes=minutes_ago, microseconds=3)
    return process


@pytest.fixture
def storage(scrapyd_config):
    return PostgresJobStorage(scrapyd_config)


def test_implements_ijobstorage(storage):
    assert verifyObject(IJobStorage, storage)


def test_add_terminates_the_queued_row(scrapyd_config, storage, admin_connection):
    queue = PostgresSpiderQueue(scrapyd_config, "p")
    queue.add("s", _job="j1")
    queue.pop()
    process = finished_process("p", "s", "j1")
    storage.add(process)
    runtime = process.end_time - process.start_time
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT count(*), min(status), min(outcome), min(end_time) - min(start_time) FROM spider_job")
        assert cursor.fetchone() == (1, "terminated", "finished", runtime)  # the node's measure, microseconds kept
    [job] = storage.list()
    assert (job.project, job.spider, job.job, job.pid) == ("p", "s", "j1", 4242)
    # Scrapyd's naive local times, on the database's clock (this machine's: within the time add took).
    assert (job.start_time.tzinfo, job.end_time - job.start_time) == (None, runtime)
    assert abs(job.end_time - process.end_time) < datetime.timedelta(seconds=1)


def test_add_inserts_a_job_that_never_went_through_the_queue(storage):
    storage.add(finished_process("p", "s", "outside"))
    assert [job.job for job in storage] == ["outside"]
    assert len(storage) == 1


def test_iteration_is_newest_end_first(storage):
    for minutes_ago, job in [(5, "old"), (0, "new"), (2, "mid")]:
        storage.add(finished_process("p", "s", job, minutes_ago))
    assert [job.job for job in storage] == ["new", "mid", "old"]


def test_finished_to_keep_is_enforced(database_url):
    storage = PostgresJobStorage(Config(values={"database_url": database_url, "finished_to_keep": "3"}))
    for i in range(6):
        storage.add(finished_process("p", "s", f"j{i}", minutes_ago=10 - i))
    assert [job.job for job in storage] == ["j5", "j4", "j3"]
    assert len(storage) == 3


def test_a_finished_job_id_may_be_scheduled_again(scrapyd_config, storage):
    queue = PostgresSpiderQueue(scrapyd_config, "p")
    queue.add("s", _job="again")
    queue.pop()
    storage.add(finished_process("p", "s", "again"))
    queue.add("s", _job="again")
    assert queue.count() == 1


def test_environment_and_password_are_never_stored(database_url, storage, admin_connection):
    env = dict(os.environ, SCRAPYD_DATABASE_URL=database_url, SECRET_TOKEN="hunter2-do-not-store")
    storage.add(finished_process("p", "s", "envjob", env=env))
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT to_jsonb(spider_job)::text FROM spider_job")
        [row] = cursor.fetchone()
    assert "hunter2-do-not-store" not in row
    assert "SCRAPYD_DATABASE_URL" not in row


def test_nodes_finishing_and_pruning_at_once_never_deadlock(database_url):
    from concurrent.futures import ThreadPoolExecutor

    config = Config(values={"database_url": database_url, "finished_to_keep": "2"})

    def finish_many(node):
        storage = PostgresJobStorage(config)  # one per node; each add() prunes, as every node does
        for i in range(200):
            storage.add(finished_process("p", "s", f"{node}-{i}"))
        return node

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(finish_many, range(8))) == list(range(8))  # a deadlock would raise here
    storage = PostgresJobStorage(config)
    assert len(storage) == 2
    assert storage.store.count_terminated() <= 2 + 8  # each node's last prune may skip rows another was deleting


def dead_job(storage, job, minutes_ago):
    """A job of retries=1 that failed twice through storage.add (the node's finish): dead, with a stored log."""
    from scrapyd_pgqueue import config as pgconfig
    from scrapyd_pgqueue.job_rules.options import JobOptions

    storage.store.enqueue("p", {"name": "s", "_job": job}, options=JobOptions(retries=1))
    for _ in range(2):  # the retry is due at once (retry_delay 0)
        [claimed] = storage.store.claim_next_jobs(["p"], 1, node="n", worker=pgconfig.WORKER_ID).jobs
        process = finished_process("p", "s", job, minutes_ago)
        process.claimed, process.outcome = claimed, "failed"
        storage.add(process)
    storage.all_jobs_store.save_log(project="p", job=job, log=b"the end of the log", size=18)


def dead_rows(admin_connection):
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT j.job, l.job_id IS NOT NULL FROM spider_job AS j LEFT JOIN job_log AS l "
                       "ON l.job_id = j.id WHERE j.outcome = 'dead' ORDER BY j.end_time DESC")
        return cursor.fetchall()


def test_dead_jobs_are_kept_unless_dead_to_keep_says_otherwise(database_url, admin_connection):
    values = {"database_url": database_url, "finished_to_keep": "1"}
    keeping = PostgresJobStorage(Config(values=values))
    for i in range(3):
        dead_job(keeping, f"dead{i}", minutes_ago=30 - i)
    for i in range(3):
        keeping.add(finished_process("p", "s", f"ok{i}", minutes_ago=10 - i))
    # The default: every dead job stays (the dead letters), with its log; finished jobs are trimmed as always.
    assert dead_rows(admin_connection) == [("dead2", True), ("dead1", True), ("dead0", True)]
    assert [job.job for job in keeping] == ["ok2"]

    pruning = PostgresJobStorage(Config(values={**values, "dead_to_keep": "1"}))
    pruning.add(finished_process("p", "s", "ok3"))
    assert dead_rows(admin_connection) == [("dead2", True)]  # the newest dead job, its log kept
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM job_log")
        assert cursor.fetchone() == (1,)  # the pruned jobs' logs went with them
    assert [job.job for job in pruning] == ["ok3"]

    PostgresJobStorage(Config(values={**values, "dead_to_keep": "0"})).add(finished_process("p", "s", "ok4"))
    assert dead_rows(admin_connection) == []


# --- finishes are independent: on real nodes --------------------------------------------------------------------


@pytest.fixture
def granted_role(database_url, admin_connection):
    """A node role with exactly a node's rights (``scrapyd-pgqueue grant``): (its name, its URL)."""
    role = f"node_{uuid.uuid4().hex[:8]}"
    yield role, node_role(admin_connection, database_url, role)
    with admin_connection.cursor() as cursor:  # after the nodes stopped (start_cluster is torn down first)
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")


def test_without_delete_every_finish_of_a_node_is_recorded(granted_role, start_cluster, database_url,
                                                           admin_connection):
    role, url = granted_role
    with admin_connection.cursor() as cursor:
        cursor.execute(f"REVOKE DELETE ON spider_job FROM {role}")  # so every prune after a finish fails
    [node] = start_cluster(url, 1, max_proc="1").nodes
    names = ["first", "second", "third"]
    started = time.monotonic()
    for job in names:
        schedule(node, job)
    wait_for(lambda: {state[:2] for state in jobs(database_url, *names).values()} == {("terminated", "finished")},
             60, "all three jobs of the node to be recorded")
    minutes = (time.monotonic() - started) // 60
    log = node.logfile.read_text()
    assert 1 <= log.count("Could not prune the finished jobs") <= 1 + minutes, "said once, tried again a minute later"
    assert "permission denied" in log and "Could not record" not in log


def test_a_finish_the_database_refuses_holds_back_no_other(start_cluster, database_url, admin_connection):
    with admin_connection.cursor() as cursor:  # the database refuses to end job "refused", and that one only
        JobStore.for_url(database_url).engine.dispose()  # migrates the schema
        cursor.execute("""
            CREATE FUNCTION refuse_finish() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'finish refused for this test'; END $$;
            CREATE TRIGGER refuse_finish BEFORE UPDATE ON spider_job FOR EACH ROW
            WHEN (NEW.job = 'refused' AND NEW.status = 'terminated') EXECUTE FUNCTION refuse_finish();
        """)
    [node] = start_cluster(database_url, 1, max_proc="1").nodes
    started = time.monotonic()
    for job in ("refused", "second", "third"):  # one slot: "refused" ends first, ahead of the others' finishes
        schedule(node, job)
    wait_for(lambda: {job: state[:2] for job, state in jobs(database_url).items()} == {
        "refused": ("ongoing", None), "second": ("terminated", "finished"), "third": ("terminated", "finished"),
    }, 60, "the two later jobs to be recorded behind the refused finish")
    wait_for(lambda: node.logfile.read_text().count("finish refused for this test") >= 1, 10, "the failure logged")
    with admin_connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER refuse_finish ON spider_job")
    wait_for(lambda: jobs(database_url, "refused")["refused"][:2] == ("terminated", "finished"), 30,
             "the refused finish to be recorded once the database takes it")
    minutes = (time.monotonic() - started) // 60
    said = node.logfile.read_text().count("Could not record 1 finished jobs (refused)")
    assert 1 <= said <= 1 + minutes, "retried every heartbeat, said once a minute"
