"""Node pools: the tags a job requires (its pool), routes per spider, the claim by pool, wanted nodes per pool.

Revision ID: 0014
Revises: 0013
"""

import runpy
from pathlib import Path

from alembic import op
from sqlalchemy import text

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_VERSIONS = Path(__file__).parent
OLD_CLAIM_FUNCTION = runpy.run_path(str(_VERSIONS / "0009_claim_hot_path.py"))["CLAIM_FUNCTION"]


def _between(start: str, end: str) -> str:
    return OLD_CLAIM_FUNCTION[OLD_CLAIM_FUNCTION.index(start):OLD_CLAIM_FUNCTION.index(end)]


# 0009's steps this claim keeps: the one-project statement (now of pool '' only: the jobs a node without tags may
# run, read by an equality on the pending indexes' first column), and the promotion of due delayed jobs, unchanged.
HOT_PATH = _between("        IF v_hot THEN\n", "        FOR v_round IN 1..2 LOOP\n").replace(
    "                  WHERE n.status = 'pending' AND n.project >= p_projects[1] AND n.project <= p_projects[1]\n",
    "                  WHERE n.status = 'pending' AND n.pool = ''\n"
    "                    AND n.project >= p_projects[1] AND n.project <= p_projects[1]\n",
).replace("ORDER BY n.project, n.priority DESC, n.id LIMIT p_limit",
          "ORDER BY n.pool, n.project, n.priority DESC, n.id LIMIT p_limit")
DUE_LOOP = _between("        FOR v_round IN 1..2 LOOP\n", "        IF p_limit > v_claimed AND v_limited THEN")
# And 0009's claim of limited spiders, but for the jobs this node may run: the other spiders' next jobs are this
# claim's (%2$s, per pool), and a limited spider's passes over the pools this node may not claim from.
_UNLIMITED_JOBS = _between("                    SELECT id, priority FROM spider_job AS j\n",
                           "                ), limited_jobs AS (")
LIMITED_CLAIM = _between("                WITH limits AS MATERIALIZED (", "            $claim$, v_projects)").replace(
    _UNLIMITED_JOBS, "                    %2$s\n").replace(
    "                        WHERE status = 'pending' AND project = room.project AND spider = room.spider\n",
    "                        WHERE status = 'pending' AND project = room.project AND spider = room.spider\n"
    "                          AND pool = ANY($5)\n")
_WANTED_NODES = runpy.run_path(str(_VERSIONS / "0008_wanted_nodes.py"))["WANTED_NODES_FUNCTION"]
_TREES = runpy.run_path(str(_VERSIONS / "0012_webhooks.py"))
OLD_COUNT_TREE_JOBS = _TREES["COUNT_TREE_JOBS_WITH_EVENTS"]
# 0012's tree count, but a tree's completion job goes where its spider's route sends it (as any job scheduled
# without _tags would), else anywhere.
_COMPLETION_INSERT = ("INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)",
                      "'pending', now(), now());")
assert all(part in OLD_COUNT_TREE_JOBS for part in _COMPLETION_INSERT)
COUNT_TREE_JOBS_ROUTED = OLD_COUNT_TREE_JOBS.replace(
    _COMPLETION_INSERT[0], _COMPLETION_INSERT[0].replace("created_time)", "created_time, pool)")).replace(
    _COMPLETION_INSERT[1],
    "'pending', now(), now(), coalesce((SELECT r.pool FROM spider_route AS r\n"
    "                            WHERE r.project = tree.project AND r.spider = tree.on_complete->>'spider'), ''));")
OLD_CLAIM_SIGNATURE = "claim_spider_jobs(text[], integer, text, text, text)"
CLAIM_SIGNATURE = "claim_spider_jobs(text[], integer, text, text, text, text[])"
WANTED_SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer, text[])"

# The distinct pools of pending jobs, by a skip scan of spider_job_pending_idx (one index probe per pool, whatever
# the backlog): the claim of a tagged node, the listings in claim order and the unroutable counts read it.
PENDING_POOLS_FUNCTION = """
    CREATE FUNCTION spider_job_pending_pools() RETURNS SETOF text
    LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
        WITH RECURSIVE pools(pool) AS (
            (SELECT j.pool FROM spider_job AS j WHERE j.status = 'pending' ORDER BY j.pool LIMIT 1)
            UNION ALL
            SELECT (SELECT j.pool FROM spider_job AS j WHERE j.status = 'pending' AND j.pool > pools.pool
                    ORDER BY j.pool LIMIT 1)
            FROM pools WHERE pools.pool IS NOT NULL
        )
        SELECT pools.pool FROM pools WHERE pools.pool IS NOT NULL
    $$
"""

