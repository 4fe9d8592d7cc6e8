"""PostgresEggStorage: Scrapyd's egg storage in the database, shared by every node and every crawl subprocess."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import select
import subprocess
import sys
import textwrap
import uuid

import psycopg2
import pytest
from scrapyd.config import Config
from scrapyd.eggstorage import FilesystemEggStorage
from scrapyd.exceptions import EggNotFoundError, ProjectNotFoundError
from scrapyd.interfaces import IEggStorage
from zope.interface.verify import verifyObject

from helpers import node_role, query, runs_of, wait_for
from scrapyd_pgqueue import PostgresEggStorage
from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT
from scrapyd_pgqueue.store import PROJECTS_CHANNEL, JobStore


@pytest.fixture(scope="module")
def example_egg(tmp_path_factory) -> bytes:
    spec = importlib.util.spec_from_file_location("build_egg", EXAMPLE_PROJECT / "build_egg.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_egg(tmp_path_factory.mktemp("egg")).read_bytes()


@pytest.fixture
def storage(scrapyd_config):
    return PostgresEggStorage(scrapyd_config)


def test_implements_ieggstorage(storage):
    assert verifyObject(IEggStorage, storage)


def outcome(call):
    """What a call returned (eggs read out), or the exception it raised: comparable between two storages."""
    try:
        result = call()
    except Exception as e:  # noqa: BLE001 - the exception is the outcome
        return type(e).__name__
    if isinstance(result, tuple) and len(result) == 2 and result[1] is not None:
        with result[1] as egg:
            return result[0], egg.read()
    return result


def test_behaves_like_scrapyds_filesystem_egg_storage(storage, tmp_path):
    """The same calls give the same answers: version order, the latest version, missing eggs, deletes."""
    filesystem = FilesystemEggStorage(Config(values={"eggs_dir": str(tmp_path / "eggs")}))
    calls = [
        lambda s: s.list_projects(),
        lambda s: s.get("p"),
        lambda s: s.put(io.BytesIO(b"egg 9"), "p", "9"),
        lambda s: s.put(io.BytesIO(b"egg 10"), "p", "10"),
        lambda s: s.put(io.BytesIO(b"egg 2"), "p", "2"),
        lambda s: s.put(io.BytesIO(b"egg r7"), "q", "r7"),
        lambda s: s.put(io.BytesIO(b"egg r10"), "q", "r10"),
        lambda s: s.list("p"),  # 2, 9, 10: PEP 440 order
        lambda s: s.list("q"),  # r10, r7: not PEP 440, so plain string order
        lambda s: s.get("p"),  # the latest: 10
        lambda s: s.get("q"),
        lambda s: s.get("p", "9"),
        lambda s: s.get("p", "3"),
        lambda s: s.get("nope"),
        lambda s: s.put(io.BytesIO(b"egg 9 again"), "p", "9"),  # a second upload of a version replaces it
        lambda s: s.get("p", "9"),
        lambda s: sorted(s.list_projects()),
        lambda s: s.delete("p", "3"),
        lambda s: s.delete("nope"),
        lambda s: s.delete("p", "10"),
        lambda s: s.get("p"),
        lambda s: s.delete("q", "r7"),
        lambda s: s.delete("q", "r10"),  # the last version: the project goes too
        lambda s: s.list_projects(),
        lambda s: s.list("q"),
        lambda s: s.delete("p"),
        lambda s: s.list_projects(),
    ]
    assert [outcome(lambda: call(storage)) for call in calls] == [outcome(lambda: call(filesystem)) for call in calls]


def test_versions_are_listed_as_deployed_in_pep_440_order(storage):
    """Unlike Scrapyd's file storage, which lists "1.10" as its file name "1_10" (and so sorts it as text)."""
    for version in ("1.9", "1.10", "1.2"):
        storage.put(io.BytesIO(f"egg {version}".encode()), "p", version)
    assert storage.list("p") == ["1.2", "1.9", "1.10"]
    version, egg = storage.get("p")
    assert (version, egg.read()) == ("1.10", b"egg 1.10")


