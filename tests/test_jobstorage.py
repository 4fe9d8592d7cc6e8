"""PostgresJobStorage: finished jobs of the whole cluster, newest first, trimmed to finished_to_keep."""

import datetime
import os

import pytest
from scrapyd.config import Config
from scrapyd.launcher import ScrapyProcessProtocol
from zope.interface.verify import verifyObject

from scrapyd.interfaces import IJobStorage
from scrapyd_pgqueue import PostgresJobStorage, PostgresSpiderQueue


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
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT count(*), min(status), min(outcome), min(start_time), min(end_time) FROM spider_job")
        assert cursor.fetchone() == (1, "terminated", "finished", process.start_time, process.end_time)
    [job] = storage.list()
    assert (job.project, job.spider, job.job, job.pid) == ("p", "s", "j1", 4242)
    assert (job.start_time, job.end_time) == (process.start_time, process.end_time)  # microseconds kept


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
