"""The nodes' VACUUM of the queue table and the other tables they churn (store/maintenance.py), on a real Postgres
and real nodes."""

import contextlib
import datetime
import time
import uuid

import pytest

from helpers import connect, jobs, node_role, query, runs, schedule, wait_for
from scrapyd_pgqueue.store import JobStore, QueueMaintenance
from scrapyd_pgqueue.store.maintenance import CHURNED_TABLES, MIN_DEAD_ROWS

STATS = "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relname = 'spider_job'"
# Each table's whole size on disk: heap, indexes and TOAST.
TABLE_SIZES = "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables WHERE relname = ANY(%s)"
TABLE_VACUUMS = ("SELECT relname, n_live_tup, n_dead_tup, vacuum_count, autovacuum_count FROM pg_stat_user_tables "
                 "WHERE relname = ANY(%s)")
ROUND = 300  # jobs a round: the dead rows of a round or two reach a vacuum's threshold (MIN_DEAD_BYTES of job_log)


@pytest.fixture
def database_url(database_url, admin_connection):
    """The test's database, its queue table left to these vacuums alone (autovacuum could run one meanwhile)."""
    JobStore.for_url(database_url)  # the schema
    with admin_connection.cursor() as cursor:
        cursor.execute("ALTER TABLE spider_job SET (autovacuum_enabled = false)")
    return database_url


def churn(store, jobs):
    """Jobs inserted, claimed, finished and pruned, as nodes do: three dead rows each."""
    store.enqueue_many("p", [({"name": "s", "_job": uuid.uuid4().hex}, 0.0) for _ in range(jobs)])
    now = datetime.datetime.now()
    for job in store.claim_next_jobs(["p"], jobs, node="n", worker="w").jobs:
        store.finish_job(project="p", spider="s", job=job.job, start_time=now, end_time=now, claimed=job,
                         worker="w")
    store.prune_terminated(0)


def dead_rows_counted(url):
    # The statistics the decision reads arrive from each backend within a second or so.
    wait_for(lambda: query(url, STATS)[0][0] >= MIN_DEAD_ROWS, 10, "the dead rows in the statistics")


def test_a_queue_with_enough_dead_rows_is_vacuumed_once_per_interval(database_url):
    store = JobStore.for_url(database_url)
    maintenance = QueueMaintenance(store.engine, interval=2.0)
    churn(store, MIN_DEAD_ROWS)
    dead_rows_counted(database_url)
    [(_, vacuums_before)] = query(database_url, STATS)

    assert maintenance.vacuum_when_due()
    assert not maintenance.vacuum_when_due()  # within the interval: not even a look at the statistics
    [(dead, vacuums)] = query(database_url, STATS)
    assert vacuums == vacuums_before + 1 and dead < MIN_DEAD_ROWS

    time.sleep(2.1)  # a new interval, but the table has nothing to clear
    assert not maintenance.vacuum_when_due()
    assert query(database_url, STATS)[0][1] == vacuums


def test_one_node_takes_the_turn_for_the_whole_cluster_and_a_running_turn_is_waited_for(database_url):
    store = JobStore.for_url(database_url)
    churn(store, MIN_DEAD_ROWS)
    dead_rows_counted(database_url)
    assert QueueMaintenance(store.engine, interval=60.0).vacuum_when_due()  # one node
    churn(store, MIN_DEAD_ROWS)
    dead_rows_counted(database_url)
    assert not QueueMaintenance(store.engine, interval=60.0).vacuum_when_due()  # another, within the minute
    # A turn that started and has not ended (a long index rebuild) is left alone, even past the interval.
    query(database_url, "UPDATE spider_job_maintenance SET started = now(), ended = now() - interval '1 day'")
    assert not QueueMaintenance(store.engine, interval=1.0).vacuum_when_due()
    # Unless it started more than an hour ago: its node died.
    query(database_url, "UPDATE spider_job_maintenance SET started = now() - interval '2 hours'")
    assert QueueMaintenance(store.engine, interval=1.0).vacuum_when_due()


def test_a_role_that_does_not_own_the_table_leaves_it_to_autovacuum(database_url, admin_connection):
    role = f"guest_{uuid.uuid4().hex[:8]}"
    guest = JobStore.for_url(node_role(admin_connection, database_url, role))
    try:
        churn(guest, MIN_DEAD_ROWS)
        dead_rows_counted(database_url)
        assert not QueueMaintenance(guest.engine, interval=1.0).vacuum_when_due()  # and no error
        assert query(database_url, STATS)[0][0] >= MIN_DEAD_ROWS
    finally:
        guest.engine.dispose()
        with admin_connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


INDEXES = """
    SELECT c.relname, c.relfilenode, i.indisvalid FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
    WHERE i.indrelid = 'spider_job'::regclass ORDER BY c.relname
"""


