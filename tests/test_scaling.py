"""scrapyd_pgqueue_wanted_nodes(slots_per_node[, tags][, max_nodes]): the number of nodes an autoscaler (KEDA's
postgresql trigger, the chart's ScaledObject) asks for, on a real Postgres with pending, delayed, running, limited and
periodic work."""

from __future__ import annotations

import contextlib
import uuid

import psycopg2
import pytest
from sqlalchemy import make_url

from helpers import connect, node_role, query
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.store import JobStore, OverviewStore

WANTED = "SELECT scrapyd_pgqueue_wanted_nodes(%s)"
WANTED_UP_TO = "SELECT scrapyd_pgqueue_wanted_nodes(%s, %s)"
# The tags typed: psycopg2 sends an empty list as '{}', of no type, which Postgres would take for the one-argument
# form's max_nodes (an integer).
WANTED_BY_TAGS = "SELECT scrapyd_pgqueue_wanted_nodes(%s, CAST(%s AS text[]))"
WANTED_BY_TAGS_UP_TO = "SELECT scrapyd_pgqueue_wanted_nodes(%s, CAST(%s AS text[]), %s)"

# (project, spider, status, run_at relative to now, how many)
JOBS = [
    ("p", "free", "pending", "-1 minute", 5),
    ("p", "free", "ongoing", "-1 minute", 3),
    ("p", "free", "terminated", "-1 minute", 7),  # done: no work
    ("q", "later", "delayed", "-1 second", 4),  # due, not promoted yet (no node to promote it): work now
    ("q", "later", "delayed", "+1 hour", 6),  # not before its time
    ("p", "limited", "ongoing", "-1 minute", 1),  # max_running 2: one more may run, its 9 others wait for room
    ("p", "limited", "pending", "-1 minute", 10),
    ("q", "rare", "delayed", "-1 second", 1),  # max_running 3: its one due job
    ("q", "rare", "delayed", "+1 hour", 5),
]
LIMITS = [("p", "limited", 2), ("q", "rare", 3)]
# 5 + 3 pending and running free jobs, 4 due delayed ones, 2 of the limited spider (its limit), 1 of the rare one,
# and 1 periodic job due to fire (a paused one and one not due yet are no work).
WORK = 5 + 3 + 4 + 2 + 1 + 1


def insert_jobs(url, jobs) -> None:
    for project, spider, status, run_at, count in jobs:
        query(url, """
            INSERT INTO spider_job (project, spider, job, status, run_at, created_time, node, worker, start_time)
            SELECT %(project)s, %(spider)s, md5(random()::text), %(status)s, now() + %(run_at)s::interval, now(),
                   CASE WHEN %(status)s = 'ongoing' THEN 'n' END, CASE WHEN %(status)s = 'ongoing' THEN 'w' END,
                   CASE WHEN %(status)s = 'ongoing' THEN now() END
            FROM generate_series(1, %(count)s)
        """, {"project": project, "spider": spider, "status": status, "run_at": run_at, "count": count})


def wanted(url, slots):
    return query(url, WANTED, (slots,))[0][0]


@pytest.fixture
def queue_url(database_url):
    db.get_engine(database_url).dispose()  # migrated to the newest revision
    return database_url