# store/schema.sql holds it with the reason for each step. What changed from 0009's: p_tags, the node's tags. A node
# without tags claims the jobs that require none (pool ''): its one-project statement reads the head of that pool in
# spider_job_pending_project_idx, as before. A tagged node claims from each pending pool whose tags it all has, the
# head of each read in its own index range, merged by priority.
CLAIM_FUNCTION = """
    CREATE FUNCTION claim_spider_jobs(
        p_projects text[], p_limit integer, p_node text, p_worker text, p_channel text,
        p_tags text[] DEFAULT NULL
    ) RETURNS TABLE (
        id bigint, project text, job text, attempts integer, message jsonb, priority double precision,
        waited double precision, promoted bigint, next_due_in double precision
    ) LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET lock_timeout = '15s'
    SET search_path FROM CURRENT AS $$
    #variable_conflict use_column
    DECLARE
        v_tagged boolean;
        v_hot boolean := p_limit > 0 AND coalesce(cardinality(p_projects) = 1, false)
                         AND coalesce(cardinality(p_tags), 0) = 0;
        v_claimed bigint := 0;
        v_round integer;
        v_promoted bigint := 0;
        v_next_due timestamptz;
        v_limited boolean;
        v_pools text[];
        v_projects text := CASE WHEN p_projects IS NULL THEN 'true'
                                WHEN cardinality(p_projects) = 1 THEN 'project = $1[1]'
                                ELSE 'project = ANY($1)' END;
        v_unlimited text;
        v_next text;
    BEGIN
{hot_path}{due_loop}        IF p_limit <= v_claimed OR NOT (v_limited OR v_promoted > 0 OR NOT v_hot) THEN
            NULL;
        ELSE
            v_tagged := coalesce(cardinality(p_tags), 0) > 0;
            IF v_tagged THEN
                v_pools := ARRAY(SELECT pending.pool FROM spider_job_pending_pools() AS pending(pool)
                                 WHERE string_to_array(pending.pool, ',') <@ p_tags);
            ELSE
                v_pools := ARRAY[''];
            END IF;
            v_unlimited := CASE WHEN v_limited THEN 'AND NOT EXISTS (SELECT FROM spider_limit AS l '
                                                    'WHERE l.project = j.project AND l.spider = j.spider)'
                                ELSE '' END;
            v_next := CASE WHEN NOT v_tagged THEN format($next$
                SELECT id, priority FROM spider_job AS j WHERE status = 'pending' AND pool = '' AND %1$s %2$s
                ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED
                $next$, v_projects, v_unlimited)
            ELSE format($next$
                SELECT c.id, c.priority FROM spider_job AS c
                WHERE c.status = 'pending' AND c.id = ANY(ARRAY(
                    SELECT head.id FROM unnest($5) AS runnable(pool), LATERAL (
                        SELECT id FROM spider_job AS j
                        WHERE status = 'pending' AND j.pool = runnable.pool AND %1$s %2$s
                        ORDER BY priority DESC, id LIMIT $2 + 32
                    ) AS head))
                ORDER BY c.priority DESC, c.id LIMIT $2 FOR UPDATE OF c SKIP LOCKED
                $next$, v_projects, v_unlimited) END;
            IF v_limited THEN
                RETURN QUERY EXECUTE format($claim$
{limited_claim}                $claim$, v_projects, v_next)
                USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker, v_pools;
            ELSE
                RETURN QUERY EXECUTE format($claim$
                    UPDATE spider_job AS j
                    SET status = 'ongoing', node = $3, worker = $4, start_time = now(), attempts = j.attempts + 1
                    WHERE j.id = ANY(ARRAY(SELECT next.id FROM (%1$s) AS next))
                    RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                              CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                              NULL::double precision
                $claim$, v_next)
                USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker, v_pools;
            END IF;
        END IF;

        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::jsonb, NULL::double precision,
               NULL::double precision, v_promoted, CAST(extract(epoch FROM v_next_due - now()) AS double precision);
    END
    $$
""".replace("{hot_path}", HOT_PATH).replace("{due_loop}", DUE_LOOP).replace("{limited_claim}", LIMITED_CLAIM)

