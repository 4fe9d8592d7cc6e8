"""Least privilege and secrets: nodes run as the node role `scrapyd-pgqueue grant` makes, which cannot change the
schema, reach the database host or read another database, even from a hostile spider; a node with a stronger role
says so at start-up; no password or environment is ever stored or logged."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg2
import pytest
import requests
from sqlalchemy import make_url

from helpers import connect, ends, jobs, query, schedule, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database import roles as roles_module
from scrapyd_pgqueue.local.cluster import NODE_CONFIG, LocalCluster
from scrapyd_pgqueue.store import JobStore

PASSWORD = "node-s3cret-pw"
COMMAND = str(Path(sys.executable).parent / "scrapyd-pgqueue")
WARNING = "This node's database role has more rights than a node needs"
# Nodes that also bake in the intruder project (example.intruder_settings).
INTRUDER_CONFIG = NODE_CONFIG.read_text().rstrip("\n") + "\nintruder = example.intruder_settings\n"
# Every privilege of a role in the database: on the queue's objects, by default, on the schema and the database.
PRIVILEGES = """
    SELECT 'relation', c.relname, c.relacl::text FROM pg_class AS c
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'S')
    UNION ALL SELECT 'function', p.proname, p.proacl::text FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace
    UNION ALL SELECT 'default', d.defaclobjtype::text, d.defaclacl::text FROM pg_default_acl AS d
    UNION ALL SELECT 'schema', n.nspname, n.nspacl::text FROM pg_namespace AS n WHERE n.nspname = 'public'
    UNION ALL SELECT 'database', d.datname, d.datacl::text FROM pg_database AS d WHERE d.datname = current_database()
    UNION ALL SELECT 'role', r.rolname, concat_ws(' ', r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolcanlogin)
    FROM pg_roles AS r WHERE r.rolname = %(role)s
    UNION ALL SELECT 'limits', r.rolname, concat_ws(' ', r.rolconnlimit, s.setconfig::text)
    FROM pg_roles AS r LEFT JOIN pg_db_role_setting AS s ON s.setrole = r.oid AND s.setdatabase = 0
    WHERE r.rolname = %(role)s
    ORDER BY 1, 2
"""
# The server's connections a role may take, less those grant leaves to other roles by default.
CONNECTIONS_FOR_NODES = """
    SELECT current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
           - %s
