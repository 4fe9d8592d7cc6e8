"""cli/output.py: what every operator subcommand prints with (tables, JSON, times, errors) and the job's project
look-up, which reads a real database."""

from __future__ import annotations

import argparse
import datetime
import json

from scrapyd_pgqueue.cli.output import all_jobs_store, fail, print_json, resolve_project, table, when


def test_a_table_left_aligns_its_columns_two_spaces_apart_and_shows_none_as_empty():
    assert table(["NODE", "RUNNING", "URL"], [("node1", 2, "http://a"), ("n2", 10, None)]).splitlines() == [
        "NODE   RUNNING  URL",
        "node1  2        http://a",
        "n2     10",
    ]
    assert table(["NODE", "URL"], []) == "NODE  URL"


def test_times_are_shown_in_local_time_to_the_second_and_none_as_empty():
    moment = datetime.datetime(2026, 11, 24, 10, 0, 5, 999_999, tzinfo=datetime.timezone.utc)
    assert when(moment) == str(moment.astimezone().replace(tzinfo=None, microsecond=0))
    assert when(None) == ""


def test_json_output_is_sorted_and_plain(capsys):
    print_json({"b": datetime.date(2026, 11, 24), "a": (1, None)})
    printed = capsys.readouterr().out
    assert json.loads(printed) == {"a": [1, None], "b": "2026-11-24"}
    assert printed.index('"a"') < printed.index('"b"')


def test_an_error_goes_to_stderr_named_after_the_command_and_exits_1(capsys):
    assert fail("no such job") == 1
    assert capsys.readouterr() == ("", "scrapyd-pgqueue: no such job\n")


def test_a_jobs_project_is_found_when_one_project_has_it_and_asked_for_otherwise(database_url, store, capsys):
    for project in ("shop", "news"):
        store.enqueue(project, {"name": "s", "_job": "shared"})
    store.enqueue("shop", {"name": "s", "_job": "only-shop"})
    cluster = all_jobs_store(argparse.Namespace(database_url=database_url))

    def resolve(job, project=None):
        return resolve_project(cluster, argparse.Namespace(job=job, project=project))

    assert resolve("only-shop") == "shop"
    assert resolve("shared", project="news") == "news"
    assert resolve("shared") is None
    assert "exists in several projects (" in capsys.readouterr().err
    assert resolve("missing") is None
    assert capsys.readouterr().err == "scrapyd-pgqueue: no job 'missing' in any project\n"
