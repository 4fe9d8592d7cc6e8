"""The wanted nodes up to a maximum the caller gives (default 10,000), not 1,000: an autoscaler of a bigger cluster
asks for what it needs, and one that may not go beyond its maximum replica count asks for no more than that. One
body for both forms: the one-argument form is the tagged form without a tag filter.

Revision ID: 0022
Revises: 0021
"""

import runpy
from pathlib import Path

from alembic import op
from sqlalchemy import text

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_VERSIONS = Path(__file__).parent
_NODE_POOLS = runpy.run_path(str(_VERSIONS / "0014_node_pools.py"))
_with_pinned_search_path = _NODE_POOLS["_with_pinned_search_path"]
OLD_WANTED_NODES = runpy.run_path(str(_VERSIONS / "0008_wanted_nodes.py"))["WANTED_NODES_FUNCTION"]
OLD_WANTED_NODES_BY_TAGS = _NODE_POOLS["WANTED_NODES_BY_TAGS_FUNCTION"]
OLD_SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer)"
OLD_BY_TAGS_SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer, text[])"
SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer, integer)"
BY_TAGS_SIGNATURE = "scrapyd_pgqueue_wanted_nodes(integer, text[], integer)"

# store/schema.sql holds it with the reason for each step. What changed from 0014's: max_nodes, the answer's
# maximum (the waiting jobs are read up to max_nodes nodes' worth per kind), and NULL tags, which filter nothing
# (the one-argument form's count). Not STRICT for that: a NULL count or maximum still answers NULL. Its statement is
# planned for each call's values (force_custom_plan, about 0.3 ms): NULL tags fold the filter away and the counts
# read the indexes alone, as 0008's did; a generic plan, which a session's tagged calls would settle on, would scan
# spider_job itself for the one-argument form too.
WANTED_NODES_BY_TAGS_FUNCTION = """
    CREATE FUNCTION scrapyd_pgqueue_wanted_nodes(slots_per_node integer, tags text[], max_nodes integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT SET jit = off
    SET plan_cache_mode = force_custom_plan AS $$
    DECLARE
        v_cap bigint;
        v_work bigint;
    BEGIN
        IF slots_per_node IS NULL OR max_nodes IS NULL THEN
            RETURN NULL;
        END IF;
        IF slots_per_node < 1 THEN
            RAISE EXCEPTION 'slots_per_node must be at least 1, not %', slots_per_node
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF max_nodes < 1 THEN
            RAISE EXCEPTION 'max_nodes must be at least 1, not %', max_nodes
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        v_cap := CAST(max_nodes AS bigint) * slots_per_node;
        SELECT
            (SELECT count(*) FROM spider_job AS j
             WHERE j.status = 'ongoing' AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)
               AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider))
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'pending' AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'delayed' AND j.run_at <= now()
                  AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT coalesce(sum(greatest(limited.running, least(l.max_running, limited.running + limited.waiting))), 0)
             FROM spider_limit AS l, LATERAL (
                SELECT (SELECT count(*) FROM spider_job AS j
                        WHERE j.status = 'ongoing' AND j.project = l.project AND j.spider = l.spider
                          AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)) AS running,
                       (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'pending' AND j.project = l.project AND j.spider = l.spider
                              AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)
                            LIMIT l.max_running) AS capped)
                     + (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'delayed' AND j.run_at <= now()
                              AND j.project = l.project AND j.spider = l.spider
                              AND (tags IS NULL OR string_to_array(j.pool, ',') <@ tags)
                            LIMIT l.max_running) AS capped) AS waiting
             ) AS limited)
          + (SELECT count(*) FROM (
                SELECT FROM periodic_job AS p
                WHERE NOT p.paused AND p.next_fire_time <= now()
                  AND (tags IS NULL OR string_to_array(coalesce(p.pool, (SELECT r.pool FROM spider_route AS r
                                                                        WHERE r.project = p.project
                                                                          AND r.spider = p.spider), ''), ',') <@ tags)
                LIMIT v_cap) AS capped)
        INTO v_work;
        RETURN least(ceil(v_work::numeric / slots_per_node), max_nodes)::integer;
    END
    $$
"""

# All the work: the tagged form without a filter. SECURITY DEFINER as that one, so that a role with EXECUTE on this
# form alone may call it.
WANTED_NODES_FUNCTION = """
    CREATE FUNCTION scrapyd_pgqueue_wanted_nodes(slots_per_node integer, max_nodes integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path FROM CURRENT SET jit = off AS $$
        SELECT scrapyd_pgqueue_wanted_nodes(slots_per_node, CAST(NULL AS text[]), max_nodes)
    $$
"""

# The roles given EXECUTE on a function (a scaler's, the node role), other than its owner's: DROP FUNCTION takes
# their rights with it, so each gets the same on the function that replaces it (KEDA's role would be refused).
GRANTEES = text("""
    SELECT quote_ident(r.rolname) AS grantee, a.is_grantable
    FROM pg_proc AS p CROSS JOIN LATERAL aclexplode(p.proacl) AS a JOIN pg_roles AS r ON r.oid = a.grantee
    WHERE p.oid = CAST(:function AS regprocedure) AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
""")


def _replace(replaced: dict[str, str], functions: tuple[str, ...], revoked: tuple[str, ...]) -> None:
    """Drop each function of ``replaced`` (old signature -> new), create ``functions``, take EXECUTE from PUBLIC on
    ``revoked`` and give it back to whoever had it on the function each replaces."""
    connection = op.get_bind()
    grantees = {old: connection.execute(GRANTEES, {"function": old}).fetchall() for old in replaced}
    for old in replaced:
        op.execute(f"DROP FUNCTION {old}")
    _with_pinned_search_path(*functions)
    for signature in revoked:
        op.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
    for old, new in replaced.items():
        for grantee, grantable in grantees[old]:
            option = " WITH GRANT OPTION" if grantable else ""
            op.execute(f"GRANT EXECUTE ON FUNCTION {new} TO {grantee}{option}")


def upgrade() -> None:
    # The tagged form first: the one-argument form's body calls it.
    _replace({OLD_SIGNATURE: SIGNATURE, OLD_BY_TAGS_SIGNATURE: BY_TAGS_SIGNATURE},
             (WANTED_NODES_BY_TAGS_FUNCTION, WANTED_NODES_FUNCTION), (BY_TAGS_SIGNATURE, SIGNATURE))


def downgrade() -> None:
    _replace({SIGNATURE: OLD_SIGNATURE, BY_TAGS_SIGNATURE: OLD_BY_TAGS_SIGNATURE},
             (OLD_WANTED_NODES, OLD_WANTED_NODES_BY_TAGS), (OLD_SIGNATURE, OLD_BY_TAGS_SIGNATURE))