"""


def scrapyd_pgqueue(*args, database_url, expect=0, **env):
    """The console script, the database URL (and any other secret) in its environment, as the compose file runs it."""
    environment = {key: os.environ[key] for key in ("PATH", "LANG", "HOME") if key in os.environ}
    result = subprocess.run([COMMAND, *args], env={**environment, "SCRAPYD_DATABASE_URL": database_url, **env},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def migrate_and_grant(roles) -> None:
    """What the compose file's one-shot migrate service does, as the schema's owner; the node role exists already
    with its password (setting one needs CREATEROLE, which the owner has not)."""
    scrapyd_pgqueue("migrate", database_url=roles["owner_url"])
    scrapyd_pgqueue("grant", roles["node"], database_url=roles["owner_url"])


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
        "superuser_url": base.render_as_string(hide_password=False),
        "owner_url": base.set(username=owner, password="owner-pw").render_as_string(hide_password=False),
        "node_url": base.set(username=node, password=PASSWORD).render_as_string(hide_password=False),
    }


def test_a_node_runs_as_a_role_that_cannot_change_the_schema(roles, tmp_path):
    migrate_and_grant(roles)
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
    assert WARNING not in log

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


def test_grant_creates_a_node_role_with_exactly_a_node_s_rights_and_a_second_run_changes_nothing(roles):
    scrapyd_pgqueue("migrate", database_url=roles["owner_url"])
    node = f"fresh_{uuid.uuid4().hex[:8]}"  # created by grant (run as a superuser here: the owner may not create roles)
    first = scrapyd_pgqueue("grant", node, database_url=roles["superuser_url"], SCRAPYD_NODE_PASSWORD=PASSWORD)
    assert f"Role {node} may use the queue" in first.stdout and first.stderr == ""
    privileges = query(roles["owner_url"], PRIVILEGES, {"role": node})
    scrapyd_pgqueue("grant", node, database_url=roles["superuser_url"], SCRAPYD_NODE_PASSWORD=PASSWORD)
    assert query(roles["owner_url"], PRIVILEGES, {"role": node}) == privileges

    granted = {(kind, name): acl for kind, name, acl in privileges}
    assert granted[("role", node)] == "f f f t"  # superuser, createrole, createdb: no; login: yes
    tables = [name for kind, name in granted if kind == "relation" and not name.endswith("_seq")]
    assert {"spider_job", "project_egg", "spider_job_maintenance", db.VERSION_TABLE} <= set(tables)
    for name in tables:
        # SELECT only on the version table; no UPDATE of an egg or a staged row, no UPDATE or DELETE of a project's uid
        # or an egg's spiders; no TRUNCATE, REFERENCES or TRIGGER anywhere.
        rights = {db.VERSION_TABLE: "r", "project_egg": "ard", "spider_job_staging": "ard", "project_user": "ar",
                  "project_egg_spiders": "ar"}.get(name, "arwd")
        assert f"{node}={rights}/" in granted[("relation", name)], (name, granted[("relation", name)])
    assert all(f"{node}=U/" in acl for (kind, name), acl in granted.items() if name.endswith("_seq"))
    assert all(f"{node}=X/" in acl for (kind, _), acl in granted.items() if kind == "function")
    assert f"{node}=U/" in granted[("schema", "public")]  # USAGE, not CREATE
    assert f"{node}=c/" in granted[("database", roles["database"])]  # CONNECT
    assert "=c/" in granted[("database", roles["database"])] and "=Tc/" not in granted[("database", roles["database"])]
    # Role settings bounding one session, and a connection limit leaving room for other roles.
    [(connections,)] = query(roles["superuser_url"], CONNECTIONS_FOR_NODES, (roles_module.OTHER_ROLES_CONNECTIONS,))
    assert granted[("limits", node)] == (
        f"{connections} {{lock_timeout=20000ms,statement_timeout=60000ms,idle_in_transaction_session_timeout=10000ms}}")
    # Nothing by default on what the owner creates later: a new migration names its objects in roles.py.
    assert [key for key in granted if key[0] == "default"] == []
    query(roles["owner_url"], "CREATE TABLE later_migration (id serial)")
    assert query(roles["superuser_url"], "SELECT has_table_privilege(%s, 'later_migration', 'SELECT')", (node,)) == [
        (False,)]


def test_grant_refuses_the_owner_or_a_superuser_and_names_a_right_the_role_keeps(roles):
    scrapyd_pgqueue("migrate", database_url=roles["owner_url"])
    owner = make_url(roles["owner_url"]).username
    refused = scrapyd_pgqueue("grant", owner, database_url=roles["owner_url"], expect=2)
    assert "owns the queue's schema or tables" in refused.stderr
    superuser = make_url(roles["superuser_url"]).username
    refused = scrapyd_pgqueue("grant", superuser, database_url=roles["superuser_url"], expect=2)
    assert "is a superuser" in refused.stderr


def test_a_cluster_on_the_node_role_runs_jobs_and_its_spiders_cannot_break_out(roles, start_cluster, tmp_path):
    migrate_and_grant(roles)
    # Another database on the same server, with a table the nodes have no business reading.
    other = f"other_{uuid.uuid4().hex[:8]}"
    query(roles["superuser_url"], f"CREATE DATABASE {other}")
    query(make_url(roles["superuser_url"]).set(database=other).render_as_string(hide_password=False),
          "CREATE TABLE secret AS SELECT 'the crown jewels' AS jewel")
    marker = tmp_path / "copy-to-program-ran"

    cluster = start_cluster(roles["node_url"], 2, base_config=INTRUDER_CONFIG)
    node1, node2 = cluster.nodes
    for index in range(6):
        (node1 if index % 2 else node2).post("schedule.json", project="example", spider="quotes", jobid=f"q{index}")
    # The node's URL, as if the spider had found it (its environment holds none), where crawls may read (crawl_paths).
    url_file = tmp_path / "records" / "node-url"
    url_file.write_text(roles["node_url"])
    answer = node1.post("schedule.json", project="intruder", spider="intruder", jobid="intruder",
                        marker=str(marker), other_database=other, url_file=str(url_file))
    assert answer["status"] == "ok", answer
    wait_for(lambda: all(state[:2] == ("terminated", "finished") for state in jobs(roles["owner_url"]).values()), 90,
             "every job to finish")
    assert len(jobs(roles["owner_url"])) == 7

    [record] = [json.loads(line) for line in (tmp_path / "records" / "intrusions.jsonl").read_text().splitlines()]
    results = record["results"]
    assert results["read_queue"] == "ok", results  # the URL it found is the node's, which works
    assert results["create_table"].startswith("42501"), results  # insufficient_privilege
    assert results["drop_queue"].startswith("42501"), results  # must be owner
    assert results["copy_to_program"].startswith("42501"), results
    assert results["read_other_database"].startswith(("42501", "no connection")), results
    assert not marker.exists()
    for node in cluster.nodes:
        log = node.logfile.read_text(errors="replace")
        assert WARNING not in log and "permission denied" not in log and PASSWORD not in log


def test_a_node_whose_role_is_a_superuser_warns_once_at_start_up(database_url, start_cluster):
    (node,) = start_cluster(database_url, 1).nodes  # the suite's server's own superuser
    node.post("schedule.json", project="example", spider="quotes")  # more queues: still one warning
    log = wait_for(lambda: (text := node.logfile.read_text()) and WARNING in text and text, 30, "the warning")
    assert log.count(WARNING) == 1
    assert "is a superuser (COPY ... TO PROGRAM" in log and "scrapyd-pgqueue grant ROLE" in log


def test_a_spider_that_replaces_its_log_with_a_fifo_delays_no_finish(database_url, start_cluster, tmp_path):
    [node] = start_cluster(database_url, 1, base_config=INTRUDER_CONFIG, max_proc="1").nodes
    answer = node.post("schedule.json", project="intruder", spider="log_swap", jobid="fifo")
    assert answer["status"] == "ok", answer
    wait_for(lambda: jobs(database_url, "fifo")["fifo"][:2] == ("terminated", "finished"), 60,
             "the probe's own finish")
    [record] = swapped_logs(tmp_path)
    assert stat.S_ISFIFO(os.lstat(record["path"]).st_mode)  # still there: the node read nothing from it

    schedule(node, "after", spider="quotes")
    wait_for(lambda: jobs(database_url, "after")["after"][:2] == ("terminated", "finished"), 60,
             "the next job's finish")
    [closed] = [end["ended"] for end in ends(tmp_path) if end["job"] == "after"]
    lag = query(database_url, "SELECT extract(epoch FROM end_time) FROM spider_job WHERE job = 'after'")[0][0]
    print(f"\nthe job after the FIFO: recorded finished {float(lag) - closed:.2f} s after its spider closed")
    stored = dict(query(database_url, "SELECT j.job, l.log IS NOT NULL FROM spider_job AS j "
                                      "LEFT JOIN job_log AS l ON l.job_id = j.id"))
    assert stored == {"fifo": False, "after": True}  # the FIFO is not a log to keep; the next job's log is


# --- what grant names, and what it leaves alone ------------------------------------------------------------------

# The objects a migrated schema holds (tables, sequences, functions), as database/roles.py names them.
SCHEMA_OBJECTS = """
    SELECT CASE WHEN c.relkind = 'S' THEN 'sequence' ELSE 'table' END, c.relname::text FROM pg_class AS c
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'f')
    UNION ALL SELECT 'function', p.proname || '(' || oidvectortypes(p.proargtypes) || ')' FROM pg_proc AS p
    WHERE p.pronamespace = 'public'::regnamespace
