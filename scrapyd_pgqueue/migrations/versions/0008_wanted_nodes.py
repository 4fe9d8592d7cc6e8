"""How many nodes the queue wants: scrapyd_pgqueue_wanted_nodes(slots_per_node), the number an autoscaler asks.

Revision ID: 0008
Revises: 0007
"""

from alembic import op
from sqlalchemy import text

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The work nodes could run now, divided by the slots of one node, rounded up. store/schema.sql holds it with the
# reason for each step. SECURITY DEFINER with the search path of its creation: a scaler's role needs only EXECUTE
# on it (no right to read a job), and it only reads. Its search path is the queue's schema, then pg_temp (last: a
# caller's temporary table named spider_job is never read instead). EXECUTE is not PUBLIC's: the node role gets it
# from `scrapyd-pgqueue grant`, a scaler's role from its own GRANT.
# JIT off: the estimates of its capped counts would have Postgres compile them (0.2-0.4 s) for reads of milliseconds.
WANTED_NODES_FUNCTION = """
    CREATE FUNCTION scrapyd_pgqueue_wanted_nodes(slots_per_node integer) RETURNS integer
    LANGUAGE plpgsql STABLE STRICT SECURITY DEFINER SET search_path FROM CURRENT SET jit = off AS $$
    DECLARE
        v_cap bigint := 1000 * greatest(slots_per_node, 1);
        v_work bigint;
    BEGIN
        IF slots_per_node < 1 THEN
            RAISE EXCEPTION 'slots_per_node must be at least 1, not %', slots_per_node
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT
            (SELECT count(*) FROM spider_job AS j
             WHERE j.status = 'ongoing'
               AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider))
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'pending'
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'delayed' AND j.run_at <= now()
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT coalesce(sum(greatest(limited.running, least(l.max_running, limited.running + limited.waiting))), 0)
             FROM spider_limit AS l, LATERAL (
                SELECT (SELECT count(*) FROM spider_job AS j
                        WHERE j.status = 'ongoing' AND j.project = l.project AND j.spider = l.spider) AS running,
                       (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'pending' AND j.project = l.project AND j.spider = l.spider
                            LIMIT l.max_running) AS capped)
                     + (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'delayed' AND j.run_at <= now()
                              AND j.project = l.project AND j.spider = l.spider
                            LIMIT l.max_running) AS capped) AS waiting
             ) AS limited)
          + (SELECT count(*) FROM (
                SELECT FROM periodic_job AS p WHERE NOT p.paused AND p.next_fire_time <= now() LIMIT v_cap) AS capped)
        INTO v_work;
        RETURN least(ceil(v_work::numeric / slots_per_node), 1000)::integer;
    END
    $$
"""
SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer)"


def upgrade() -> None:
    connection = op.get_bind()
    search_path = connection.execute(text("SHOW search_path")).scalar()
    connection.execute(text("SELECT set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true)"))
    op.execute(WANTED_NODES_FUNCTION)  # SET search_path FROM CURRENT: the one just set
    connection.execute(text("SELECT set_config('search_path', :path, true)"), {"path": search_path})
    op.execute(f"REVOKE EXECUTE ON FUNCTION {SIGNATURE} FROM PUBLIC")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
