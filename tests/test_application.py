"""One line, ``application = scrapyd_pgqueue.application``, makes a node; explicit options still win; the crawl
subprocesses get the same configuration; half a configuration, or a runner that goes around the one line, says what
is wrong and which line fixes it; a node open beyond loopback without a password refuses to start."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request

import pytest
from scrapyd.config import Config
from scrapyd.utils import initialize_component

from helpers import jobs, query, runs_of, wait_for
from scrapyd_pgqueue import one_line_config
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.local.cluster import EXAMPLE_PROJECT, LocalCluster
from scrapyd_pgqueue.one_line_config import COMPONENTS, SERVICES, apply_defaults

ONE_LINE_NODE = "[scrapyd]\napplication = scrapyd_pgqueue.application\n"
# Loaded by every interpreter of a node (sitecustomize on its PYTHONPATH): on SIGUSR1, the node's process writes the
# modules it has imported to MODULES_FILE.
MODULES_ON_SIGNAL = """
import os, signal, sys

def _write_modules(signum, frame):
    with open(os.environ["MODULES_FILE"] + ".part", "w") as file:
        file.write("\\n".join(sorted(sys.modules)))
    os.replace(os.environ["MODULES_FILE"] + ".part", os.environ["MODULES_FILE"])

signal.signal(signal.SIGUSR1, _write_modules)
"""
# The seed article's form: the shared queue, with Scrapyd's own poller, launcher, job storage and services.
HALF_NODE = "[scrapyd]\nspiderqueue = scrapyd_pgqueue.PostgresSpiderQueue\n[settings]\nexample = example.settings\n"
# The explicit form (docs: moving from stock Scrapyd): every component and service named, no webroot (Scrapyd's own root) and Scrapyd's runner.
EXPLICIT_NODE = "".join([
    "[scrapyd]\n", *(f"{option} = {path}\n" for option, path in COMPONENTS.items()
                    if option not in ("webroot", "runner")),
    "[services]\n", *(f"{name} = {path}\n" for name, path in SERVICES.items()),
    "[settings]\nexample = example.settings\n",
])


def config_from(text: str, tmp_path, monkeypatch) -> Config:
    """Scrapyd's Config as a node in ``tmp_path`` reads it: the package defaults, then ./scrapyd.conf."""
    (tmp_path / "scrapyd.conf").write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    return Config()


def test_scrapyd_defaults_become_the_cluster_s_and_explicit_options_win(tmp_path, monkeypatch):
    config = config_from(
        ONE_LINE_NODE + "launcher = my.Launcher\n[services]\ncancel.json = my.Cancel\n", tmp_path, monkeypatch
    )
    apply_defaults(config)
    assert config.get("poller") == "scrapyd_pgqueue.PostgresPoller"  # Scrapyd's default: replaced
    assert config.get("webroot") == "scrapyd_pgqueue.web.root.Root"
    assert config.get("runner") == "scrapyd_pgqueue.runner"
    assert config.get("launcher") == "my.Launcher"  # explicit: kept
    services = dict(config.items("services"))
    assert services["cancel.json"] == "my.Cancel"
    assert services["status.json"] == "scrapyd_pgqueue.services.jobs.Status"
    assert services["schedule_batch.json"] == "scrapyd_pgqueue.services.batches.ScheduleBatch"
    assert services["listprojects.json"] == "scrapyd.webservice.ListProjects"  # Scrapyd's own where ours adds nothing
    assert services["addversion.json"] == "scrapyd_pgqueue.services.eggs.AddVersion"  # Scrapyd's, off the reactor
    assert services["alive.json"] == "scrapyd_pgqueue.services.jobs.Alive"
    assert one_line_config.half_configuration(config) == []  # classes of the user's own are not Scrapyd's per-node ones


def test_the_crawl_runner_reads_the_same_configuration(tmp_path, monkeypatch, database_url):
    config_from(ONE_LINE_NODE, tmp_path, monkeypatch)
    monkeypatch.setenv("SCRAPYD_DATABASE_URL", database_url)
    storage = initialize_component(one_line_config.OneLineConfig(), "eggstorage", "scrapyd.eggstorage.FilesystemEggStorage")
    assert type(storage).__name__ == "PostgresEggStorage"


def test_half_a_configuration_names_what_is_wrong(tmp_path, monkeypatch):
    problems = one_line_config.half_configuration(config_from(HALF_NODE, tmp_path, monkeypatch))
    assert [problem.split(" = ")[0].split(" ")[0] for problem in problems] == ["poller", "launcher", "jobstorage",
                                                                               "[services]"]
    assert "status.json answers null for a job running on another node" in problems[-1]


def test_a_node_with_one_line_runs_an_egg_deployed_through_addversion(database_url, start_cluster, egg, tmp_path):
    # No [settings], no component: the example project exists only as the deployed egg, in the database.
    (node,) = start_cluster(database_url, 1, base_config=ONE_LINE_NODE).nodes
    deployed = node.post("addversion.json", project="deployed", version="1", egg=egg.read_bytes())
    assert deployed["status"] == "ok" and deployed["spiders"] == 5, deployed
    answer = node.post("schedule.json", project="deployed", spider="quotes", jobid="from-egg")
    assert answer["status"] == "ok", answer
    wait_for(lambda: jobs(database_url, "from-egg")["from-egg"][:2] == ("terminated", "finished"), 60,
             "the crawl to finish")
    assert runs_of(tmp_path, "from-egg")[0]["node"] == "node1"
    assert node.get("daemonstatus.json")["cluster"]["nodes"] == 1  # scrapyd_pgqueue's daemonstatus.json