"""


def test_grant_names_exactly_the_objects_the_migrations_create(database_url):
    db.get_engine(database_url).dispose()  # migrated to the newest revision
    created = set(query(database_url, SCHEMA_OBJECTS))
    named = ({("table", name) for name in roles_module.NODE_TABLES}
             | {("sequence", name) for name in roles_module.NODE_SEQUENCES}
             | {("function", name) for name in roles_module.NODE_FUNCTIONS})
    assert created == named


def test_grant_leaves_an_unrelated_table_unreadable_and_names_it(roles):
    scrapyd_pgqueue("migrate", database_url=roles["owner_url"])
    owner, node = make_url(roles["owner_url"]).username, roles["node"]
    query(roles["owner_url"], "CREATE TABLE customers AS SELECT 'a customer' AS name")
    # What an earlier version of grant left: rights on every table of the owner's, and by default on later ones.
    query(roles["owner_url"], f"GRANT ALL ON customers TO {node}")
    query(roles["owner_url"],
          f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA public GRANT ALL ON TABLES TO {node}")

    warned = scrapyd_pgqueue("grant", node, database_url=roles["owner_url"])
    assert "holds objects that are not the queue's: public.customers (table)" in warned.stderr, warned.stderr
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(roles["node_url"], "SELECT * FROM customers")
    assert query(roles["superuser_url"], "SELECT count(*) FROM pg_default_acl WHERE defaclacl::text LIKE %s",
                 (f"%{node}=%",)) == [(0,)]
    query(roles["owner_url"], "CREATE TABLE invoices (id int)")
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(roles["node_url"], "SELECT * FROM invoices")
    assert query(roles["node_url"], "SELECT count(*) FROM spider_job") == [(0,)]  # the queue's tables still are


def test_grant_where_public_may_create_in_schema_public_revokes_what_it_may_and_warns_about_the_rest(roles):
    """Postgres 14 and older: schema public belongs to the bootstrap superuser and PUBLIC may create in it."""
    scrapyd_pgqueue("migrate", database_url=roles["owner_url"])
    superuser, node = make_url(roles["superuser_url"]).username, roles["node"]
    query(roles["superuser_url"], f"ALTER SCHEMA public OWNER TO {superuser}")
    query(roles["superuser_url"], "GRANT CREATE ON SCHEMA public TO PUBLIC")

    warned = scrapyd_pgqueue("grant", node, database_url=roles["owner_url"])  # exit 0: the hook Job succeeds
    assert "run as the schema's owner: REVOKE CREATE ON SCHEMA \"public\" FROM PUBLIC" in warned.stderr, warned.stderr
    # The owner may not set another role's settings: the commands are named, a superuser's grant sets them.
    assert f'run as one: ALTER ROLE "{node}" SET "lock_timeout" = \'20000ms\'' in warned.stderr
    assert "but " not in warned.stderr  # no right of the role's own to revoke: nothing that exits 1
    assert query(roles["node_url"], "SELECT has_schema_privilege('public', 'CREATE')") == [(True,)]

    revoked = scrapyd_pgqueue("grant", node, database_url=roles["superuser_url"])
    assert revoked.stderr == ""
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(roles["node_url"], "CREATE TABLE intruder (id int)")


# --- one session of the node role cannot stop the cluster ----------------------------------------------------------

CLAIM = "SELECT job FROM claim_spider_jobs(ARRAY['p'], 1, 'n', 'w', 'c') WHERE id IS NOT NULL"


def test_a_node_role_session_cannot_hold_the_queue_locked(roles):
    migrate_and_grant(roles)
    scrapyd_pgqueue("grant", roles["node"], "--lock-timeout", "1", "--idle-in-transaction-timeout", "3",
                    database_url=roles["superuser_url"])
    JobStore.for_url(roles["owner_url"]).enqueue("p", {"name": "s", "_job": "after-the-lock"})
    holder = connect(roles["node_url"])
    holder.autocommit = False
    with holder.cursor() as cursor:  # a hostile spider's session: lock the queue, then do nothing
        cursor.execute("LOCK TABLE spider_job IN ACCESS EXCLUSIVE MODE")
    locked_at = time.monotonic()

    # Another session of the role waiting for the same lock gives up after the role's lock_timeout.
    with pytest.raises(psycopg2.errors.LockNotAvailable):
        query(roles["node_url"], "BEGIN; LOCK TABLE spider_job IN ACCESS EXCLUSIVE MODE")
    assert 1.0 <= time.monotonic() - locked_at < 2.5
    # A node's claim waits (its own lock_timeout, 15 s) until the idle holder is ended, then claims.
    assert query(roles["node_url"], CLAIM) == [("after-the-lock",)]
    assert 3.0 <= time.monotonic() - locked_at < 6.0
    with pytest.raises(psycopg2.OperationalError, match="idle-in-transaction timeout"), holder.cursor() as cursor:
        cursor.execute("SELECT 1")


FORGE = """
    CREATE TEMP TABLE spider_job AS SELECT * FROM public.spider_job;
    UPDATE pg_temp.spider_job SET job = 'forged', message = message || '{"_job": "forged"}', priority = 1000;