def test_the_wanted_nodes_are_the_work_nodes_could_run_now_over_the_slots_of_a_node(queue_url):
    assert [wanted(queue_url, slots) for slots in (1, 4)] == [0, 0]  # idle: scaled to zero
    insert_jobs(queue_url, JOBS)
    for project, spider, max_running in LIMITS:
        query(queue_url, "INSERT INTO spider_limit (project, spider, max_running) VALUES (%s, %s, %s)",
              (project, spider, max_running))
    for name, paused, due in (("due", False, "-1 second"), ("paused", True, "-1 hour"), ("later", False, "+1 hour")):
        query(queue_url, "INSERT INTO periodic_job (name, project, spider, every_seconds, paused, next_fire_time) "
                         "VALUES (%s, 'p', 'free', 60, %s, now() + %s::interval)", (name, paused, due))

    replicas = {slots: wanted(queue_url, slots) for slots in (1, 3, 4, 5, 16, 17)}
    assert WORK == 16
    assert replicas == {1: 16, 3: 6, 4: 4, 5: 4, 16: 1, 17: 1}

    # The nodes take what they may: the claim promotes the due delayed jobs and fills the limited spiders up to
    # their limits. The work is the same, only running now (the limited spider's 9 waiting jobs still want none).
    claimed = JobStore.for_url(queue_url).claim_next_jobs(None, 100, node="n", worker="w").jobs
    assert len(claimed) == 5 + 4 + 1 + 1
    assert wanted(queue_url, 1) == WORK

    # Everything ends and the periodic job is paused: the delayed jobs not yet due and the limited spider's waiting
    # jobs remain; the limited spider wants its 2 slots, nothing else does.
    query(queue_url, "UPDATE spider_job SET status = 'terminated', outcome = 'finished', end_time = now() "
                     "WHERE status = 'ongoing'")
    query(queue_url, "UPDATE periodic_job SET paused = true")
    assert [wanted(queue_url, slots) for slots in (1, 2, 4)] == [2, 1, 1]
    query(queue_url, "DELETE FROM spider_job WHERE status = 'pending'")
    assert [wanted(queue_url, slots) for slots in (1, 4)] == [0, 0]  # only jobs not yet due: back to zero


def test_the_answer_is_bounded_by_max_nodes_and_a_count_below_one_is_refused(queue_url):
    insert_jobs(queue_url, [("p", "free", "pending", "-1 minute", 5000)])
    # Beyond 1,000 nodes (0008's bound): up to max_nodes, 10,000 unless given.
    assert [wanted(queue_url, slots) for slots in (1, 2, 3)] == [5000, 2500, 1667]
    assert [query(queue_url, WANTED_UP_TO, (1, maximum))[0][0] for maximum in (2000, 5000, 10000)] == [
        2000, 5000, 5000]
    assert query(queue_url, WANTED_BY_TAGS_UP_TO, (1, ["browser"], 2000)) == [(2000,)]
    assert query(queue_url, WANTED_BY_TAGS, (1, ["browser"])) == [(5000,)]
    with pytest.raises(psycopg2.errors.InvalidParameterValue, match="slots_per_node must be at least 1, not 0"):
        wanted(queue_url, 0)
    for statement, arguments in ((WANTED_UP_TO, (1, 0)), (WANTED_BY_TAGS_UP_TO, (1, ["browser"], -5))):
        with pytest.raises(psycopg2.errors.InvalidParameterValue, match="max_nodes must be at least 1, not -?[05]"):
            query(queue_url, statement, arguments)
    assert wanted(queue_url, None) is None
    assert query(queue_url, WANTED_UP_TO, (1, None)) == [(None,)]
    assert query(queue_url, WANTED_BY_TAGS_UP_TO, (None, ["browser"], 10)) == [(None,)]
    assert query(queue_url, WANTED_BY_TAGS, (4, None)) == [(1250,)]  # NULL tags: no filter, the one-argument form
    assert OverviewStore.for_url(queue_url).wanted_nodes(3, 1000) == 1000
    assert OverviewStore.for_url(queue_url).wanted_nodes(3, 10000) == 1667


def test_a_scaler_role_with_execute_only_gets_the_number_but_no_job_and_others_get_nothing(
    queue_url, admin_connection
):
    insert_jobs(queue_url, [("p", "free", "pending", "-1 minute", 9)])
    suffix = uuid.uuid4().hex[:8]  # roles belong to the whole server
    with admin_connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE scaler_{suffix} LOGIN PASSWORD 'scaler-pw'")
        cursor.execute(f"CREATE ROLE stranger_{suffix} LOGIN PASSWORD 'stranger-pw'")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION scrapyd_pgqueue_wanted_nodes(integer, integer) TO scaler_{suffix}")
    scaler = make_url(queue_url).set(username=f"scaler_{suffix}", password="scaler-pw").render_as_string(False)
    stranger = make_url(queue_url).set(username=f"stranger_{suffix}", password="stranger-pw").render_as_string(False)

    assert wanted(scaler, 4) == 3
    with contextlib.closing(connect(scaler)) as connection, connection.cursor() as cursor:
        # A temporary table of the caller's never stands in for the queue's (the function runs as its owner).
        cursor.execute("CREATE TEMP TABLE spider_job AS SELECT * FROM generate_series(1, 100) AS id, "
                       "LATERAL (SELECT 'p' AS project, 'free' AS spider, 'pending' AS status, now() AS run_at) AS j")
        cursor.execute(WANTED, (4,))
        assert cursor.fetchone() == (3,)
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(scaler, "SELECT count(*) FROM spider_job")
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):  # not PUBLIC's
        wanted(stranger, 4)
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):  # the form granted only, though it calls this one
        query(scaler, WANTED_BY_TAGS, (4, ["browser"]))
    nodes = node_role(admin_connection, queue_url, f"node_{suffix}")  # `scrapyd-pgqueue grant`
    with contextlib.closing(connect(nodes)) as connection, connection.cursor() as cursor:
        cursor.execute(WANTED, (4,))
        assert cursor.fetchone() == (3,)


