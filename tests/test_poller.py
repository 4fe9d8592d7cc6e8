"""A real node tells the cluster whether it wants work, so that schedules wake nodes only while one does."""

import contextlib

from helpers import connect, heard, query, runs_of, schedule, wait_for
from scrapyd_pgqueue.store import NOTIFY_CHANNEL


def wants_work(admin_url, node) -> list:
    return [row[0] for row in query(admin_url, "SELECT wants_work FROM scrapyd_node WHERE name = %s "
                                               "AND stopped_time IS NULL", (node.name,))]


def test_a_busy_node_is_not_woken_by_schedules_and_still_runs_them_when_its_slot_frees(
    database, start_cluster, tmp_path
):
    url, admin_url = database
    [node] = start_cluster(url, 1, max_proc="1", poll_interval="3600").nodes  # no tick: NOTIFY or a freed slot only
    wait_for(lambda: wants_work(admin_url, node) == [True], 30, "the idle node to say it wants work")
    with contextlib.closing(connect(admin_url)) as listening:
        listening.cursor().execute(f"LISTEN {NOTIFY_CHANNEL}")
        schedule(node, "first", seconds="3")
        assert heard(listening, 2) == [(NOTIFY_CHANNEL, "")]  # an idle node: woken at once
        wait_for(lambda: runs_of(tmp_path, "first"), 30, "the first crawl to start")
        wait_for(lambda: wants_work(admin_url, node) == [False], 10, "the full node to say it wants no more")

        for job in ("second", "third"):
            schedule(node, job, seconds="0")
            assert heard(listening, 0.5) == []  # every node busy: nobody to wake
        # Its slot frees: it claims at once, without a NOTIFY or a tick, until the queue is empty.
        wait_for(lambda: runs_of(tmp_path, "third"), 60, "the waiting jobs to run as the slot frees")
        wait_for(lambda: wants_work(admin_url, node) == [True], 30, "the idle node to want work again")
        schedule(node, "fourth", seconds="0")
        assert heard(listening, 2) == [(NOTIFY_CHANNEL, "")]
        wait_for(lambda: runs_of(tmp_path, "fourth"), 30, "the fourth crawl to start")
    assert [len(runs_of(tmp_path, job)) for job in ("first", "second", "third", "fourth")] == [1, 1, 1, 1]