def test_indexes_past_their_share_of_the_table_are_rebuilt_and_leftovers_of_a_broken_rebuild_dropped(
    database_url, admin_connection
):
    store = JobStore.for_url(database_url)
    store.enqueue_many("p", [({"name": "s", "_job": f"j{i}"}, float(i % 7)) for i in range(2000)])
    with admin_connection.cursor() as cursor:
        cursor.execute("ANALYZE spider_job")  # the statistics the estimate of a packed index reads
        # An interrupted REINDEX CONCURRENTLY leaves an invalid _ccnew index behind.
        with pytest.raises(Exception, match="could not create unique index"):
            cursor.execute("CREATE UNIQUE INDEX CONCURRENTLY spider_job_job_idx_ccnew ON spider_job (spider)")
    before = {name: (node, valid) for name, node, valid in query(database_url, INDEXES)}
    assert before["spider_job_job_idx_ccnew"][1] is False

    # Every index over 1% of its entries packed: all of them (the node's factor is 2.5: see store/maintenance.py).
    rebuilt = QueueMaintenance(store.engine, interval=5.0, rebuild_above=0.01, min_index_bytes=0)
    assert rebuilt.rebuild_thinned_indexes() == len(before)

    after = {name: (node, valid) for name, node, valid in query(database_url, INDEXES)}
    assert "spider_job_job_idx_ccnew" not in after
    assert set(after) == set(before) - {"spider_job_job_idx_ccnew"}  # same names, each a new file, all valid
    assert all(valid and node != before[name][0] for name, (node, valid) in after.items())
    [claimed] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
    assert claimed.job == "j6"  # the rebuilt indexes serve the claim, in priority order
    # At the node's factor, a fresh queue has nothing to rebuild, however small its indexes.
    assert QueueMaintenance(store.engine, interval=5.0, min_index_bytes=0).rebuild_thinned_indexes() == 0


def test_the_other_tables_the_nodes_churn_are_vacuumed_in_the_same_turn_when_due(database_url, admin_connection):
    with admin_connection.cursor() as cursor:
        cursor.execute("ALTER TABLE scrapyd_node SET (autovacuum_enabled = false)")
    # Every node start registers a row and the stopped ones are forgotten: 1,500 restarts leave 1,500 dead rows.
    with contextlib.closing(connect(database_url)) as nodes, nodes.cursor() as cursor:
        for start in range(1500):  # a transaction each, as each start is
            cursor.execute("INSERT INTO scrapyd_node (id, name, stopped_time) VALUES (%s, 'n', now())", (str(start),))
        cursor.execute("DELETE FROM scrapyd_node WHERE stopped_time IS NOT NULL")
    node_stats = "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relname = 'scrapyd_node'"
    wait_for(lambda: query(database_url, node_stats)[0][0] >= MIN_DEAD_ROWS, 10, "the dead rows in the statistics")
    [(_, queue_vacuums)] = query(database_url, STATS)

    assert QueueMaintenance(JobStore.for_url(database_url).engine, interval=2.0).vacuum_when_due()
    [(dead, vacuums)] = query(database_url, node_stats)
    assert vacuums == 1 and dead < MIN_DEAD_ROWS
    assert query(database_url, STATS)[0][1] == queue_vacuums  # the queue had nothing to clear: left alone


def test_real_nodes_keep_the_tables_they_churn_flat_with_autovacuum_off(database, start_cluster, tmp_path):
    url, admin_url = database
    JobStore.for_url(url)  # the schema, so that autovacuum can be turned off before the nodes start
    with contextlib.closing(connect(admin_url)) as admin, admin.cursor() as cursor:
        for table in CHURNED_TABLES:  # the server's autovacuum stays on for the rest; these are the nodes' alone
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    nodes = start_cluster(url, 2, max_proc="6", vacuum_interval="1", finished_to_keep="40").nodes

    def run_round(first: int) -> dict:
        names = [f"churn{number:04}" for number in range(first, first + ROUND)]
        for number, name in enumerate(names):
            schedule(nodes[number % 2], name, seconds="0")
        wait_for(lambda: {state[0] for state in jobs(admin_url, *names).values()} == {"terminated"}, 240,
                 "the round's jobs to finish")
        return {table: size for table, size in query(url, TABLE_SIZES, (list(CHURNED_TABLES),))}

    run_round(0)  # the tables reach the size the kept jobs, the nodes and the vacuums' pace give them
    settled = run_round(ROUND)
    final = run_round(2 * ROUND)
    print(f"bytes after {2 * ROUND} jobs: {settled}; after {3 * ROUND}: {final}")
    print(f"(table, live, dead, vacuums, autovacuums): {query(url, TABLE_VACUUMS, (list(CHURNED_TABLES),))}")
    assert len(runs(tmp_path)) == 3 * ROUND
    for table in CHURNED_TABLES:  # a table left to itself grows by a round's dead rows each round
        assert final[table] <= settled[table] * 1.25 + 8 * 8192, (table, settled[table], final[table])
