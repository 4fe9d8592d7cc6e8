"""The claim as a server-side function (small statements, cheap to plan), and the nodes' maintenance turn.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# When the next delayed job of p_projects (all when NULL) is due: the head of spider_job_delayed_idx, or of each
# project in spider_job_delayed_project_idx (a project without delayed jobs reads nothing of the others').
NEXT_DUE_FUNCTION = """
    CREATE FUNCTION spider_job_next_due(p_projects text[]) RETURNS timestamptz LANGUAGE sql STABLE AS $$
        SELECT CASE WHEN p_projects IS NULL THEN (
            SELECT min(run_at) FROM spider_job WHERE status = 'delayed'
        ) ELSE (
            SELECT min(due.run_at) FROM unnest(p_projects) AS wanted(project), LATERAL (
                SELECT run_at FROM spider_job WHERE status = 'delayed' AND project = wanted.project
                ORDER BY run_at LIMIT 1
            ) AS due
        ) END
    $$
"""

# Claim the next p_limit pending jobs of p_projects (all when NULL) for a node; the store's CLAIM_NEXT_JOBS calls it.
# store/schema.sql holds its current SQL (as 0007 changed it), with the reason for each step beside it. Why a
# function: the claim as one SQL statement (promotion, limits, summary) cost more to plan (0.5-0.7 ms) than to run
# (0.2 ms), on every call. Here each step is a small statement, cheap to plan, and a step a claim does not need is not
# run: promotion when nothing is due (the next due time, read first, is also the summary's), the limits when the
# projects have none. PL/pgSQL keeps the plans it can reuse in the server connection (which works behind PgBouncer's
# transaction pooling, unlike prepared statements); the claim itself is planned for its values on each call (a generic
# plan cannot know that a project is small, and would read the whole backlog's index for it). id = ANY(ARRAY(...))
# updates the locked rows through the primary key, whatever LIMIT is. Each statement of a VOLATILE function takes a
# fresh snapshot, so jobs promoted by the first step are claimable by the next one (in the same call), and a limited
# spider's running jobs are counted after its limit row is locked.
CLAIM_FUNCTION = """
    CREATE FUNCTION claim_spider_jobs(
        p_projects text[], p_limit integer, p_node text, p_worker text, p_start timestamp, p_channel text
    ) RETURNS TABLE (
        id bigint, project text, job text, attempts integer, message jsonb, priority double precision,
        waited double precision, promoted bigint, next_due_in double precision
    ) LANGUAGE plpgsql VOLATILE AS $$
    #variable_conflict use_column
    DECLARE
        v_promoted bigint := 0;
        v_next_due timestamptz := spider_job_next_due(p_projects);
        v_projects text := CASE WHEN p_projects IS NULL THEN 'true' ELSE 'project = ANY($1)' END;
    BEGIN
        -- Due delayed jobs become pending and wake the nodes (at most 1,000 a call, the earliest first).
        IF v_next_due <= now() THEN
            WITH promoted AS (
                UPDATE spider_job AS j SET status = 'pending'
                WHERE j.id = ANY(ARRAY(
                    SELECT d.id FROM spider_job AS d
                    WHERE d.status = 'delayed' AND d.run_at <= now()
                      AND (p_projects IS NULL OR d.project = ANY(p_projects))
                    ORDER BY d.run_at
                    LIMIT 1000
                    FOR UPDATE SKIP LOCKED))
                RETURNING j.project
            ), woken AS (
                SELECT count(*) AS jobs, pg_notify(p_channel, promoted.project) FROM promoted GROUP BY promoted.project
            )
            SELECT coalesce(sum(woken.jobs), 0) INTO v_promoted FROM woken;
            v_next_due := spider_job_next_due(p_projects);
        END IF;

        IF p_limit > 0 AND EXISTS (SELECT FROM spider_limit AS l
                                   WHERE p_projects IS NULL OR l.project = ANY(p_projects)) THEN
            -- Some spider has a limit: the whole claim of store/queue.py (planned on each call, as it depends on
            -- the limits; a fixed fragment chooses the projects, the values are parameters).
            RETURN QUERY EXECUTE format($claim$
                WITH limits AS MATERIALIZED (
                    SELECT project, spider, max_running FROM spider_limit WHERE %1$s
                    FOR UPDATE SKIP LOCKED
                ), room AS (
                    SELECT project, spider, max_running - spider_job_running(project, spider) AS free FROM limits
                ), unlimited_jobs AS (
                    SELECT id, priority FROM spider_job AS j
                    WHERE status = 'pending' AND %1$s
                      AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                    ORDER BY priority DESC, id
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED
                ), limited_jobs AS (
                    SELECT next.id, next.priority FROM room, LATERAL (
                        SELECT id, priority FROM spider_job
                        WHERE status = 'pending' AND project = room.project AND spider = room.spider
                        ORDER BY priority DESC, id
                        LIMIT greatest(least(room.free, $2), 0)
                        FOR UPDATE SKIP LOCKED
                    ) AS next
                ), next_jobs AS (
                    SELECT id FROM (SELECT * FROM unlimited_jobs UNION ALL SELECT * FROM limited_jobs) AS candidates
                    ORDER BY priority DESC, id
                    LIMIT $2
                )
                UPDATE spider_job AS j
                SET status = 'ongoing', node = $3, worker = $4, start_time = $5, attempts = j.attempts + 1
                FROM next_jobs WHERE j.id = next_jobs.id
                RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                          CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                          NULL::double precision
            $claim$, v_projects) USING p_projects, p_limit, p_node, p_worker, p_start;
        ELSIF p_limit > 0 AND p_projects IS NULL THEN
            -- No limit: the head of spider_job_pending_idx, SKIP LOCKED past other claimers' rows, LIMIT = free slots.
            RETURN QUERY
            UPDATE spider_job AS j
            SET status = 'ongoing', node = p_node, worker = p_worker, start_time = p_start, attempts = j.attempts + 1
            WHERE j.id = ANY(ARRAY(SELECT n.id FROM spider_job AS n WHERE n.status = 'pending'
                  ORDER BY n.priority DESC, n.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                      NULL::double precision;
        ELSIF p_limit > 0 AND cardinality(p_projects) = 1 THEN
            -- One project (ISpiderQueue.pop): the head of that project in spider_job_pending_project_idx.
            RETURN QUERY
            UPDATE spider_job AS j
            SET status = 'ongoing', node = p_node, worker = p_worker, start_time = p_start, attempts = j.attempts + 1
            WHERE j.id = ANY(ARRAY(
                  SELECT n.id FROM spider_job AS n WHERE n.status = 'pending' AND n.project = p_projects[1]
                  ORDER BY n.priority DESC, n.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                      NULL::double precision;
        ELSIF p_limit > 0 THEN
            -- Some projects: spider_job_pending_idx from its head, other projects' jobs passed over.
            RETURN QUERY
            UPDATE spider_job AS j
            SET status = 'ongoing', node = p_node, worker = p_worker, start_time = p_start, attempts = j.attempts + 1
            WHERE j.id = ANY(ARRAY(
                  SELECT n.id FROM spider_job AS n WHERE n.status = 'pending' AND n.project = ANY(p_projects)
                  ORDER BY n.priority DESC, n.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                      NULL::double precision;
        END IF;

        -- The summary row: how many became due, and in how many seconds the next delayed job is due.
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::jsonb, NULL::double precision,
               NULL::double precision, v_promoted, CAST(extract(epoch FROM v_next_due - now()) AS double precision);
    END
    $$
"""


def upgrade() -> None:
    # One row: when the nodes' maintenance of spider_job (store/maintenance.py) last started and ended. A node takes
    # its turn by updating it, so one node at a time vacuums and rebuilds indexes (two rebuilds of one table at once
    # deadlock), at most once per vacuum_interval in the cluster.
    op.create_table(
        "spider_job_maintenance",
        sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.text("true")),
        sa.Column("started", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("'-infinity'")),
        sa.Column("ended", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("'-infinity'")),
        sa.CheckConstraint("id", name="spider_job_maintenance_one_row"),
    )
    op.execute("INSERT INTO spider_job_maintenance DEFAULT VALUES")
    op.create_index(
        "spider_job_delayed_project_idx",
        "spider_job",
        ["project", "run_at"],
        postgresql_where=sa.text("status = 'delayed'"),
    )
    op.execute(NEXT_DUE_FUNCTION)
    op.execute(CLAIM_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION claim_spider_jobs(text[], integer, text, text, timestamp, text)")
    op.execute("DROP FUNCTION spider_job_next_due(text[])")
    op.drop_index("spider_job_delayed_project_idx", "spider_job")
    op.drop_table("spider_job_maintenance")
