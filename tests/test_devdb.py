"""The throwaway servers other tests stand on: PgBouncer behaves like production's, and ports do not collide."""

from __future__ import annotations

import contextlib
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import make_url

from helpers import connect, query
from scrapyd_pgqueue.local import devdb


def test_a_query_through_pgbouncer_reads_what_was_written_directly(database_url, pgbouncer_database_url, pgbouncer):
    assert make_url(pgbouncer_database_url).port == pgbouncer.port != make_url(database_url).port
    query(database_url, "CREATE TABLE t (v text); INSERT INTO t VALUES ('written directly')")
    with contextlib.closing(connect(pgbouncer_database_url)) as bounced, bounced.cursor() as cursor:
        cursor.execute("SELECT v FROM t")
        assert cursor.fetchall() == [("written directly",)]
        name = make_url(database_url).database
        assert [client["database"] for client in pgbouncer.show("SHOW CLIENTS")].count(name) == 1


def test_pgbouncer_pools_in_transaction_mode(postgres_server, database_url):
    """Ten clients, each in a transaction at the same time, share a pool of three server connections."""
    bouncer = devdb.LocalPgBouncer(postgres_server[0], pool_size=3)
    bouncer.start()
    clients = []
    try:
        clients = [connect(bouncer.url_for(database_url)) for _ in range(10)]

        def transaction(client):
            with client.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid() FROM pg_sleep(0.2)")
                return cursor.fetchone()[0]

        started = time.monotonic()
        with ThreadPoolExecutor(10) as pool:
            backends = set(pool.map(transaction, clients))
        assert len(backends) <= 3
        assert time.monotonic() - started >= 0.2 * 4 - 0.05  # ten 0.2 s transactions, three at a time

        name = make_url(database_url).database
        assert sum(client["database"] == name for client in bouncer.show("SHOW CLIENTS")) == 10
        assert 1 <= sum(server["database"] == name for server in bouncer.show("SHOW SERVERS")) <= 3
        [[backends_seen]] = query(
            database_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid <> pg_backend_pid()"
        )
        assert 1 <= backends_seen <= 3  # ten clients still connected, Postgres sees the pool only
    finally:
        for client in clients:
            client.close()
        bouncer.remove()


def test_pgbouncer_refuses_the_options_startup_parameter_like_production(database_url, pgbouncer_database_url):
    connect(database_url, options="-c statement_timeout=1000").close()  # Postgres itself takes it
    with pytest.raises(psycopg2.OperationalError, match="unsupported startup parameter: options"):
        connect(pgbouncer_database_url, options="-c statement_timeout=1000")


def test_pgbouncer_stops_and_starts_again_on_the_same_port(postgres_server):
    bouncer = devdb.LocalPgBouncer(postgres_server[0])
    try:
        bouncer.start()
        assert query(bouncer.url, "SELECT 1") == [(1,)]
        bouncer.stop()
        with pytest.raises(psycopg2.OperationalError):
            connect(bouncer.url)
        bouncer.start()
        assert query(bouncer.url, "SELECT 1") == [(1,)]
    finally:
        bouncer.remove()
    assert not bouncer.base.exists()


def test_free_ports_are_outside_the_ephemeral_range_distinct_and_free():
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [devdb.free_port() for _ in range(200)]
    assert not [port for port in ports if low <= port <= high]
    assert len(set(ports)) == len(ports)
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_free_ports_without_proc_stay_below_every_usual_ephemeral_range(monkeypatch):
    def no_proc(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(devdb, "Path", no_proc)
    assert all(20000 <= devdb.free_port() < 30000 for _ in range(20))
