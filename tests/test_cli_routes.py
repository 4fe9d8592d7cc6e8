"""``scrapyd-pgqueue route set|list|remove`` on a real database, and what a route does to the next enqueue."""

from __future__ import annotations

import pytest

from helpers import query
from scrapyd_pgqueue import cli


def test_route_set_list_remove_and_what_it_sends_where(command, store, database_url):
    code, answer, _ = command("route", "set", "shop", "render", "--tags", "eu,browser", "--json")
    assert code == 0 and answer == {"project": "shop", "spider": "render", "tags": ["browser", "eu"]}
    assert command("route", "set", "shop", "render", "--tags", "browser")[0] == 0  # replaces it
    assert command("route", "set", "news", "feed", "--tags", "gpu")[0] == 0
    assert command("route", "list", "--json")[1] == {"routes": [
        {"project": "news", "spider": "feed", "tags": ["gpu"]},
        {"project": "shop", "spider": "render", "tags": ["browser"]}]}
    code, listed, _ = command("route", "list", "--project", "shop")
    assert code == 0 and listed.splitlines()[0] == "Routes: 1" and "render  browser" in listed

    store.enqueue("shop", {"name": "render", "_job": "routed"})
    assert query(database_url, "SELECT pool FROM spider_job WHERE job = 'routed'") == [("browser",)]

    assert command("route", "remove", "shop", "render", "--json")[1]["removed"] is True
    code, _, err = command("route", "remove", "shop", "render")
    assert code == 1 and "no route for shop/render" in err
    store.enqueue("shop", {"name": "render", "_job": "unrouted"})
    assert query(database_url, "SELECT pool FROM spider_job WHERE job = 'unrouted'") == [("",)]


@pytest.mark.parametrize("tags, message", [("", "no tag given"), ("gpu,a b", "is not valid")])
def test_route_set_refuses_bad_tags_and_says_why(database_url, capsys, tags, message):
    with pytest.raises(SystemExit):
        cli.main(["route", "set", "p", "s", "--tags", tags, "--database-url", database_url])
    assert message in capsys.readouterr().err
