"""services/answers.py: the JSON values the services and the operator command's ``--json`` share (pure functions)."""

from __future__ import annotations

import dataclasses
import datetime
import json

from scrapyd_pgqueue.services.answers import FAILURES_SHOWN, plain, tree_answer
from scrapyd_pgqueue.store import JobRow, TreeView

START = datetime.datetime(2026, 11, 24, 10, 0, 0, tzinfo=datetime.timezone.utc)


@dataclasses.dataclass
class Point:
    when: datetime.datetime
    tags: tuple


def failure(number: int) -> JobRow:
    return JobRow(id=number, project="p", spider="explore", job=f"j{number}", status="terminated", outcome="failed",
                  exit_code=1, reason=f"boom {number}", node="node1", pid=100 + number, attempts=2, priority=0.0,
                  version=None, start_time=START, end_time=START + datetime.timedelta(seconds=number))


def tree(failures: int) -> TreeView:
    return TreeView(root="root", project="p", total=5, open=0, done=True, by_state={"finished": 5},
                    by_outcome={"finished": 5 - failures, "failed": failures}, start_time=START,
                    end_time=START + datetime.timedelta(minutes=1), completion_job=None, cancelled=False,
                    failures=[failure(number) for number in range(failures)])


def test_plain_turns_times_dataclasses_and_tuples_into_json_values():
    value = {"point": Point(START, ("a", 1)), "day": START.date(), "list": [(1, 2)], "none": None}
    assert plain(value) == {
        "point": {"when": "2026-11-24T10:00:00+00:00", "tags": ["a", 1]},
        "day": "2026-11-24",
        "list": [[1, 2]],
        "none": None,
    }
    json.dumps(plain(value))  # every part is JSON now


def test_a_tree_answer_has_its_counts_times_and_failures_as_plain_json():
    answer = tree_answer(tree(2))
    assert answer["root"] == "root" and answer["total"] == 5 and answer["done"] is True
    assert answer["states"] == {"finished": 5} and answer["outcomes"] == {"finished": 3, "failed": 2}
    assert answer["start_time"] == "2026-11-24T10:00:00+00:00"
    assert answer["end_time"] == "2026-11-24T10:01:00+00:00"
    assert answer["failures"][1] == {
        "id": "j1", "spider": "explore", "outcome": "failed", "reason": "boom 1", "exit_code": 1,
        "node_name": "node1", "attempts": 2, "start_time": "2026-11-24T10:00:00+00:00",
        "end_time": "2026-11-24T10:00:01+00:00",
    }
    json.dumps(answer)


def test_a_tree_answer_shows_at_most_the_failures_asked_for_and_none_for_a_negative_count():
    view = tree(FAILURES_SHOWN + 3)
    assert len(tree_answer(view)["failures"]) == FAILURES_SHOWN
    assert [row["id"] for row in tree_answer(view, failures=2)["failures"]] == ["j0", "j1"]
    assert tree_answer(view, failures=-1)["failures"] == []