def test_delete_raises_scrapyds_exceptions(storage):
    storage.put(io.BytesIO(b"egg"), "p", "1")
    with pytest.raises(EggNotFoundError):
        storage.delete("p", "2")
    with pytest.raises(ProjectNotFoundError):
        storage.delete("q")


def test_every_node_sees_a_deploy_at_once(scrapyd_config, database_url, admin_connection):
    """Another node's storage lists it, and every node listening is told which project changed."""
    admin_connection.cursor().execute(f"LISTEN {PROJECTS_CHANNEL}")
    other_node = PostgresEggStorage(Config(values={"database_url": database_url, "node_name": "other"}))
    PostgresEggStorage(scrapyd_config).put(io.BytesIO(b"egg"), "deployed", "1")
    assert other_node.list_projects() == ["deployed"]
    assert other_node.list("deployed") == ["1"]
    assert select.select([admin_connection], [], [], 10)[0]
    admin_connection.poll()
    assert [(n.channel, n.payload) for n in admin_connection.notifies] == [(PROJECTS_CHANNEL, "deployed")]


CRAWL_SUBPROCESS = textwrap.dedent("""
    import json, sys
    from scrapyd.config import Config
    from scrapyd.utils import initialize_component

    # As scrapyd.runner does: the egg storage from the configuration files, then the egg.
    eggstorage = initialize_component(Config(), "eggstorage", "scrapyd.eggstorage.FilesystemEggStorage")
    version, egg = eggstorage.get(sys.argv[1])
    print(json.dumps({
        "storage": type(eggstorage).__name__,
        "version": version,
        "size": len(egg.read()),
        "reactor_installed": "twisted.internet.reactor" in sys.modules,
        "alembic_loaded": "alembic" in sys.modules,
    }))
""")


def node_directory(tmp_path):
    """A node's working directory whose scrapyd.conf selects the egg storage; the URL comes from the environment."""
    directory = tmp_path / "node"
    directory.mkdir()
    (directory / "scrapyd.conf").write_text("[scrapyd]\neggstorage = scrapyd_pgqueue.PostgresEggStorage\n")
    return directory


def crawl_environment(database_url, tmp_path, **extra):
    """A crawl subprocess's environment: no example project on the path, so only the egg can provide it."""
    env = {key: os.environ[key] for key in ("PATH", "LANG") if key in os.environ}
    env.update(HOME=str(tmp_path), SCRAPYD_DATABASE_URL=database_url, **extra)
    return env


def test_the_crawl_subprocess_gets_its_egg_without_a_reactor_or_migrations(
    storage, example_egg, database_url, tmp_path
):
    storage.put(io.BytesIO(example_egg), "deployed", "1")
    directory = node_directory(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", CRAWL_SUBPROCESS, "deployed"], cwd=directory,
        env=crawl_environment(database_url, tmp_path), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "storage": "PostgresEggStorage",
        "version": "1",
        "size": len(example_egg),
        # Scrapy must still be free to install its own reactor (a reactor imported first would be the default one
        # and every crawl would die), and no crawl pays for Alembic.
        "reactor_installed": False,
        "alembic_loaded": False,
    }


def test_scrapyds_runner_runs_a_version_fetched_from_the_database(storage, example_egg, database_url, tmp_path):
    """scrapyd.runner (as schedule.json's `scrapy list` and every crawl use it) activates the stored egg."""
    storage.put(io.BytesIO(example_egg), "deployed", "1")
    storage.put(io.BytesIO(b"PK\x05\x06" + b"\x00" * 18), "deployed", "2")  # an empty ZIP: no project inside
    directory = node_directory(tmp_path)

    def runner_list(**extra):
        return subprocess.run(
            [sys.executable, "-m", "scrapyd.runner", "list"], cwd=directory,
            env=crawl_environment(database_url, tmp_path, SCRAPY_PROJECT="deployed", **extra),
            capture_output=True, text=True, timeout=120,
        )

    pinned = runner_list(SCRAPYD_EGG_VERSION="1")
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.split() == ["quotes", "site", "sleeper", "stubborn", "ticker"]
    latest = runner_list()  # version 2, the latest, has no project in it
    assert latest.returncode != 0 and "BadEggError" in latest.stderr