# The one-argument form's work, of the jobs a node with `tags` may run only (each job's pool a subset of them; a
# periodic job's fired jobs go where it, or else its spider's route, sends them).
WANTED_NODES_BY_TAGS_FUNCTION = (
    _WANTED_NODES.replace("scrapyd_pgqueue_wanted_nodes(slots_per_node integer)",
                          "scrapyd_pgqueue_wanted_nodes(slots_per_node integer, tags text[])")
    .replace("WHERE j.status = 'ongoing'\n", "WHERE j.status = 'ongoing' AND string_to_array(j.pool, ',') <@ tags\n")
    .replace("WHERE j.status = 'pending'\n", "WHERE j.status = 'pending' AND string_to_array(j.pool, ',') <@ tags\n")
    .replace("WHERE j.status = 'delayed' AND j.run_at <= now()\n",
             "WHERE j.status = 'delayed' AND j.run_at <= now() AND string_to_array(j.pool, ',') <@ tags\n")
    .replace("AND j.project = l.project AND j.spider = l.spider",
             "AND j.project = l.project AND j.spider = l.spider AND string_to_array(j.pool, ',') <@ tags")
    .replace("WHERE NOT p.paused AND p.next_fire_time <= now()",
             "WHERE NOT p.paused AND p.next_fire_time <= now()\n"
             "                  AND string_to_array(coalesce(p.pool, (SELECT r.pool FROM spider_route AS r\n"
             "                      WHERE r.project = p.project AND r.spider = p.spider), ''), ',') <@ tags")
)


def _with_pinned_search_path(*statements: str) -> None:
    """Run CREATE FUNCTION ... SET search_path FROM CURRENT with the path the functions keep: the schema being
    migrated, then pg_temp (last: a caller's temporary table is never read instead of the queue's)."""
    connection = op.get_bind()
    search_path = connection.execute(text("SHOW search_path")).scalar()
    connection.execute(text("SELECT set_config('search_path', quote_ident(current_schema()) || ', pg_temp', true)"))
    for statement in statements:
        op.execute(statement)
    connection.execute(text("SELECT set_config('search_path', :path, true)"), {"path": search_path})


def upgrade() -> None:
    # A constant default: adding the column rewrites no row of a populated table (every job so far requires nothing).
    op.execute("ALTER TABLE spider_job ADD COLUMN pool text NOT NULL DEFAULT ''")
    op.execute("ALTER TABLE periodic_job ADD COLUMN pool text")  # NULL: its spider's route at each firing
    op.execute("ALTER TABLE scrapyd_node ADD COLUMN tags text[] NOT NULL DEFAULT '{}'")
    op.execute("""
        CREATE TABLE spider_route (
            project text NOT NULL,
            spider text NOT NULL,
            pool text NOT NULL,
            created_time timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (project, spider)
        )
    """)
    # The pool leads the claim's indexes: each pool's head is an index range of its own.
    op.execute("DROP INDEX spider_job_pending_idx")
    op.execute("CREATE INDEX spider_job_pending_idx ON spider_job (pool, priority DESC, id) WHERE status = 'pending'")
    op.execute("DROP INDEX spider_job_pending_project_idx")
    op.execute("CREATE INDEX spider_job_pending_project_idx ON spider_job (pool, project, priority DESC, id) "
               "WHERE status = 'pending'")
    op.execute(f"DROP FUNCTION {OLD_CLAIM_SIGNATURE}")
    _with_pinned_search_path(PENDING_POOLS_FUNCTION, CLAIM_FUNCTION, WANTED_NODES_BY_TAGS_FUNCTION)
    op.execute(f"REVOKE EXECUTE ON FUNCTION {WANTED_SIGNATURE} FROM PUBLIC")
    op.execute(COUNT_TREE_JOBS_ROUTED)  # CREATE OR REPLACE drops its SET clauses: pinned again, as 0012 does
    _TREES["_pin_search_path"]()


def downgrade() -> None:
    # Jobs that required tags run anywhere again, as every job did before.
    op.execute(OLD_COUNT_TREE_JOBS)
    _TREES["_pin_search_path"]()
    op.execute(f"DROP FUNCTION {WANTED_SIGNATURE}")
    op.execute(f"DROP FUNCTION {CLAIM_SIGNATURE}")
    op.execute("DROP FUNCTION spider_job_pending_pools()")
    _with_pinned_search_path(OLD_CLAIM_FUNCTION.replace(
        ") LANGUAGE plpgsql VOLATILE SET plan_cache_mode", ") LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT "
        "SET plan_cache_mode", 1))
    op.execute("DROP INDEX spider_job_pending_project_idx")
    op.execute("CREATE INDEX spider_job_pending_project_idx ON spider_job (project, priority DESC, id) "
               "WHERE status = 'pending'")
    op.execute("DROP INDEX spider_job_pending_idx")
    op.execute("CREATE INDEX spider_job_pending_idx ON spider_job (priority DESC, id) WHERE status = 'pending'")
    op.execute("DROP TABLE spider_route")
    op.execute("ALTER TABLE scrapyd_node DROP COLUMN tags")
    op.execute("ALTER TABLE periodic_job DROP COLUMN pool")
    op.execute("ALTER TABLE spider_job DROP COLUMN pool")