def test_an_idle_node_imports_no_sqlalchemy_alembic_or_prometheus_client(database_url, start_cluster, tmp_path):
    """What a node does not use costs it no memory: an idle node (its ticks, claims and listener, the probes'
    daemonstatus.json, a page of jobs) runs on psycopg2 alone; SQLAlchemy and Alembic are for migrations, and
    prometheus_client for the first count or scrape of /metrics."""
    db.get_engine(database_url).dispose()  # current: the node has nothing to migrate
    hooks, modules = tmp_path / "hooks", tmp_path / "modules.txt"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(MODULES_ON_SIGNAL)
    env = {"PYTHONPATH": os.pathsep.join([str(hooks), str(EXAMPLE_PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "MODULES_FILE": str(modules)}
    (node,) = start_cluster(database_url, 1, env=env).nodes
    node.wait_serving()
    assert node.get("listjobs.json")["status"] == "ok"
    wait_for(lambda: query(database_url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                         "AND query LIKE '%%claim_spider_jobs%%'", (db.application_name(node.name),))[0][0],
             30, "the node's claims")
    os.kill(node.process.pid, signal.SIGUSR1)
    imported = set(wait_for(lambda: modules.exists() and modules.read_text().split(), 10, "the module list"))
    assert {"psycopg2", "scrapyd_pgqueue.store", "scrapyd_pgqueue.node.leases"} <= imported  # the node's own list
    assert not {name for name in imported if name.split(".")[0] in ("sqlalchemy", "alembic", "prometheus_client")}


def test_a_half_configured_node_warns_at_start_up_with_the_fixing_line(database_url, start_cluster):
    (node,) = start_cluster(database_url, 1, base_config=HALF_NODE).nodes
    log = wait_for(lambda: (text := node.logfile.read_text()) and "not all of its components" in text and text, 30,
                   "the warning")
    assert one_line_config.ONE_LINE in log
    assert "poller = scrapyd.poller.QueuePoller" in log and "[services] status.json" in log


def test_the_explicit_form_s_services_answer_under_scrapyd_s_own_root(database_url, start_cluster):
    """Named without a webroot, the cluster's services hang under Scrapyd's root, which has no settings of its own:
    they answer for the cluster all the same."""
    (node,) = start_cluster(database_url, 1, base_config=EXPLICIT_NODE).nodes
    node.wait_serving()
    listed = node.get("listjobs.json", project="example")
    assert listed["status"] == "ok" and listed["pending"] == [] and listed["finished"] == []
    assert node.get("listperiodic.json", project="example")["status"] == "ok"


def test_a_custom_runner_that_goes_around_the_one_line_is_named_with_the_fixing_line(tmp_path, monkeypatch):
    wrapped = config_from(ONE_LINE_NODE + "runner = mycompany.runner\n", tmp_path, monkeypatch)
    [problem] = one_line_config.bypassed_defaults(wrapped)
    assert "runner = mycompany.runner" in problem and "no active project" in problem
    assert "'eggstorage = scrapyd_pgqueue.PostgresEggStorage'" in problem
    # The eggstorage line in the file: the runner's subprocesses read it, nothing to say.
    fixed = config_from(ONE_LINE_NODE + "runner = mycompany.runner\neggstorage = scrapyd_pgqueue.PostgresEggStorage\n",
                        tmp_path, monkeypatch)
    assert one_line_config.bypassed_defaults(fixed) == []
    assert one_line_config.bypassed_defaults(config_from(ONE_LINE_NODE, tmp_path, monkeypatch)) == []


def test_a_one_line_node_with_a_wrapping_runner_warns_at_start_up(database_url, start_cluster):
    (node,) = start_cluster(database_url, 1, base_config=ONE_LINE_NODE + "runner = mycompany.runner\n").nodes
    log = wait_for(lambda: (text := node.logfile.read_text()) and "misconfigured" in text and text, 30, "the warning")
    assert "runner = mycompany.runner" in log and "eggstorage = scrapyd_pgqueue.PostgresEggStorage" in log


def test_a_node_refuses_to_listen_beyond_loopback_without_a_password(database_url, tmp_path):
    everywhere = {"SCRAPYD_BIND_ADDRESS": "0.0.0.0"}
    with pytest.raises(RuntimeError, match="exited at start-up") as refused:
        LocalCluster(database_url, 1, directory=tmp_path / "open", env=everywhere).start()
    assert "would listen on 0.0.0.0 with no username and password" in str(refused.value)
    assert "SCRAPYD_USERNAME and SCRAPYD_PASSWORD" in str(refused.value)

    credentials = {"SCRAPYD_USERNAME": "operator", "SCRAPYD_PASSWORD": "api-s3cret"}
    with LocalCluster(database_url, 1, directory=tmp_path / "closed", env={**everywhere, **credentials}) as cluster:
        (node,) = cluster.nodes  # its client sends the credentials
        node.wait_serving()
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{node.url}daemonstatus.json", timeout=30)
        assert anonymous.value.code == 401
    assert one_line_config.open_to_the_network(Config(values={"bind_address": "::1"})) is None
    assert one_line_config.open_to_the_network(Config(values={"bind_address": "localhost"})) is None
