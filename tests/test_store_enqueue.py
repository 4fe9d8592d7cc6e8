"""Enqueues wake idle nodes with one NOTIFY, an empty payload, and only while some node wants work."""

from helpers import heard
from scrapyd_pgqueue.store import NOTIFY_CHANNEL, JobStore


def test_a_batch_sends_one_empty_notify_while_a_node_wants_work_and_none_once_every_node_is_busy(
    database_url, admin_connection
):
    store = JobStore.for_url(database_url)
    admin_connection.cursor().execute(f"LISTEN {NOTIFY_CHANNEL}")
    store.enqueue("p", {"name": "s", "_job": "nobody"})
    assert heard(admin_connection, 0.5) == []  # no node at all: nobody to wake

    store.register_node(worker="w1", name="n1", url=None, max_proc=2)  # has not said yet: counts as wanting
    store.register_node(worker="w2", name="n2", url=None, max_proc=2)
    store.enqueue_many("p", [({"name": "s", "_job": f"a{i}"}, 0.0) for i in range(100)])
    assert heard(admin_connection, 2) == [(NOTIFY_CHANNEL, "")]  # one per transaction, not one per job
    store.enqueue("q", {"name": "s", "_job": "other-project"})
    assert heard(admin_connection, 2) == [(NOTIFY_CHANNEL, "")]  # the same for every project

    store.set_wants_work("w1", False)
    store.enqueue("p", {"name": "s", "_job": "w2-still-wants"})
    assert heard(admin_connection, 2) == [(NOTIFY_CHANNEL, "")]
    store.set_wants_work("w2", False)  # every node busy: they claim again when a slot frees
    store.enqueue_many("p", [({"name": "s", "_job": f"b{i}"}, 0.0) for i in range(100)])
    assert heard(admin_connection, 0.5) == []
    store.set_wants_work("w1", True)
    store.enqueue("p", {"name": "s", "_job": "w1-wants-again"})
    assert heard(admin_connection, 2) == [(NOTIFY_CHANNEL, "")]
    store.stop_node("w1")  # a stopped node wakes for nothing
    store.enqueue("p", {"name": "s", "_job": "after-stop"})
    assert heard(admin_connection, 0.5) == []
