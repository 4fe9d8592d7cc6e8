"""PostgresSpiderQueue behaves like Scrapyd's SqliteSpiderQueue, over a real Postgres."""

import pytest
from scrapyd.interfaces import ISpiderQueue
from zope.interface.verify import verifyObject

from scrapyd_pgqueue import PostgresSpiderQueue
from scrapyd_pgqueue.job_rules.checks import InvalidJobError
from scrapyd_pgqueue.store import DuplicateJobError


@pytest.fixture
def queue(scrapyd_config):
    return PostgresSpiderQueue(scrapyd_config, "quotes")


def test_implements_ispiderqueue(queue):
    assert verifyObject(ISpiderQueue, queue)


def test_add_pop_roundtrips_message_exactly(queue):
    args = {
        "_job": "j1",
        "_version": "r23",
        "settings": {"DOWNLOAD_DELAY": "0.5", "nested": {"a": [1, 2.5, None, True]}},
        "city": "Zürich ☃ 東京 \U0001f577",
        "count": 3,
        "ratio": 0.1,
        "quote": "it's \"quoted\"; DROP TABLE spider_job; --",
    }
    queue.add("toscrape", priority=1.5, **args)
    assert queue.pop() == {"name": "toscrape", **args}
    assert queue.pop() is None


def test_add_without_job_id_adds_no_key(queue):
    queue.add("toscrape", city="Paris")
    assert queue.list() == [{"name": "toscrape", "city": "Paris"}]
    assert queue.pop() == {"name": "toscrape", "city": "Paris"}


def test_priority_high_to_low_then_first_in_first_out(queue):
    for job, priority in [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -1), ("f", 0.5)]:
        queue.add("s", priority=priority, _job=job)
    expected = ["b", "d", "f", "a", "c", "e"]
    assert [m["_job"] for m in queue.list()] == expected
    assert [queue.pop()["_job"] for _ in expected] == expected


def test_count_and_clear(queue):
    assert queue.count() == 0
    for i in range(5):
        queue.add("s", _job=f"j{i}")
    assert queue.count() == 5
    queue.pop()
    assert queue.count() == 4
    queue.clear()
    assert queue.count() == 0
    assert queue.list() == []


def test_remove_returns_count_and_touches_pending_only(queue):
    for i in range(6):
        queue.add("s", _job=f"j{i}", parity="even" if i % 2 == 0 else "odd")
    popped = queue.pop()  # j0, now ongoing
    assert popped["_job"] == "j0"
    assert queue.remove(lambda m: m["parity"] == "even") == 2  # j2, j4; j0 is running, not pending
    assert [m["_job"] for m in queue.list()] == ["j1", "j3", "j5"]
    assert queue.remove(lambda m: False) == 0


def test_projects_are_isolated(scrapyd_config):
    first = PostgresSpiderQueue(scrapyd_config, "first")
    second = PostgresSpiderQueue(scrapyd_config, "second")
    first.add("s", _job="1")
    first.add("s", _job="2")
    second.add("s", _job="3")
    assert first.count() == 2 and second.count() == 1
    second.clear()
    assert first.count() == 2
    assert first.remove(lambda m: True) == 2
    second.add("s", _job="4")
    assert first.pop() is None
    assert second.pop()["_job"] == "4"


def test_duplicate_live_job_id_is_refused_naming_it(queue):
    queue.add("s", _job="same")
    with pytest.raises(DuplicateJobError, match="'same'"):
        queue.add("s", _job="same")
    assert queue.count() == 1
    queue.pop()  # running: still live
    with pytest.raises(DuplicateJobError):
        queue.add("s", _job="same")


def test_same_job_id_in_another_project_is_accepted(scrapyd_config):
    PostgresSpiderQueue(scrapyd_config, "one").add("s", _job="x")
    PostgresSpiderQueue(scrapyd_config, "two").add("s", _job="x")
    assert PostgresSpiderQueue(scrapyd_config, "two").count() == 1


@pytest.mark.parametrize("priority", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_priority_is_refused(queue, priority):
    with pytest.raises(InvalidJobError, match="priority"):
        queue.add("s", priority=priority, _job="p")
    assert queue.count() == 0


def test_nul_character_is_refused(queue):
    with pytest.raises(InvalidJobError, match="NUL"):
        queue.add("s", _job="n", arg="a\x00b")
    assert queue.count() == 0


def test_pop_records_node_and_start_time(queue, admin_connection):
    queue.add("s", _job="j")
    queue.pop()
    with admin_connection.cursor() as cursor:
        cursor.execute("SELECT status, node, start_time IS NOT NULL, attempts FROM spider_job WHERE job = 'j'")
        assert cursor.fetchone() == ("ongoing", "test-node", True, 1)
