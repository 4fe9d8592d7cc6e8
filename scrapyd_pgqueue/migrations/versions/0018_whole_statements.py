"""Statements that read whole: an ended job's webhook events are written by a trigger, and the pieces of logic that
statements shared as text become functions.

Revision ID: 0018
Revises: 0017
"""

import runpy
from pathlib import Path

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_with_pinned_search_path = runpy.run_path(str(Path(__file__).with_name("0014_node_pools.py")))[
    "_with_pinned_search_path"]

# A job going back to waiting (a retry, a recovery, a hand-back, a requeue) keeps its unique key unless a new waiting
# job of its project took it meanwhile (a running job does not hold its key): one probe of
# spider_job_waiting_unique_key. STABLE: it reads with its caller's snapshot, as the subquery it replaces did.
KEY_UNLESS_TAKEN = """
    CREATE FUNCTION spider_job_key_unless_taken(p_project text, p_unique_key text) RETURNS text
    LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
        SELECT CASE WHEN EXISTS (
            SELECT 1 FROM spider_job AS waiting
            WHERE waiting.project = p_project AND waiting.unique_key = p_unique_key
              AND waiting.status IN ('delayed', 'pending')
        ) THEN NULL ELSE p_unique_key END
    $$
"""

# Whether a node may need waking: one has free slots and found nothing to claim (0016; NULL: not said yet). New
# pending jobs send a NOTIFY only then: every notifying transaction commits one at a time (Postgres's lock on its
# notification queue) and wakes every listening backend, so a job sent to a cluster whose nodes are all busy sends
# none (they claim again when a slot frees). One probe of scrapyd_node_wanting_idx.
NODES_WANT_WORK = """
    CREATE FUNCTION scrapyd_nodes_want_work() RETURNS boolean
    LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
        SELECT EXISTS (SELECT 1 FROM scrapyd_node WHERE wants_work IS NOT FALSE AND stopped_time IS NULL)
    $$
"""

# The pending pools that no live node can run (no live node has all of their tags), each with its pending jobs
# counted up to p_cap: the pools come from a skip scan of spider_job_pending_idx (spider_job_pending_pools), each
# count from that pool's range of the same index. Live nodes: not stopped, heartbeat within p_lease_seconds. What
# unroutable.json, /metrics and the cluster's counts show.
UNROUTABLE_POOLS = """
    CREATE FUNCTION spider_job_unroutable_pools(p_lease_seconds double precision, p_cap bigint)
    RETURNS TABLE(pool text, jobs bigint)
    LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
        SELECT pending.pool,
               (SELECT count(*) FROM (SELECT 1 FROM spider_job AS j
                                      WHERE j.status = 'pending' AND j.pool = pending.pool LIMIT p_cap) AS capped)
        FROM spider_job_pending_pools() AS pending(pool)
        WHERE NOT EXISTS (
            SELECT FROM scrapyd_node AS n
            WHERE n.stopped_time IS NULL AND n.heartbeat_time > now() - make_interval(secs => p_lease_seconds)
              AND string_to_array(pending.pool, ',') <@ n.tags
        )
    $$
"""

# Of a job's stats, the keys its summary reads (crawl_process/job_stats.py's SUMMARY_KEYS), not the whole dict:
# a list of many jobs stays small. NULL without stats.
STATS_SUMMARY = """
    CREATE FUNCTION spider_job_stats_summary(p_stats jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE SET search_path FROM CURRENT AS $$
        SELECT CASE WHEN p_stats IS NOT NULL THEN jsonb_build_object(
            'item_scraped_count', p_stats->'item_scraped_count',
            'downloader/request_count', p_stats->'downloader/request_count',
            'response_received_count', p_stats->'response_received_count',
            'log_count/ERROR', p_stats->'log_count/ERROR', 'log_count/CRITICAL', p_stats->'log_count/CRITICAL',
            'finish_reason', p_stats->'finish_reason'
        ) END
    $$
"""

# The events of a job that ended (terminated with an outcome), one per webhook that wants it: its outcome by name,
# or 'ended'; written in the transaction that ends the job (the outbox), whichever statement ends it. Without hooks
# the insert reads an empty table.
ENDED_EVENTS = """
    CREATE FUNCTION spider_job_ended_events() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    BEGIN
        INSERT INTO webhook_event (webhook_id, event, fields)
        SELECT w.id, CASE WHEN NEW.outcome = ANY(w.events) THEN NEW.outcome ELSE 'ended' END, jsonb_build_object(
                   'project', NEW.project, 'spider', NEW.spider, 'job', NEW.job, 'node', NEW.node,
                   'outcome', NEW.outcome, 'reason', NEW.reason, 'exit_code', NEW.exit_code,
                   'start_time', NEW.start_time, 'end_time', NEW.end_time, 'stats', NEW.stats)
        FROM webhook AS w
        WHERE w.events && ARRAY[NEW.outcome, 'ended'] AND (w.project IS NULL OR w.project = NEW.project);
        RETURN NULL;
    END $$
"""


# The WHEN clauses keep every other change at no cost (no function call). An update that sets the status of a job
# and leaves it terminated with an outcome ended it (a finish, a cancel, a recovery, a hand-back; a late finish of a
# job recovery gave up as lost ends it again); an insert of a terminated job records one that ended.
def upgrade() -> None:
    _with_pinned_search_path(KEY_UNLESS_TAKEN, NODES_WANT_WORK, UNROUTABLE_POOLS, STATS_SUMMARY, ENDED_EVENTS)
    op.execute("CREATE TRIGGER spider_job_ended AFTER UPDATE OF status ON spider_job FOR EACH ROW "
               "WHEN (NEW.status = 'terminated' AND NEW.outcome IS NOT NULL) "
               "EXECUTE FUNCTION spider_job_ended_events()")
    op.execute("CREATE TRIGGER spider_job_recorded AFTER INSERT ON spider_job FOR EACH ROW "
               "WHEN (NEW.status = 'terminated' AND NEW.outcome IS NOT NULL) "
               "EXECUTE FUNCTION spider_job_ended_events()")


def downgrade() -> None:
    op.execute("DROP TRIGGER spider_job_recorded ON spider_job")
    op.execute("DROP TRIGGER spider_job_ended ON spider_job")
    op.execute("DROP FUNCTION spider_job_ended_events()")
    op.execute("DROP FUNCTION spider_job_stats_summary(jsonb)")
    op.execute("DROP FUNCTION spider_job_unroutable_pools(double precision, bigint)")
    op.execute("DROP FUNCTION scrapyd_nodes_want_work()")
    op.execute("DROP FUNCTION spider_job_key_unless_taken(text, text)")
