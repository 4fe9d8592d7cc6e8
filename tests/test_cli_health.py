"""``scrapyd-pgqueue health [--ready]`` against a real node whose whole site asks for basic auth.

The database stalled under a node: tests/test_stalls.py (liveness passes, readiness fails, both within seconds).
"""

from __future__ import annotations

from helpers import health

CREDENTIALS = {"username": "operator", "password": "health-s3cret"}


def test_the_health_checks_pass_on_a_live_node_with_the_credentials_of_its_configuration(database_url, start_cluster):
    [node] = start_cluster(database_url, 1, **CREDENTIALS).nodes

    alive = health(node)  # credentials from the node's configuration files, as Scrapyd reads them
    ready = health(node, "--ready")

    assert alive.returncode == 0, alive.stderr
    assert '"status": "ok"' in alive.stdout and '"node_name": "node1"' in alive.stdout
    assert ready.returncode == 0, ready.stderr
    assert '"cluster"' in ready.stdout  # daemonstatus.json answered
    assert CREDENTIALS["password"] not in alive.stdout + alive.stderr + ready.stdout + ready.stderr


def test_the_environment_s_credentials_win_and_wrong_ones_fail(database_url, start_cluster):
    [node] = start_cluster(database_url, 1, **CREDENTIALS).nodes

    right = health(node, SCRAPYD_USERNAME="operator", SCRAPYD_PASSWORD="health-s3cret", HOME="/nonexistent")
    wrong = health(node, "--ready", SCRAPYD_PASSWORD="not-the-password")

    assert right.returncode == 0, right.stderr
    assert wrong.returncode == 1
    assert "401" in wrong.stderr


def test_a_node_that_is_not_there_is_not_healthy(database_url, start_cluster):
    cluster = start_cluster(database_url, 1)
    [node] = cluster.nodes
    cluster.stop()

    for args in ((), ("--ready",)):
        result = health(node, *args)
        assert result.returncode == 1
        assert "refused" in result.stderr.lower()
