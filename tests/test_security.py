"""Least privilege and secrets: nodes run as a role that cannot change the schema; no password or environment
is ever stored or logged."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psycopg2
import pytest
from sqlalchemy import make_url

from scrapyd_pgqueue import db
from scrapyd_pgqueue.cluster import LocalCluster
from helpers import query

PASSWORD = "node-s3cret-pw"
# The grants of the README's "Database roles" section, for a node role on a database its owner migrated.
NODE_GRANTS = """
    GRANT CONNECT ON DATABASE {database} TO {node};
    GRANT USAGE ON SCHEMA public TO {node};
    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {node};
    GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {node};
"""


@pytest.fixture
def roles(postgres_server):
    """A new database owned by an owner role, and a node role with no rights yet: their URLs."""
    server_url, _ = postgres_server
    suffix = uuid.uuid4().hex[:8]
    database, owner, node = f"least_{suffix}", f"owner_{suffix}", f"node_{suffix}"
    query(server_url, f"CREATE ROLE {owner} LOGIN PASSWORD %s", ("owner-pw",))
    query(server_url, f"CREATE ROLE {node} LOGIN PASSWORD %s", (PASSWORD,))
    query(server_url, f"CREATE DATABASE {database} OWNER {owner}")
    base = make_url(server_url).set(database=database)
    return {
        "database": database,
        "node": node,
        "owner_url": base.set(username=owner, password="owner-pw").render_as_string(hide_password=False),
        "node_url": base.set(username=node, password=PASSWORD).render_as_string(hide_password=False),
    }


def test_a_node_runs_as_a_role_that_cannot_change_the_schema(roles, tmp_path):
    migrate = subprocess.run(
        [sys.executable, "-m", "scrapyd_pgqueue.cli", "migrate", "--database-url", roles["owner_url"]],
        capture_output=True, text=True, timeout=120,
    )
    assert migrate.returncode == 0, migrate.stderr
    query(roles["owner_url"], NODE_GRANTS.format(database=roles["database"], node=roles["node"]))
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(roles["node_url"], "CREATE TABLE intruder (id int)")

    marker = f"env-marker-{uuid.uuid4().hex}"
    cluster = LocalCluster(roles["node_url"], 1, directory=tmp_path, config={"poll_interval": "1"},
                           env={"SCRAPYD_PGQUEUE_TEST_MARKER": marker})
    with cluster:
        [node] = cluster.nodes
        answer = node.post("schedule.json", project="example", spider="quotes", jobid="least-privilege")
        assert answer["status"] == "ok", answer
        deadline = time.monotonic() + 60
        while (state := node.get("status.json", job="least-privilege")["currstate"]) != "finished":
            assert time.monotonic() < deadline, state
            time.sleep(0.2)
    log = node.logfile.read_text(errors="replace")
    assert "permission denied" not in log
    assert PASSWORD not in log

    stored = query(roles["owner_url"], "SELECT spider_job::text FROM spider_job") + query(
        roles["owner_url"], "SELECT scrapyd_node::text FROM scrapyd_node"
    )
    assert [row for row in stored if PASSWORD in row[0] or marker in row[0]] == []
    assert query(roles["owner_url"], "SELECT status, outcome FROM spider_job") == [("terminated", "finished")]


def test_a_role_that_cannot_migrate_an_old_schema_gets_told_what_to_run(roles):
    query(roles["owner_url"], f"GRANT CONNECT ON DATABASE {roles['database']} TO {roles['node']}")
    with pytest.raises(db.DatabaseError) as raised:
        db.get_engine(roles["node_url"])
    message = str(raised.value)
    assert "run `scrapyd-pgqueue migrate` once as the schema's owner" in message
    assert PASSWORD not in message
