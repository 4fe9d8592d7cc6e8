"""Warm starts (node/warm.py, crawl_process/warm_process.py): real nodes forking real crawls, checked by what the crawls record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.helpers import children_of, jobs, query, spawner_pid, wait_for

WARM = {"warm_start": "on"}
PROJECT = "probed"

# A project whose spider records what its crawl sees: arguments, a setting, its environment, the crawls this
# process ran before (a module global), its pid and parent, its reactor. VERSION tells a redeploy's code apart.
SPIDER = '''
import json, os, time
import scrapy
{top}
VERSION = {version!r}
CRAWLS_HERE = []


class Probe(scrapy.Spider):
    name = "probe"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        CRAWLS_HERE.append(kwargs.get("_job"))
        self.arguments = kwargs

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        spider = super().from_crawler(crawler, *args, **kwargs)
        from twisted.internet import reactor
        record = {{
            "job": kwargs.get("_job"), "version": VERSION, "args": kwargs, "setting": crawler.settings.get("PROBE"),
            "env": {{k: v for k, v in os.environ.items() if k.startswith("SCRAPY") and "URL" not in k}},
            "crawls_here": list(CRAWLS_HERE), "pid": os.getpid(), "ppid": os.getppid(),
            "log_file": crawler.settings.get("LOG_FILE"), "reactor": type(reactor).__name__, "started": time.time(),
        }}
        with open(os.path.join(os.environ["EXAMPLE_RECORD_DIR"], "probes.jsonl"), "a") as out:
            out.write(json.dumps(record) + "\\n")
        return spider

    async def start(self):
        yield scrapy.Request("data:,probe", dont_filter=True)

    async def parse(self, response):
        self.logger.info("probe line of job %s", self.arguments.get("_job"))
        from scrapy.utils.asyncio import sleep
        await sleep(float(self.arguments.get("seconds", 0)))
        yield {{"job": self.arguments.get("_job")}}
'''


def build_egg(directory, version="1", top="", settings=""):
    """A one-spider project (``probe``) as an egg, as scrapyd-deploy builds one; ``top``: its module's first lines."""
    source = directory / f"src-{version}-{abs(hash(top))}"
    (source / "probed" / "spiders").mkdir(parents=True)
    (source / "probed" / "__init__.py").write_text("")
    (source / "probed" / "settings.py").write_text(
        'SPIDER_MODULES = ["probed.spiders"]\nLOG_LEVEL = "INFO"\nTELNETCONSOLE_ENABLED = False\n' + settings)
    (source / "probed" / "spiders" / "__init__.py").write_text("")
    (source / "probed" / "spiders" / "probe.py").write_text(SPIDER.format(top=top, version=version))
    (source / "setup.py").write_text(textwrap.dedent("""
        from setuptools import setup, find_packages
        setup(name="probed", version="1.0", packages=find_packages(),
              entry_points={"scrapy": ["settings = probed.settings"]})
    """))
    subprocess.run([sys.executable, "setup.py", "-q", "bdist_egg", "-d", "dist"], cwd=source, check=True,
                   capture_output=True)
    return next((source / "dist").glob("*.egg")).read_bytes()


def probes(tmp_path) -> list[dict]:
    path = tmp_path / "records" / "probes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def probe_of(tmp_path, job) -> dict:
    return wait_for(lambda: next((p for p in probes(tmp_path) if p["job"] == job), None), 30, f"job {job} to start")


def finished(url, *names, outcome="finished", timeout=60):
    wait_for(lambda: all(jobs(url, name)[name][:2] == ("terminated", outcome) for name in names), timeout,
             f"jobs {names} to end {outcome}")


def warm_processes(node) -> set[int]:
    """Pids of the node's warm processes (started by its spawner)."""
    return set(children_of(spawner_pid(node), b"scrapyd_pgqueue.crawl_process.warm_process"))


def warm_up(node, url, records, project=PROJECT, spider="probe"):
    """The first crawl of a project version is spawned cold (it never waits for an import) while its warm process
    starts; the crawls after the warm process is ready are forked."""
    node.post("schedule.json", project=project, spider=spider, jobid="warmup")
    finished(url, "warmup")
    if project == PROJECT:
        assert probe_of(records, "warmup")["ppid"] == spawner_pid(node)  # cold
    wait_for(lambda: f"of project {project} ready" in node.logfile.read_text(), 60, "the warm process to be ready")


