"""Fixtures: a real Postgres for the whole run, and a fresh database for each test.

``SCRAPYD_PGQUEUE_TEST_URL`` names an existing server to use; otherwise the suite starts a throwaway one
(a container where a Docker engine answers, else a local ``initdb`` cluster) and removes it at the end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import uuid
from pathlib import Path

import pytest
from psycopg2 import sql
from sqlalchemy import make_url

from helpers import SECRET, accepting, chromium, connect, database_with_secret_owner
from scrapyd_pgqueue import cli
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT, LocalCluster
from scrapyd_pgqueue.store import JobStore


@pytest.fixture(scope="session")
def postgres_server():
    """The server the run uses; ``server`` is None when it is an existing one named by the environment."""
    url = os.environ.get("SCRAPYD_PGQUEUE_TEST_URL")
    if url:
        yield url, None
        return
    server = devdb.throwaway_postgres()
    try:
        yield server.url, server
    finally:
        server.remove()


@pytest.fixture
def database_url(postgres_server):
    """A URL to a new, empty database of its own for this test."""
    server_url, _ = postgres_server
    name = f"test_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    # Databases are left for the server's removal: engines of this process may still hold connections.


@pytest.fixture(scope="session")
def pgbouncer(postgres_server):
    """Debian's PgBouncer in transaction pooling mode in front of the suite's server (the one
    ``SCRAPYD_PGQUEUE_TEST_URL`` names, or the throwaway one), for the whole run. Never skipped: a missing
    ``pgbouncer`` fails the tests that need it."""
    try:
        bouncer = devdb.LocalPgBouncer(postgres_server[0])
    except RuntimeError as error:  # no pgbouncer installed: say how to install it
        pytest.fail(str(error), pytrace=False)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.remove()


@pytest.fixture
def pgbouncer_database_url(database_url, pgbouncer):
    """The test's own database, through PgBouncer."""
    return pgbouncer.url_for(database_url)


@pytest.fixture(scope="session")
def egg(tmp_path_factory):
    """The example project built into an egg, as scrapyd-deploy builds one."""
    spec = importlib.util.spec_from_file_location("build_egg", EXAMPLE_PROJECT / "build_egg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_egg(tmp_path_factory.mktemp("egg"))


@pytest.fixture
def store(database_url):
    """The queue's operations (``JobStore``) over the test's database."""
    return JobStore.for_url(database_url)


@pytest.fixture
def command(database_url, capsys):
    """Run ``scrapyd-pgqueue ARGS --database-url URL``: (exit code, stdout, stderr); stdout parsed with --json."""

    def run(*args):
        code = cli.main([*args, "--database-url", database_url])
        out, err = capsys.readouterr()
        return code, json.loads(out) if "--json" in args and code == 0 else out, err

    return run


@pytest.fixture
def record_dir(tmp_path) -> Path:
    """Where the example project's crawls append what they ran (``EXAMPLE_RECORD_DIR``)."""
    return tmp_path / "records"


@pytest.fixture
def scrapyd_config(database_url):
    from scrapyd.config import Config

    return Config(values={"database_url": database_url, "node_name": "test-node", "finished_to_keep": "100"})


@pytest.fixture
def admin_connection(database_url):
    """A plain psycopg2 connection to the test's database, for looking at rows and server state."""
    connection = connect(database_url)
    yield connection
    connection.close()


# --- clusters of real nodes, and a database they may lose ---------------------------------------------------------

# Short leases so that a dead node is noticed in seconds. Crawls as the node's user (root here): the tests' directories
# and Python are root's own; tests/test_crawl_users.py runs crawls under users of their projects.
FAST = {"lease_seconds": "4", "heartbeat_interval": "1", "poll_interval": "1", "stop_timeout": "5",
        "crawl_users": "off"}


@pytest.fixture
def stoppable_database(postgres_server):
    """(nodes' URL, superuser URL, server) on a Postgres this test may stop and start.

    The suite's own server when it started one, else (SCRAPYD_PGQUEUE_TEST_URL names a shared one) a private
    throwaway server for this test.
    """
    server_url, server = postgres_server
    private = None
    if server is None:
        private = server = devdb.throwaway_postgres()
        server_url = server.url
    try:
        yield (*database_with_secret_owner(server_url), server)
    finally:
        if not accepting(server_url):  # a failed test may leave it stopped: later tests need it
            server.start()
        if private is not None:
            private.remove()


@pytest.fixture
def database(postgres_server):
    """(nodes' URL, superuser URL) of a new database on the suite's server, which these tests leave running."""
    return database_with_secret_owner(postgres_server[0])


@pytest.fixture
def start_cluster(tmp_path):
    """Start LocalClusters whose crawls record their runs; every node and crawl is gone after the test."""
    clusters = []

    def start(url, nodes, name_prefix="node", base_config=None, node_config=None, env=None, **config):
        cluster = LocalCluster(
            url, nodes, directory=tmp_path / f"cluster{len(clusters)}", config={**FAST, **config},
            env={"EXAMPLE_RECORD_DIR": str(tmp_path / "records"), **(env or {})}, name_prefix=name_prefix,
            base_config=base_config, node_config=node_config,
        )
        clusters.append(cluster)
        return cluster.start()

    yield start
    for cluster in clusters:
        cluster.stop()
        for node in cluster.nodes:
            node.end_crawls()  # orphans of killed nodes
    for cluster in clusters:
        for node in cluster.nodes:
            assert SECRET not in node.logfile.read_text(errors="replace"), f"password in {node.logfile}"


# --- a real browser ----------------------------------------------------------------------------------------------

ARTIFACTS = Path(__file__).parent / "artifacts"


@pytest.fixture
def browser():
    """Debian's headless chromium through its chromedriver (never downloaded; .ci/run installs both)."""
    driver = chromium()
    yield driver
    driver.quit()


@pytest.fixture
def artifacts(request):
    """tests/artifacts/<test>/ for what a test saves for people to look at (screenshots); gitignored."""
    path = ARTIFACTS / request.node.name.replace("/", "_")
    path.mkdir(parents=True, exist_ok=True)
    return path
