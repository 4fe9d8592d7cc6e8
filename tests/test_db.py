"""The connector: one engine per process, migrations under a lock, clear errors without the password."""

import multiprocessing
import time

import pytest
from scrapyd.config import Config

from scrapyd_pgqueue import PostgresJobStorage, PostgresSpiderQueue, db, devdb
from scrapyd_pgqueue.config import ConfigurationError


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


def newest_schema_version():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(db._alembic_config()).get_current_head()


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


def test_pooled_connections_killed_by_the_server_are_replaced_before_use(scrapyd_config, admin_connection, monkeypatch):
    queue = PostgresSpiderQueue(scrapyd_config, "p")
    queue.add("s", _job="before")
    monkeypatch.setattr(db, "PING_AFTER_IDLE_SECONDS", 0.0)  # every pooled connection counts as idle
    with admin_connection.cursor() as cursor:  # as a Postgres restart does to every session
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert cursor.fetchone()[0] >= 1
    queue.add("s", _job="after")  # no error: the dead connection was replaced
    assert [message["_job"] for message in queue.list()] == ["before", "after"]
