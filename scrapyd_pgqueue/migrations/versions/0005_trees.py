"""Crawl trees: jobs that schedule jobs, and knowing exactly when everything is done.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# A tree's open jobs, counted in the same transaction as every change that opens or ends one: a child's insert, a
# final state (finish, recovery, hand-back, cancel), a requeue, a delete of a waiting job. One trigger covers every
# way a job ends, including those written later; its WHEN clause keeps jobs outside trees at no cost (no function
# call). The update of the tree's row serialises the last two jobs ending at the same instant on two nodes: only
# the one that brings the count to zero sees zero, and it enqueues the _on_complete job in its own transaction
# (exactly once: completion_job is set with it; never for a cancelled tree) and notifies scrapyd_pgqueue_trees with
# the root.
COUNT_TREE_JOBS = """
    CREATE FUNCTION spider_tree_count() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        delta integer;
        opened integer := 0;
        tree spider_tree;
        completion text;
    BEGIN
        IF TG_OP = 'INSERT' THEN
            delta := 1;
            opened := 1;
        ELSIF TG_OP = 'DELETE' THEN
            delta := -1;
        ELSE
            delta := CASE WHEN NEW.status = 'terminated' THEN -1 ELSE 1 END;
        END IF;
        UPDATE spider_tree
        SET open_jobs = open_jobs + delta, total = total + opened,
            done_time = CASE WHEN open_jobs + delta = 0 THEN now() END
        WHERE root_id = coalesce(NEW.tree_id, OLD.tree_id)
        RETURNING * INTO tree;
        IF tree.open_jobs = 0 THEN
            IF tree.on_complete IS NOT NULL AND tree.completion_job IS NULL AND NOT tree.cancelled THEN
                completion := replace(CAST(gen_random_uuid() AS text), '-', '');
                INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time)
                VALUES (tree.project, tree.on_complete->>'spider', completion, 0,
                        coalesce(tree.on_complete->'args', '{}'::jsonb)
                            || jsonb_build_object('name', tree.on_complete->>'spider', '_job', completion,
                                                  'settings', '{}'::jsonb, 'tree', tree.root_job),
                        'pending', now(), localtimestamp);
                UPDATE spider_tree SET completion_job = completion WHERE root_id = tree.root_id;
                PERFORM pg_notify('scrapyd_pgqueue_jobs', tree.project);
            END IF;
            PERFORM pg_notify('scrapyd_pgqueue_trees', CAST(json_build_object(
                'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id) AS text));
        END IF;
        RETURN NULL;
    END $$
"""

TRIGGERS = (
    """CREATE TRIGGER spider_tree_job_added AFTER INSERT ON spider_job FOR EACH ROW
       WHEN (NEW.tree_id IS NOT NULL) EXECUTE FUNCTION spider_tree_count()""",
    """CREATE TRIGGER spider_tree_job_moved AFTER UPDATE OF status ON spider_job FOR EACH ROW
       WHEN (NEW.tree_id IS NOT NULL AND (OLD.status = 'terminated') <> (NEW.status = 'terminated'))
       EXECUTE FUNCTION spider_tree_count()""",
    """CREATE TRIGGER spider_tree_job_removed AFTER DELETE ON spider_job FOR EACH ROW
       WHEN (OLD.tree_id IS NOT NULL AND OLD.status <> 'terminated') EXECUTE FUNCTION spider_tree_count()""",
)


def upgrade() -> None:
    # A job's parent (its job id, and its row), and its tree: the root's row id, set on every job of a tree that has
    # children or an _on_complete (a job alone keeps NULL, and costs nothing here).
    op.add_column("spider_job", sa.Column("parent", sa.Text))
    op.add_column("spider_job", sa.Column("parent_id", sa.BigInteger))
    op.add_column("spider_job", sa.Column("tree_id", sa.BigInteger))
    op.create_index("spider_job_tree_idx", "spider_job", ["tree_id"], postgresql_where=sa.text("tree_id IS NOT NULL"))
    # One row per tree: its open jobs (the root's included until its own crawl ends), its total, and its completion.
    op.create_table(
        "spider_tree",
        sa.Column("root_id", sa.BigInteger, primary_key=True),
        sa.Column("project", sa.Text, nullable=False),
        sa.Column("root_job", sa.Text, nullable=False),
        sa.Column("open_jobs", sa.Integer, nullable=False),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("on_complete", JSONB),
        sa.Column("completion_job", sa.Text),
        sa.Column("cancelled", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("created_time", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("done_time", sa.DateTime(timezone=True)),
        sa.CheckConstraint("open_jobs >= 0", name="spider_tree_open_jobs_check"),
    )
    # _unique_scope=tree: a key is scheduled once in a tree, whatever became of its job (pruned rows included).
    op.create_table(
        "spider_tree_key",
        sa.Column("tree_id", sa.BigInteger, sa.ForeignKey("spider_tree.root_id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("unique_key", sa.Text, primary_key=True),
        sa.Column("job", sa.Text, nullable=False),
    )
    op.execute(COUNT_TREE_JOBS)
    for trigger in TRIGGERS:
        op.execute(trigger)


def downgrade() -> None:
    for name in ("spider_tree_job_removed", "spider_tree_job_moved", "spider_tree_job_added"):
        op.execute(f"DROP TRIGGER {name} ON spider_job")
    op.execute("DROP FUNCTION spider_tree_count()")
    op.drop_table("spider_tree_key")
    op.drop_table("spider_tree")
    op.drop_index("spider_job_tree_idx", "spider_job")
    for column in ("tree_id", "parent_id", "parent"):
        op.drop_column("spider_job", column)