"""


def test_a_temporary_spider_job_does_not_change_what_the_claim_returns(roles):
    migrate_and_grant(roles)
    store = JobStore.for_url(roles["owner_url"])
    store.enqueue("p", {"name": "s", "_job": "real"})
    # A server where grant could not take TEMP from PUBLIC (its database's owner did not run it).
    query(roles["superuser_url"], f"GRANT TEMPORARY ON DATABASE {roles['database']} TO {roles['node']}")
    with contextlib.closing(connect(roles["node_url"])) as session, session.cursor() as cursor:
        cursor.execute(FORGE)
        cursor.execute(CLAIM)
        assert cursor.fetchall() == [("real",)]

    # Without the pinned search path (as before migration 0010), the same session gets the forged job.
    query(roles["superuser_url"], f"ALTER FUNCTION claim_spider_jobs({roles_module.NODE_FUNCTIONS[0].split('(')[1]} "
                                  "RESET search_path")
    store.enqueue("p", {"name": "s", "_job": "real-2"})
    with contextlib.closing(connect(roles["node_url"])) as session, session.cursor() as cursor:
        cursor.execute(FORGE)
        cursor.execute(CLAIM)
        assert cursor.fetchall() == [("forged",)]

    scrapyd_pgqueue("grant", roles["node"], database_url=roles["owner_url"])  # the database's owner: TEMP goes
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):
        query(roles["node_url"], "CREATE TEMP TABLE spider_job (id int)")


LEFT_BY_A_SESSION = """
    SELECT pg_backend_pid(), current_setting('statement_timeout'), to_regclass('pg_temp.spider_job') IS NOT NULL,
           array(SELECT pg_listening_channels())
