"""Fixtures: a real Postgres for the whole run, and a fresh database for each test.

``SCRAPYD_PGQUEUE_TEST_URL`` names an existing server to use; otherwise the suite starts a throwaway one
(a container where a Docker engine answers, else a local ``initdb`` cluster) and removes it at the end.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import psycopg2
from psycopg2 import sql
import pytest
from sqlalchemy import make_url

from scrapyd_pgqueue import devdb


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


def _admin(url):
    parsed = make_url(url)
    connection = psycopg2.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, password=parsed.password,
        dbname=parsed.database or "postgres",
    )
    connection.autocommit = True
    return connection


@pytest.fixture
def database_url(postgres_server):
    """A URL to a new, empty database of its own for this test."""
    server_url, _ = postgres_server
    name = f"test_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(_admin(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    # Databases are left for the server's removal: engines of this process may still hold connections.


@pytest.fixture
def scrapyd_config(database_url):
    from scrapyd.config import Config

    return Config(values={"database_url": database_url, "node_name": "test-node", "finished_to_keep": "100"})


@pytest.fixture
def admin_connection(database_url):
    """A plain psycopg2 connection to the test's database, for looking at rows and server state."""
    connection = _admin(database_url)
    yield connection
    connection.close()
