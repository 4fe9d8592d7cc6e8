"""Settings read from a node's configuration: the options' defaults and refusals (pure: no database)."""

import pytest
from scrapyd.config import Config

from scrapyd_pgqueue.config import ConfigurationError, settings

URL = {"database_url": "postgresql://u@localhost/db"}


def test_dead_jobs_are_all_kept_and_trees_capped_by_default():
    defaults = settings(Config(values=URL))
    assert (defaults.dead_to_keep, defaults.tree_max_jobs) == (None, 100_000)
    given = settings(Config(values={**URL, "dead_to_keep": "10", "tree_max_jobs": "0"}))
    assert (given.dead_to_keep, given.tree_max_jobs) == (10, 0)


@pytest.mark.parametrize("option", ["dead_to_keep", "tree_max_jobs"])
def test_a_negative_count_is_refused_at_start_up(option):
    with pytest.raises(ConfigurationError, match=f"'{option}' may not be negative"):
        settings(Config(values={**URL, option: "-1"}))


def test_warm_starts_are_on_by_default_and_need_one_warm_process_at_least():
    defaults = settings(Config(values=URL))
    assert (defaults.warm_start, defaults.warm_processes, defaults.warm_idle_timeout) == (True, 4, 300.0)
    given = settings(Config(values={**URL, "warm_start": "off", "warm_processes": "2", "warm_idle_timeout": "30"}))
    assert (given.warm_start, given.warm_processes, given.warm_idle_timeout) == (False, 2, 30.0)
    with pytest.raises(ConfigurationError, match="'warm_processes' must be at least 1"):
        settings(Config(values={**URL, "warm_start": "on", "warm_processes": "0"}))



@pytest.mark.parametrize("password", ["Xq7@Zk9", "Xq7/Zk9", "Xq7#Zk9", "Xq7?Zk9", "Xq7:Zk9"])
@pytest.mark.parametrize("option", ["database_url", "listen_url"])
def test_an_ambiguous_database_url_is_refused_at_start_up_and_never_shown(option, password):
    values = {**URL, option: f"postgresql://scrapyd:{password}@db.internal:5432/scrapyd"}
    refusal = f"{option}' is ambiguous: an unencoded '@', '/', '#', '.' or ':'"
    with pytest.raises(ConfigurationError, match=refusal) as e:
        settings(Config(values=values))
    assert not any(part in str(e.value) for part in ("Xq7", "Zk9"))
    # Percent-encoded, as the message says ('%%' in Scrapyd's configuration, which interpolates '%'): accepted.
    encoded = {"@": "%%40", "/": "%%2F", "#": "%%23", "?": "%%3F", ":": "%%3A"}
    quoted = "".join(encoded.get(character, character) for character in password)
    settings(Config(values={**URL, option: f"postgresql://scrapyd:{quoted}@db.internal:5432/scrapyd"}))


def test_webhooks_retry_for_a_day_by_default_and_need_positive_times():
    defaults = settings(Config(values=URL))
    assert (defaults.webhook_retry_hours, defaults.webhook_timeout, defaults.webhook_backoff,
            defaults.webhook_backoff_max) == (24.0, 10.0, 10.0, 3600.0)
    given = settings(Config(values={**URL, "webhook_retry_hours": "1", "webhook_backoff": "0.5"}))
    assert (given.webhook_retry_hours, given.webhook_backoff) == (1.0, 0.5)
    with pytest.raises(ConfigurationError, match="'webhook_timeout' must be more than 0 seconds"):
        settings(Config(values={**URL, "webhook_timeout": "0"}))


def test_a_node_s_tags_come_from_node_tags_or_the_environment_sorted_and_checked(monkeypatch):
    monkeypatch.delenv("SCRAPYD_NODE_TAGS", raising=False)
    assert settings(Config(values=URL)).node_tags == ()
    assert settings(Config(values={**URL, "node_tags": "eu, browser"})).node_tags == ("browser", "eu")
    monkeypatch.setenv("SCRAPYD_NODE_TAGS", "gpu")
    assert settings(Config(values={**URL, "node_tags": "eu"})).node_tags == ("gpu",)
    monkeypatch.setenv("SCRAPYD_NODE_TAGS", "gpu,big box")
    with pytest.raises(ConfigurationError, match="SCRAPYD_NODE_TAGS or 'node_tags': tag 'big box' is not valid"):
        settings(Config(values=URL))
