# From scrapyd 1.6.0 (sdist, tests/conftest.py), Copyright (c) Scrapy developers, BSD license (see LICENSE here).
# Unmodified except where a line is marked "scrapyd_pgqueue:": the config every test builds names the shared
# Postgres queue and job storage, on an empty database of the suite's throwaway Postgres (the fixture database_url,
# overridden in the section at the end of this file, which is ours).
import contextlib  # scrapyd_pgqueue
import os.path
import shutil
import uuid  # scrapyd_pgqueue

import pytest
from psycopg2 import sql  # scrapyd_pgqueue
from scrapyd import Config
from scrapyd.app import application
from scrapyd.interfaces import IEnvironment
from scrapyd.webservice import spider_list
from scrapyd.website import Root
from sqlalchemy import make_url  # scrapyd_pgqueue
from twisted.web import http
from twisted.web.http import Request
from twisted.web.test.requesthelper import DummyChannel

from helpers import connect  # scrapyd_pgqueue: tests/helpers.py
from scrapyd_pgqueue.config import DATABASE_URL_VARIABLE  # scrapyd_pgqueue
from scrapyd_pgqueue.database import db  # scrapyd_pgqueue
from scrapyd_upstream import root_add_version  # scrapyd_pgqueue: was "from tests import"

BASEDIR = os.path.abspath(os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _clear_spider_list_cache():
    spider_list.cache.clear()


@pytest.fixture()
def txrequest():
    http_channel = http.HTTPChannel()
    http_channel.makeConnection(DummyChannel.TCP())
    return Request(http_channel)


# Use this fixture when testing the Scrapyd web UI or API or writing configuration files.
@pytest.fixture()
def chdir(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(
    params=[
        None,
        (("items_dir", "items"), ("jobstorage", "scrapyd.jobstorage.SqliteJobStorage")),
    ],
    ids=["default", "custom"],
)
def config(request, chdir, database_url, monkeypatch):  # scrapyd_pgqueue: database_url, monkeypatch
    if request.param:
        shutil.copytree(os.path.join(BASEDIR, "fixtures", "filesystem"), chdir, dirs_exist_ok=True)
    config = Config()
    if request.param:
        for key, value in request.param:
            config.cp.set(Config.SECTION, key, value)
    # scrapyd_pgqueue: the shared queue and job storage (also in place of "custom"'s SqliteJobStorage).
    config.cp.set(Config.SECTION, "spiderqueue", "scrapyd_pgqueue.PostgresSpiderQueue")  # scrapyd_pgqueue
    config.cp.set(Config.SECTION, "jobstorage", "scrapyd_pgqueue.PostgresJobStorage")  # scrapyd_pgqueue
    config.cp.set(Config.SECTION, "database_url", database_url)  # scrapyd_pgqueue
    monkeypatch.delenv(DATABASE_URL_VARIABLE, raising=False)  # scrapyd_pgqueue: it would win over database_url
    return config


@pytest.fixture()
def app(config):
    return application(config)


@pytest.fixture()
def environ(app):
    return app.getComponent(IEnvironment)


@pytest.fixture()
def root(config, app):
    return Root(config, app)


@pytest.fixture()
def root_with_egg(root):
    root_add_version(root, "quotesbot", "0.1", "quotesbot")
    root.update_projects()
    return root


# --- scrapyd_pgqueue: not from scrapyd ---------------------------------------------------------------------------------
#
# Speed: every test starts from an empty, migrated database like tests/conftest.py's database_url gives, but it is one
# database for the whole run, emptied before each test (TRUNCATE: milliseconds), instead of ~160 databases created
# and migrated one by one (about half a second each). The components keep no state of their own between tests: the
# stores are stateless over the process's engine of that URL.


@pytest.fixture(scope="session")
def upstream_database_url(postgres_server):
    """A database on the suite's server with the newest schema, for this directory's tests."""
    server_url, _ = postgres_server
    name = f"upstream_{uuid.uuid4().hex[:12]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    db.get_engine(url)  # migrates
    yield url
    db.get_engine(url).dispose()


@pytest.fixture
def database_url(upstream_database_url):
    """Overrides tests/conftest.py's: the URL of a database as empty as a new one (every table but the schema's
    version emptied, sequences restarted)."""
    with contextlib.closing(connect(upstream_database_url)) as connection, connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '10s'")
        cursor.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename <> %s",
            (db.VERSION_TABLE,),
        )
        tables = [sql.Identifier(table) for (table,) in cursor.fetchall()]
        cursor.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(sql.SQL(", ").join(tables)))
    return upstream_database_url


HERE = os.path.dirname(__file__)


def pytest_collection_modifyitems(config, items):
    """Leave out the cases scrapyd's tests skip by themselves in the "default" config: they need the local project
    of scrapy.cfg ([settings]), which only the "custom" config has, and run there."""
    deselected = [
        item for item in items
        if str(item.path).startswith(HERE + os.sep)
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("config", ()) is None  # the "default" config
        and (item.callspec.params.get("run_only_if_has_settings") or item.originalname == "test_add_version_settings")
    ]
    if deselected:
        items[:] = [item for item in items if item not in deselected]
        config.hook.pytest_deselected(items=deselected)