def test_a_baked_in_project_starts_without_the_database_but_an_egg_project_says_why_not():
    from scrapyd_pgqueue.database.db import DatabaseError
    from scrapyd_pgqueue.local import devdb

    config = Config(values={"database_url": f"postgresql://nobody@127.0.0.1:{devdb.free_port()}/none"})
    config.cp.add_section("settings")
    config.cp.set("settings", "example", "example.settings")
    storage = PostgresEggStorage(config)
    assert storage.get("example") == (None, None)  # the crawl runs the baked-in settings module
    with pytest.raises(DatabaseError, match="127.0.0.1"):
        storage.get("deployed")


def test_every_node_deletes_its_cached_eggs_of_deleted_versions(database_url, start_cluster, egg):
    cluster = start_cluster(database_url, 2, max_proc="1")
    first, second = cluster.nodes
    for version in ("1", "2"):
        answer = first.post("addversion.json", project="deployed", version=version, egg=egg.read_bytes())
        assert answer["status"] == "ok", answer
    ids = dict(query(database_url, "SELECT version, id FROM project_egg WHERE project = 'deployed'"))

    def cached(node):
        directory = node.directory / "eggs" / "pgqueue"
        return sorted(path.name for path in directory.glob("*.egg")) if directory.exists() else []

    def run(*versions):
        """Crawls of the versions, one slot per node: two at once run on both nodes (each caches its egg)."""
        jobs = []
        for version in versions:
            answer = first.post("schedule.json", project="deployed", spider="sleeper", seconds="2",
                                _version=version)
            assert answer["status"] == "ok", answer
            jobs.append(answer["jobid"])
        wait_for(lambda: all(first.get("status.json", job=job)["currstate"] == "finished" for job in jobs), 90,
                 "the crawls to end")
        return {row[0] for row in query(database_url, "SELECT node FROM spider_job WHERE job = ANY(%s)", (jobs,))}

    assert run("1", "1") == {"node1", "node2"}
    [v2_name] = run("2")
    [v2_node] = [node for node in cluster.nodes if node.name == v2_name]
    assert all(f"{ids['1']}.egg" in cached(node) for node in cluster.nodes)
    assert f"{ids['2']}.egg" in cached(v2_node)

    # Deleted through the other node: every node forgets version 1's file, version 2's stays.
    assert second.post("delversion.json", project="deployed", version="1")["status"] == "ok"
    for node in cluster.nodes:
        wait_for(lambda: f"{ids['1']}.egg" not in cached(node), 15, f"{node.name} to delete version 1's egg")
    assert cached(v2_node) == [f"{ids['2']}.egg"]
    assert second.post("delproject.json", project="deployed")["status"] == "ok"
    wait_for(lambda: cached(v2_node) == [], 15, "the project's last cached egg to go")

    # An egg deleted while a node was down: the node deletes its file when it starts.
    second.stop()
    (second.directory / "eggs" / "pgqueue" / f"{ids['2'] + 1000}.egg").write_bytes(b"an egg deleted meanwhile")
    second.start()
    second.wait_ready()
    wait_for(lambda: cached(second) == [], 15, "the stale egg to go at start-up")


