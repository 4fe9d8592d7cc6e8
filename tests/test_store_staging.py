"""The staging table's lines: the line written at once for a bulk replace's job is the line written value by value."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scrapyd_pgqueue.job_rules.options import JobOptions
from scrapyd_pgqueue.store.enqueue import ENQUEUE_COLUMNS, ENQUEUE_JOBS, checked_row
from scrapyd_pgqueue.store.staging import MOVE_STAGED_JOBS, REPLACE_STAGED_JOBS, _copy_line, _staged_line

# Text COPY must escape, text it must not, and text around them (no NUL: no name may hold one).
TEXTS = st.one_of(st.sampled_from(["s", "tab\there", "line\nbreak", "cr\rhere", "back\\slash", "\\N", "é", ""]),
                  st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8))
OPTIONS = st.builds(
    JobOptions,
    unique_key=st.one_of(st.none(), TEXTS.filter(bool)),
    delay=st.one_of(st.none(), st.floats(0, 3600)),
    retries=st.integers(0, 5),
    retry_delay=st.floats(0, 60),
    max_runtime=st.one_of(st.none(), st.floats(1, 60)),
)


@settings(max_examples=500, deadline=None)
@given(spider=TEXTS.filter(bool), job=TEXTS.filter(bool), argument=TEXTS, priority=st.floats(-10, 10),
       version=st.one_of(st.none(), TEXTS.filter(bool)), options=OPTIONS, id=st.integers(1, 2 ** 62))
def test_a_staged_line_is_the_line_of_its_values(spider, job, argument, priority, version, options, id):
    message = {"name": spider, "_job": job, "a": argument, **({"_version": version} if version else {})}
    row = checked_row("p", (message, priority, options), 0)
    assert _staged_line(id, row) == _copy_line([id, id, *(row[column] for column in ENQUEUE_COLUMNS)])


def test_the_line_of_a_bulk_replace_job_holds_its_key_and_no_other_option():
    row = checked_row("p", ({"name": "s", "_job": "j", "url": "u"}, 5.0, JobOptions(unique_key="k")), 0)
    expected = "7\t7\ts\tj\t\\N\t5.0\t" + row["message"] + "\t\\N\t\\N\tk\t0\t0.0" + "\t\\N" * 7 + "\n"
    assert _staged_line(7, row) == expected


def test_the_move_of_staged_jobs_is_the_enqueue_over_staged_rows_with_their_ids():
    """Both statements are written out whole: past their batch (JSON rows, staged rows), they differ only by the ids
    the staged rows carry; a replace sets the same columns in all three."""
    def after_batch(statement):
        return statement.text[statement.text.index("), inserted AS ("):]

    assert after_batch(MOVE_STAGED_JOBS).replace("(id, project,", "(project,").replace(
        "SELECT id, :project,", "SELECT :project,") == after_batch(ENQUEUE_JOBS)
    replaced = ("(spider, version, priority, message, status, run_at, retries, retry_delay, max_runtime, stall_timeout, "
                "pool)")
    for statement in (ENQUEUE_JOBS, MOVE_STAGED_JOBS, REPLACE_STAGED_JOBS):
        assert replaced in " ".join(statement.text.split()).replace("( ", "("), statement
