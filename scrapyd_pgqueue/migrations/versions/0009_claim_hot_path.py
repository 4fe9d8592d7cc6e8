"""A cheaper claim: one statement, planned once per connection, when nothing is due and no limit applies.

Revision ID: 0009
Revises: 0008
"""

import runpy
from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The earlier migrations' functions, for the downgrade (a migration never changes).
_VERSIONS = Path(__file__).parent
CLAIM_ON_DATABASE_CLOCK = runpy.run_path(str(_VERSIONS / "0007_one_clock.py"))["CLAIM_ON_DATABASE_CLOCK"]
NEXT_DUE_FUNCTION = runpy.run_path(str(_VERSIONS / "0006_claim_function.py"))["NEXT_DUE_FUNCTION"]
# The promotion of due delayed jobs and the claim of limited spiders are 0007's, unchanged: their text is taken from
# there, not copied.
def _between(start: str, end: str) -> str:
    return CLAIM_ON_DATABASE_CLOCK[CLAIM_ON_DATABASE_CLOCK.index(start):CLAIM_ON_DATABASE_CLOCK.index(end)]


PROMOTION = _between("            WITH promoted AS (", "            v_next_due := spider_job_next_due(p_projects);")
LIMITED_CLAIM = _between("                WITH limits AS MATERIALIZED (", "            $claim$, v_projects) USING")

# store/schema.sql holds it with the reason for each step. What changed from 0007's:
# - The claim of one project (ISpiderQueue.pop, a node with one project) is first tried as one statement, which
#   claims only when no limit applies to the project and none of its delayed jobs is due (two index probes in the
#   same statement), and carries the next due time on each row claimed. When it fills the call's slots, that is
#   the whole call: no read before it, no summary row after it. Its project is a range from itself to itself, so
#   that a plan made for any project reads spider_job_pending_project_idx.
# - plan_cache_mode = force_generic_plan: the static statements are planned once per server connection. Planning
#   cost more than running (0.2-0.4 ms against 0.1-0.2 ms), and the plan cache kept choosing a new plan per call.
#   What needs the values to be planned well (several projects, the limits) is EXECUTEd: planned with its values.
# - The next due time is read by the function itself (a static statement, planned once), not by
#   spider_job_next_due(), a SQL function that Postgres planned again on every call; it is dropped.
# - lock_timeout is the function's own: the store calls it without the SET LOCAL statements sent before others.
# Replacing functions: no row is read or written, whatever the queue holds.
CLAIM_FUNCTION = """
    CREATE OR REPLACE FUNCTION claim_spider_jobs(
        p_projects text[], p_limit integer, p_node text, p_worker text, p_channel text
    ) RETURNS TABLE (
        id bigint, project text, job text, attempts integer, message jsonb, priority double precision,
        waited double precision, promoted bigint, next_due_in double precision
    ) LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET lock_timeout = '15s' AS $$
    #variable_conflict use_column
    DECLARE
        v_hot boolean := p_limit > 0 AND coalesce(cardinality(p_projects) = 1, false);
        v_claimed bigint := 0;
        v_round integer;
        v_promoted bigint := 0;
        v_next_due timestamptz;
        v_limited boolean;
        v_projects text := CASE WHEN p_projects IS NULL THEN 'true'
                                WHEN cardinality(p_projects) = 1 THEN 'project = $1[1]'
                                ELSE 'project = ANY($1)' END;
    BEGIN
        IF v_hot THEN
            RETURN QUERY
            UPDATE spider_job AS j
            SET status = 'ongoing', node = p_node, worker = p_worker, start_time = now(), attempts = j.attempts + 1
            WHERE j.id = ANY(ARRAY(
                  SELECT n.id FROM spider_job AS n
                  WHERE n.status = 'pending' AND n.project >= p_projects[1] AND n.project <= p_projects[1]
                    AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = p_projects[1])
                    AND NOT EXISTS (SELECT FROM spider_job AS d
                                    WHERE d.status = 'delayed' AND d.project = p_projects[1] AND d.run_at <= now())
                  ORDER BY n.project, n.priority DESC, n.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision), 0::bigint,
                      CAST(extract(epoch FROM (
                          SELECT d.run_at FROM spider_job AS d WHERE d.status = 'delayed' AND d.project = p_projects[1]
                          ORDER BY d.run_at LIMIT 1) - now()) AS double precision);
            GET DIAGNOSTICS v_claimed = ROW_COUNT;
            IF v_claimed = p_limit THEN
                RETURN;
            END IF;
        END IF;

        FOR v_round IN 1..2 LOOP
            SELECT CASE WHEN p_projects IS NULL THEN (
                       SELECT min(d.run_at) FROM spider_job AS d WHERE d.status = 'delayed'
                   ) ELSE (
                       SELECT min(due.run_at) FROM unnest(p_projects) AS wanted(project), LATERAL (
                           SELECT d.run_at FROM spider_job AS d
                           WHERE d.status = 'delayed' AND d.project = wanted.project
                           ORDER BY d.run_at LIMIT 1
                       ) AS due
                   ) END,
                   EXISTS (SELECT FROM spider_limit AS l WHERE p_projects IS NULL OR l.project = ANY(p_projects))
            INTO v_next_due, v_limited;
            EXIT WHEN v_round = 2 OR v_next_due IS NULL OR v_next_due > now();
{promotion}        END LOOP;

        IF p_limit > v_claimed AND v_limited THEN
            RETURN QUERY EXECUTE format($claim$
{limited_claim}            $claim$, v_projects)
            USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker;
        ELSIF p_limit > v_claimed AND (v_promoted > 0 OR NOT v_hot) THEN
            RETURN QUERY EXECUTE format($claim$
                UPDATE spider_job AS j
                SET status = 'ongoing', node = $3, worker = $4, start_time = now(), attempts = j.attempts + 1
                WHERE j.id = ANY(ARRAY(SELECT id FROM spider_job WHERE status = 'pending' AND %1$s
                      ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED))
                RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                          CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                          NULL::double precision
            $claim$, v_projects) USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker;
        END IF;

        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::jsonb, NULL::double precision,
               NULL::double precision, v_promoted, CAST(extract(epoch FROM v_next_due - now()) AS double precision);
    END
    $$
""".replace("{limited_claim}", LIMITED_CLAIM).replace("{promotion}", PROMOTION)


def upgrade() -> None:
    op.execute(CLAIM_FUNCTION)
    op.execute("DROP FUNCTION spider_job_next_due(text[])")


def downgrade() -> None:
    op.execute(NEXT_DUE_FUNCTION)
    op.execute(CLAIM_ON_DATABASE_CLOCK.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