def deploy(node, egg, project=PROJECT, version="1"):
    answer = node.post("addversion.json", project=project, version=version, egg=egg)
    assert answer["status"] == "ok", answer


@pytest.fixture(scope="module")
def probe_egg(tmp_path_factory):
    return build_egg(tmp_path_factory.mktemp("probe-egg"))


@pytest.fixture
def records(tmp_path):
    (tmp_path / "records").mkdir()
    return tmp_path


def test_forked_crawls_see_only_their_own_arguments_settings_environment_and_globals(
        database_url, start_cluster, probe_egg, records):
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, probe_egg)
    warm_up(node, database_url, records)
    reactors = {"one": "AsyncioSelectorReactor", "two": "EPollReactor"}  # the project's, then one of -s
    for job, value in (("job-alpha", "one"), ("job-bravo", "two")):
        settings = [f"PROBE={value}"] + ["TWISTED_REACTOR=twisted.internet.epollreactor.EPollReactor"] * (
            value == "two")
        node.post("schedule.json", project=PROJECT, spider="probe", jobid=job, word=value, setting=settings)
        finished(database_url, job)
    first, second = probe_of(records, "job-alpha"), probe_of(records, "job-bravo")
    for probe, value in ((first, "one"), (second, "two")):
        assert probe["args"] == {"_job": probe["job"], "word": value}
        assert probe["setting"] == value
        assert probe["env"]["SCRAPY_PROJECT"] == PROJECT and probe["env"]["SCRAPY_JOB"] == probe["job"]
        assert "SCRAPYD_PGQUEUE_NODE_PID" not in probe["env"]  # the warm process's own environment is gone
        assert probe["crawls_here"] == [probe["job"]]  # the first crawl's module global is not the second's
        assert probe["reactor"] == reactors[value]
    # Forked from one warm process, which is not the node; their real pids are on the rows.
    assert first["ppid"] == second["ppid"] != spawner_pid(node)
    pids = "SELECT pid FROM spider_job WHERE job = ANY(%s) ORDER BY id"
    assert [pid for (pid,) in query(database_url, pids, (["job-alpha", "job-bravo"],))] == [first["pid"], second["pid"]]
    # Each crawl's log holds its own lines, and only those.
    for probe, other in ((first, second), (second, first)):
        text = open(probe["log_file"]).read()
        assert f"probe line of job {probe['job']}" in text and other["job"] not in text
    assert "Warm process" in node.logfile.read_text()


def test_a_crawl_cancelled_at_once_ends_cancelled(database_url, start_cluster, probe_egg, records):
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, probe_egg)
    warm_up(node, database_url, records)
    node.post("schedule.json", project=PROJECT, spider="probe", jobid="cancelled", seconds="30")
    pid = wait_for(lambda: query(database_url, "SELECT pid FROM spider_job WHERE job = 'cancelled'")[0][0], 30,
                   "its pid", interval=0.002)
    started = time.monotonic()
    assert node.post("cancel.json", project=PROJECT, job="cancelled")["status"] == "ok"
    assert time.monotonic() - started < 1
    finished(database_url, "cancelled", outcome="cancelled", timeout=30)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_killing_the_warm_process_mid_crawl_loses_no_job(database_url, start_cluster, probe_egg, records):
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, probe_egg)
    warm_up(node, database_url, records)
    node.post("schedule.json", project=PROJECT, spider="probe", jobid="orphaned", seconds="3")
    warm_pid = probe_of(records, "orphaned")["ppid"]
    os.kill(warm_pid, signal.SIGKILL)
    finished(database_url, "orphaned")
    runs = [probe for probe in probes(records) if probe["job"] == "orphaned"]
    assert len(runs) == 2 and runs[1]["ppid"] != warm_pid  # handed back, run again (cold)
    assert jobs(database_url, "orphaned")["orphaned"][3] == 2  # two attempts, one row
    with pytest.raises(ProcessLookupError):
        os.kill(runs[0]["pid"], 0)  # the first crawl died with its warm process