# Beside JOBS (no tag required): (project, spider, status, run_at, how many, pool).
POOL_JOBS = [
    ("p", "free", "pending", "-1 minute", 3, "browser"),
    ("p", "free", "ongoing", "-1 minute", 2, "browser"),
    ("q", "later", "delayed", "-1 second", 1, "browser"),  # due, not promoted yet
    ("q", "later", "delayed", "+1 hour", 2, "browser"),  # not yet: no work
    ("p", "free", "pending", "-1 minute", 4, "browser,eu"),
    ("p", "limited", "pending", "-1 minute", 5, "browser"),  # the limit is the cluster's: still 2 at once
]


def test_the_two_argument_form_counts_the_work_a_pool_may_run(queue_url):
    insert_jobs(queue_url, JOBS)
    for project, spider, status, run_at, count, pool in POOL_JOBS:
        insert_jobs(queue_url, [(project, spider, status, run_at, count)])
        query(queue_url, "UPDATE spider_job SET pool = %s WHERE id > (SELECT max(id) FROM spider_job) - %s",
              (pool, count))
    for project, spider, max_running in LIMITS:
        query(queue_url, "INSERT INTO spider_limit (project, spider, max_running) VALUES (%s, %s, %s)",
              (project, spider, max_running))
    # Periodic jobs due to fire: one without tags, one with its own, one whose spider is routed to browser.
    query(queue_url, "INSERT INTO spider_route (project, spider, pool) VALUES ('p', 'routed', 'browser')")
    for name, spider, pool in (("plain", "free", None), ("own", "free", "browser"), ("routed", "routed", None)):
        query(queue_url, "INSERT INTO periodic_job (name, project, spider, every_seconds, pool, next_fire_time) "
                         "VALUES (%s, 'p', %s, 60, %s, now() - interval '1 second')", (name, spider, pool))

    def by_tags(tags, slots=1):
        return query(queue_url, WANTED_BY_TAGS, (slots, tags))[0][0]

    plain = WORK  # JOBS' work and the plain periodic job
    browser = plain + 3 + 2 + 1 + 2  # its pending, running and due jobs, its two periodic jobs (the limit is full)
    assert {tags: by_tags(list(tags)) for tags in ((), ("eu",), ("browser",), ("browser", "eu"))} == {
        (): plain, ("eu",): plain, ("browser",): browser, ("browser", "eu"): browser + 4}
    assert by_tags(["browser"], 4) == -(-browser // 4)
    assert wanted(queue_url, 1) == browser + 4  # the one-argument form: all the work, as before

    # What a pool's node claims is what its count says it may run: a browser node takes every pending and due job
    # of pools '' and browser (up to the limits), and none requiring eu.
    claimed = JobStore.for_url(queue_url).claim_next_jobs(None, 100, node="n", worker="w", tags=["browser"]).jobs
    pools = dict(query(queue_url, "SELECT job, pool FROM spider_job WHERE job = ANY(%s)", ([c.job for c in claimed],)))
    assert sorted(set(pools.values())) == ["", "browser"]
    assert len(claimed) == (5 + 4 + 1 + 1) + (3 + 1)  # the free, due, limited and rare jobs; browser's own
    assert by_tags(["browser"]) == browser  # the same work, running now