def test_an_egg_altered_in_the_database_is_refused_and_its_code_never_runs(
    database_url, admin_connection, start_cluster, egg, tmp_path
):
    node_url = node_role(admin_connection, database_url, f"node_{uuid.uuid4().hex[:8]}")
    [node] = start_cluster(node_url, 1, max_proc="1").nodes
    deployed = egg.read_bytes()
    assert node.post("addversion.json", project="deployed", version="1", egg=deployed)["status"] == "ok"
    [(egg_id, digest)] = query(database_url, "SELECT id, sha256 FROM project_egg")
    assert bytes(digest) == hashlib.sha256(deployed).digest()  # computed by the node that took the deploy
    with pytest.raises(psycopg2.errors.InsufficientPrivilege):  # the nodes' role may not alter an egg in place
        query(node_url, "UPDATE project_egg SET egg = egg || '\\x00'::bytea")

    def run(job):
        answer = node.post("schedule.json", project="deployed", spider="sleeper", seconds="0", jobid=job)
        assert answer["status"] == "ok", answer
        wait_for(lambda: node.get("status.json", job=job)["currstate"] == "finished", 90, f"{job} to end")
        [(outcome, reason)] = query(database_url, "SELECT outcome, reason FROM spider_job WHERE job = %s", (job,))
        return outcome, reason, bool(runs_of(tmp_path, job))

    def restart():  # a node process seals an egg once, then hands its crawls that sealed copy: a new one reads again
        node.stop()
        node.start()
        node.wait_ready()

    assert run("verified") == ("finished", None, True)
    # A cached file altered on disk is fetched again, checked, and runs (the node running meanwhile never reads it).
    cached = node.directory / "eggs" / "pgqueue" / f"{egg_id}.egg"
    cached.write_bytes(deployed + b"\x00")
    assert run("cache-altered-while-running") == ("finished", None, True)
    restart()
    assert run("cache-altered") == ("finished", None, True)
    assert cached.read_bytes() == deployed

    # Altered in the database by a role that may (the owner's): a node that has not cached it refuses it. Jobs some
    # other node queued fail, saying why; schedule.json (which lists the egg's spiders first) refuses at once.
    query(database_url, "UPDATE project_egg SET egg = egg || '\\x00'::bytea")
    cached.unlink()
    node.stop()
    store = JobStore.for_url(database_url)
    for job in ("altered-1", "altered-2"):
        store.enqueue("deployed", {"name": "sleeper", "_job": job, "seconds": "0"})
    node.start()
    node.wait_ready()
    for job in ("altered-1", "altered-2"):
        wait_for(lambda: node.get("status.json", job=job)["currstate"] == "finished", 90, f"{job} to end")
        [(outcome, reason)] = query(database_url, "SELECT outcome, reason FROM spider_job WHERE job = %s", (job,))
        assert (outcome, bool(runs_of(tmp_path, job))) == ("failed", False), (outcome, reason)
        assert f"(row id {egg_id}) does not match the sha256 stored at its deploy" in reason, reason
    answer = node.post("schedule.json", project="deployed", spider="sleeper", jobid="refused")
    assert answer["status"] == "error" and "does not match the sha256 stored at its deploy" in answer["message"]
    assert not cached.exists()
    log = node.logfile.read_text()
    assert log.count(f"Refused the egg of project deployed version 1 (row id {egg_id})") == 1  # once, not per job


def test_a_job_whose_egg_its_node_cannot_keep_fails_with_the_reason(database_url, start_cluster, storage, egg,
                                                                    tmp_path):
    """A crawl cannot look its egg up itself (it holds no database URL): its job fails, saying why."""
    (tmp_path / "not-a-directory").write_text("")
    (node,) = start_cluster(database_url, 1, eggs_dir=str(tmp_path / "not-a-directory" / "eggs")).nodes
    storage.put(io.BytesIO(egg.read_bytes()), "deployed", "1")
    JobStore.for_url(database_url).enqueue("deployed", {"name": "sleeper", "_job": "eggless"})
    wait_for(lambda: query(database_url, "SELECT status FROM spider_job WHERE job = 'eggless'") == [("terminated",)],
             30, "the job to end")
    [(outcome, reason)] = query(database_url, "SELECT outcome, reason FROM spider_job WHERE job = 'eggless'")
    assert outcome == "failed"
    assert reason.startswith("could not start the crawl: EggNotKept: could not fetch the egg of project deployed: ")
    assert "Not a directory" in reason
