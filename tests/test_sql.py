"""Statements as the store writes them and as psycopg2 takes them; results; addresses without the password."""

import pytest

from scrapyd_pgqueue.database.sql import Result, address_of, driver_dsn, reads_only, text


def test_parameters_become_psycopg2_placeholders_and_casts_and_literals_stay():
    statement = text("SELECT :job::text, 'a:b', x::regclass::text, format('%s', :n) WHERE y = \\:z")
    assert statement.driver_text == "SELECT %(job)s::text, 'a:b', x::regclass::text, format('%%s', %(n)s) WHERE y = :z"
    assert statement.text.startswith("SELECT :job") and not statement.writes
    assert text("UPDATE spider_job SET status = :status").writes


def test_results_read_as_sqlalchemy_results_do():
    rows = [(1, "a"), (2, "b")]
    assert Result(list(rows), 2, ("id", "name")).scalar() == 1
    assert Result([], 0, ("id",)).first() is None
    assert Result(list(rows), 2, ("id", "name")).scalars().all() == [1, 2]
    result = Result(list(rows), 2, ("id", "name"))
    assert result.fetchone() == (1, "a") and result.all() == [(2, "b")] and result.fetchone() is None
    with pytest.raises(LookupError, match="one row expected, 2 found"):
        Result(list(rows), 2, ("id", "name")).one()


@pytest.mark.parametrize("url", ["postgresql://u:s3cret@db.example:6543/queue", "postgres://u:s3cret@db.example:6543/queue",
                                 "postgresql+psycopg2://u:s3cret@db.example:6543/queue",
                                 "host=db.example port=6543 dbname=queue user=u password=s3cret"])
def test_every_spelling_of_a_database_url_has_one_address_without_its_password(url):
    address = address_of(url)
    assert (address.host, address.port, address.database, address.username) == ("db.example", 6543, "queue", "u")
    assert "s3cret" not in repr(address)
    assert driver_dsn(url).startswith("postgresql://") or "=" in url


def test_a_url_libpq_cannot_read_is_refused_without_repeating_it():
    with pytest.raises(ValueError) as raised:
        address_of("mysql://u:s3cret@db/queue")
    assert "s3cret" not in str(raised.value) and raised.value.__cause__ is None and raised.value.__suppress_context__


def test_which_statements_only_read():
    assert reads_only("SELECT status FROM spider_job WHERE job = %(job)s")
    assert reads_only("\n    SELECT count(*) FROM spider_job")
    for writes in ["UPDATE spider_job SET status = 'pending'", "WITH x AS (UPDATE t SET a = 1) SELECT 1",
                   "SELECT pg_notify('c', 'p')", "SELECT id FROM spider_job FOR UPDATE SKIP LOCKED",
                   "SELECT id FROM t FOR NO KEY UPDATE", "SELECT nextval('s')", "SELECT * INTO copy FROM t",
                   "SELECT pg_advisory_xact_lock(1)", "INSERT INTO t VALUES (1)"]:
        assert not reads_only(writes), writes
