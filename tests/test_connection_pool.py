"""The pool of a process's connections, on a real Postgres: what it lends, what it keeps, how long a caller waits."""

import threading
import time
import uuid

import pytest

from helpers import query, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import Engine, PoolTimeout
from scrapyd_pgqueue.database.sql import IntegrityError


@pytest.fixture
def engine(database_url):
    """A pool of one connection of its own, named so that pg_stat_activity tells its sessions apart."""
    name = f"pool-test-{uuid.uuid4().hex[:8]}"
    engine = Engine(database_url, pool_size=1, timeout=30.0, connect_args={"application_name": name})
    engine.name = name
    yield engine
    engine.dispose()


def sessions_of(database_url, engine):
    return query(database_url, "SELECT pid, state FROM pg_stat_activity WHERE application_name = %s", (engine.name,))


def backend_pid(engine):
    with engine.connect() as connection:
        return connection.execute("SELECT pg_backend_pid()").scalar_one()


def test_a_connection_is_kept_and_lent_again_and_every_statement_carries_the_timeouts(database_url, engine):
    first = backend_pid(engine)
    assert backend_pid(engine) == first
    with engine.connect() as connection:
        assert connection.execute("SHOW statement_timeout").scalar() == "15s"
        assert connection.execute("SELECT :a::int + :b AS total", {"a": "2", "b": 3}).one().total == 5
    assert sessions_of(database_url, engine) == [(first, "idle")]


def test_a_connection_left_inside_a_transaction_is_closed_not_lent_again(database_url, engine):
    first = backend_pid(engine)
    with engine.connect() as connection:
        connection.control("BEGIN")
        connection.execute("CREATE TEMPORARY TABLE left_open (x int)")
    # Neither an open transaction on the server nor its session: the next caller gets a fresh connection.
    assert backend_pid(engine) != first
    assert [state for _, state in sessions_of(database_url, engine)] == ["idle"]


def test_a_wait_for_a_free_connection_ends_at_the_callers_deadline(engine):
    with engine.connect():
        started = time.monotonic()
        with pytest.raises(PoolTimeout), db.deadline(0.5):
            engine.connect()
        assert time.monotonic() - started < 5  # the deadline's half second, not the pool's 30 s timeout


def test_a_waiting_caller_gets_the_connection_as_soon_as_it_is_given_back(engine):
    lent = engine.connect()
    got = []
    waiter = threading.Thread(target=lambda: got.append(backend_pid(engine)))
    waiter.start()
    lent.close()
    waiter.join(10)
    assert len(got) == 1


def test_driver_errors_leave_with_the_servers_code_and_the_connection_stays_usable(database_url, engine):
    with engine.connect() as connection:
        connection.execute("CREATE TEMPORARY TABLE once (x int PRIMARY KEY)")
        connection.execute("INSERT INTO once VALUES (1)")
        with pytest.raises(IntegrityError) as raised:
            connection.execute("INSERT INTO once VALUES (:x)", {"x": 1})
        assert raised.value.orig.pgcode == "23505" and not raised.value.connection_invalidated
        assert connection.execute("SELECT count(*) FROM once").scalar_one() == 1


def test_dispose_closes_the_idle_connections(database_url, engine):
    backend_pid(engine)
    engine.dispose()
    wait_for(lambda: sessions_of(database_url, engine) == [], 10, "the idle session to end")