# What a project's import does that a fork would share with every crawl, and the reason the node logs for it. A
# thread started with ``_thread`` is not in ``threading.active_count()``; the kernel (/proc/self/task) counts it.
UNSAFE_IMPORTS = {
    "a reactor": ("from twisted.internet import reactor",
                  'TWISTED_REACTOR = "twisted.internet.epollreactor.EPollReactor"\n',  # the one its import installs
                  "importing the project installs a Twisted reactor"),
    "a low-level thread": ("import _thread, time\n_thread.start_new_thread(time.sleep, (3600,))", None,
                           "importing the project starts 1 threads"),
}


@pytest.mark.parametrize("unsafe", UNSAFE_IMPORTS)
def test_a_project_whose_import_would_be_unsafe_to_fork_is_spawned_cold(
        database_url, start_cluster, tmp_path, records, unsafe):
    top, settings, why = UNSAFE_IMPORTS[unsafe]
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, build_egg(tmp_path, top=top, **({"settings": settings} if settings else {})))
    for job in ("cold1", "cold2"):
        node.post("schedule.json", project=PROJECT, spider="probe", jobid=job)
        finished(database_url, job)
        assert probe_of(records, job)["ppid"] == spawner_pid(node)  # spawned cold by the node's spawner
    reason = f"Project {PROJECT} is spawned cold: {why}"
    wait_for(lambda: node.logfile.read_text().count(reason), 30, "the reason in the log")
    assert node.logfile.read_text().count(reason) == 1


def test_a_redeploy_through_another_node_runs_the_new_code_at_the_next_crawl(
        database_url, start_cluster, probe_egg, tmp_path, records):
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, probe_egg)
    node.post("schedule.json", project=PROJECT, spider="probe", jobid="old")
    finished(database_url, "old")
    (other,) = start_cluster(database_url, 1, name_prefix="deployer", **WARM).nodes
    deploy(other, build_egg(tmp_path, version="2"))  # the same project version, new code
    other.stop()
    node.post("schedule.json", project=PROJECT, spider="probe", jobid="new")
    finished(database_url, "new")
    assert probe_of(records, "old")["version"] == "1" and probe_of(records, "new")["version"] == "2"


def test_the_least_recently_used_warm_process_is_retired_and_an_idle_one_exits(
        database_url, start_cluster, probe_egg, records):
    # Idle for 10 s, a warm process exits: long enough to be seen between two crawls on a loaded machine.
    (node,) = start_cluster(database_url, 1, warm_processes="1", warm_idle_timeout="10", **WARM).nodes
    deploy(node, probe_egg)
    node.post("schedule.json", project=PROJECT, spider="probe", jobid="probed")
    finished(database_url, "probed")
    [probed] = warm_processes(node)
    node.post("schedule.json", project="example", spider="sleeper", jobid="example")  # the baked-in project
    finished(database_url, "example")
    [example] = wait_for(lambda: (pids := warm_processes(node)) and probed not in pids and pids, 10,
                         "the least recently used warm process to exit")
    assert example != probed
    wait_for(lambda: not warm_processes(node), 30, "the idle warm process to exit")


def test_an_egg_swapped_in_the_node_s_cache_while_crawls_start_never_runs(
        database_url, start_cluster, probe_egg, records, tmp_path):
    """A crawl could write the node's egg cache (one user); one rewrote every cached egg every few milliseconds so that
    its code ran as another project's crawl. The node checks an egg's bytes and hands the crawl those very bytes,
    sealed in memory: whatever the cache holds meanwhile, every crawl, cold or forked, runs the deployed version."""
    hostile = build_egg(tmp_path, version="hostile")
    (node,) = start_cluster(database_url, 1, **WARM).nodes
    deploy(node, probe_egg)
    cache = node.directory / "eggs" / "pgqueue"
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            for path in cache.glob("*.egg"):
                path.write_bytes(hostile)
            time.sleep(0.003)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        warm_up(node, database_url, records)
        names = [f"during-swap-{n}" for n in range(4)]
        for name in names:
            node.post("schedule.json", project=PROJECT, spider="probe", jobid=name)
        finished(database_url, *names)
    finally:
        stop.set()
        swapper.join()
    assert {probe["version"] for probe in probes(records)} == {"1"}
    assert len(probes(records)) == 5