"""
ADVISORY_LOCKS_OF = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"


def test_behind_pgbouncer_a_session_s_set_temporary_table_listen_and_lock_never_reach_another_client(
    pgbouncer_database_url, database_url
):
    """What an operator's psql on the node role's URL (or a node's listener probing LISTEN through the pooler) may
    leave on a server connection is gone when the next client's transaction gets it: the suite's PgBouncer runs the
    shipped reset after every transaction (server_reset_query_always = 1)."""
    db.get_engine(database_url).dispose()  # migrated
    with contextlib.closing(connect(pgbouncer_database_url)) as first, first.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [(server,)] = cursor.fetchall()
        # One transaction each (autocommit): the server connection goes back to PgBouncer's pool after each.
        cursor.execute("SET statement_timeout = '4321ms'")
        cursor.execute("CREATE TEMP TABLE spider_job AS SELECT 'forged' AS job")
        cursor.execute("LISTEN scrapyd_pgqueue_jobs")
        cursor.execute("SELECT pg_advisory_lock(4242)")

    def on_the_same_server():
        """The next client's transaction on the server connection the first client used (PgBouncer reuses the
        most recently released one): what it finds of the first client's session, the advisory locks Postgres
        shows for that server connection, and what it is told of a NOTIFY sent while it holds it."""
        with contextlib.closing(connect(pgbouncer_database_url)) as second:
            second.autocommit = False
            with second.cursor() as cursor:
                cursor.execute(LEFT_BY_A_SESSION)
                [(pid, timeout, temporary, channels)] = cursor.fetchall()
                if pid != server:
                    return None
                # A schedule's NOTIFY: a server connection still listening would pass it on at this commit.
                query(database_url, "NOTIFY scrapyd_pgqueue_jobs, 'example'")
            second.commit()
            second.poll()
            return timeout, temporary, channels, query(database_url, ADVISORY_LOCKS_OF, (server,))[0][0], second.notifies

    assert wait_for(on_the_same_server, 10, "a transaction on the first client's server connection") == (
        "0", False, [], 0, [])


def test_a_spider_that_links_its_log_to_a_node_s_file_gets_it_neither_stored_nor_served(database_url, start_cluster,
                                                                                        tmp_path):
    secret = tmp_path / "node-only.conf"
    secret.write_text("password = node-file-s3cret\n")
    [node] = start_cluster(database_url, 1, base_config=INTRUDER_CONFIG).nodes
    answer = node.post("schedule.json", project="intruder", spider="log_swap", jobid="link", link=str(secret))
    assert answer["status"] == "ok", answer
    wait_for(lambda: jobs(database_url, "link")["link"][:2] == ("terminated", "finished"), 60, "the probe's finish")
    [record] = swapped_logs(tmp_path)
    assert os.path.islink(record["path"])
    assert query(database_url, "SELECT count(*) FROM job_log") == [(0,)]
    served = requests.get(f"{node.url}logs/intruder/log_swap/link.log", timeout=30)
    assert served.status_code == 404 and "s3cret" not in served.text


def swapped_logs(tmp_path) -> list[dict]:
    """What the log_swap probes put in place of their logs."""
    return [json.loads(line) for line in (tmp_path / "records" / "swapped_logs.jsonl").read_text().splitlines()]



def test_a_crawl_s_link_in_logs_dir_is_neither_listed_nor_entered(database_url, start_cluster):
    [node] = start_cluster(database_url, 1).nodes
    schedule(node, "plain", spider="quotes")
    wait_for(lambda: jobs(database_url, "plain")["plain"][:2] == ("terminated", "finished"), 60, "the job's finish")
    logs = node.directory / "logs"
    assert (node.directory / "scrapyd.conf").is_file() and (logs / "example" / "quotes" / "plain.log").is_file()
    # What a crawl can make in its own log directory: a link to the node's directory, and a log that links to
    # one of the node's files.
    (logs / "example" / "evil").symlink_to(node.directory)
    (logs / "example" / "quotes" / "evil.log").symlink_to("../../../scrapyd.conf")

    def get(path):
        return requests.get(f"{node.url}logs/{path}", timeout=30)

    for path in ("", "example/", "example/quotes/"):
        listing = get(path)
        assert listing.status_code == 200, (path, listing.status_code)
        assert "evil" not in listing.text and "scrapyd.conf" not in listing.text, (path, listing.text)
    assert "plain.log" in get("example/quotes/").text
    for path in ("example/evil/", "example/evil", "example/evil/scrapyd.conf", "example/evil/logs/",
                 "example/quotes/evil.log"):
        refused = get(path)
        assert refused.status_code == 404, (path, refused.status_code)
        assert "scrapyd.conf" not in refused.text and "application" not in refused.text, (path, refused.text)
    served = get("example/quotes/plain.log")
    assert served.status_code == 200 and served.text == (logs / "example" / "quotes" / "plain.log").read_text()
    part = requests.get(f"{node.url}logs/example/quotes/plain.log", headers={"Range": "bytes=0-9"}, timeout=30)
    assert part.status_code == 206 and part.content == served.content[:10]
