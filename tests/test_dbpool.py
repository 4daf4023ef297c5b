"""runsite/dbpool.py: the pool lends the connection returned last, lends a healthy connection
without a round trip, and never lends one the server has closed."""

from __future__ import annotations

import select
import time
import uuid

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from runsite.dbpool import LifoConnectionPool, check_pooled_connection
from runsite.postgres.lazy_begin import LazyBeginConnection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _conninfo() -> dict:
    params = connection.settings_dict
    info = {
        "dbname": params["NAME"],
        "user": params.get("USER") or None,
        "password": params.get("PASSWORD") or None,
        "host": params.get("HOST") or None,
        "port": params.get("PORT") or None,
    }
    return {k: v for k, v in info.items() if v}


def _last_query(pid: int) -> str:
    with psycopg.connect(autocommit=True, **_conninfo()) as other:
        return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[
            0
        ]


def _terminate(pid: int, conn: psycopg.Connection) -> None:
    with psycopg.connect(autocommit=True, **_conninfo()) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    deadline = time.monotonic() + 5
    while not poller.poll(50) and time.monotonic() < deadline:
        pass  # the server's goodbye reaches the socket a moment later


def test_it_lends_a_healthy_idle_connection_without_asking_the_server() -> None:
    marker = f"SELECT 'marker-{uuid.uuid4().hex}'"
    with psycopg.connect(autocommit=True, **_conninfo()) as conn:
        conn.execute(marker)
        check_pooled_connection(conn)
        # psycopg_pool's own check would have sent an empty query, the backend's last one.
        assert _last_query(conn.info.backend_pid) == marker


def test_it_asks_the_server_when_something_waits_on_the_socket() -> None:
    with psycopg.connect(autocommit=True, **_conninfo()) as conn:
        conn.execute("LISTEN runsite_dbpool_test")
        with psycopg.connect(autocommit=True, **_conninfo()) as other:
            other.execute("NOTIFY runsite_dbpool_test")
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        assert poller.poll(5000)
        check_pooled_connection(conn)  # a healthy connection: the round trip passes
        assert _last_query(conn.info.backend_pid) == ""


def test_its_round_trip_never_begins_a_transaction_left_marked_on_the_connection() -> None:
    with LazyBeginConnection.connect(autocommit=True, **_conninfo()) as conn:
        conn.begin_pending = True  # Django closed it inside `atomic` before any statement
        conn.execute("LISTEN runsite_dbpool_test")  # (this statement began and ended one)
        conn.commit()
        conn.begin_pending = True
        with psycopg.connect(autocommit=True, **_conninfo()) as other:
            other.execute("NOTIFY runsite_dbpool_test")
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        assert poller.poll(5000)
        check_pooled_connection(conn)  # something waits: it asks the server
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert not conn.begin_pending


def test_it_refuses_a_connection_left_inside_a_transaction() -> None:
    with psycopg.connect(**_conninfo()) as conn:  # not autocommit: a transaction is open
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.ProgrammingError):  # as psycopg_pool's own check
            check_pooled_connection(conn)


def test_it_refuses_a_connection_the_server_terminated() -> None:
    with psycopg.connect(autocommit=True, **_conninfo()) as conn:
        conn.execute("SELECT 1")
        _terminate(conn.info.backend_pid, conn)
        with pytest.raises(psycopg.OperationalError):
            check_pooled_connection(conn)


def test_it_refuses_a_closed_connection() -> None:
    conn = psycopg.connect(autocommit=True, **_conninfo())
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        check_pooled_connection(conn)


def test_a_request_after_its_pooled_connection_was_terminated_gets_a_fresh_one() -> None:
    if "pool" not in connection.settings_dict.get("OPTIONS", {}):
        pytest.skip("DATABASE_POOL is off")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    raw = connection.connection
    connection.close()  # back to the pool
    _terminate(pid, raw)
    with connection.cursor() as cursor:  # the pool's check replaces it: no error here
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid


def _lent_after_returning_in_order(pool_class: type[ConnectionPool]) -> tuple[int, list[int]]:
    """Borrow three connections, return them first to last, borrow one: its backend and the
    three returned, oldest first."""
    with pool_class(kwargs=_conninfo(), min_size=3, max_size=3, open=True) as pool:
        pool.wait()
        borrowed = [pool.getconn() for _ in range(3)]
        pids = [conn.info.backend_pid for conn in borrowed]
        for conn in borrowed:
            pool.putconn(conn)
        lent = pool.getconn()
        try:
            return lent.info.backend_pid, pids
        finally:
            pool.putconn(lent)


def test_the_pool_lends_the_connection_returned_last() -> None:
    lent, returned = _lent_after_returning_in_order(LifoConnectionPool)
    assert lent == returned[-1]
    # psycopg's own pool lends the one idle longest: the difference this class makes.
    lent, returned = _lent_after_returning_in_order(ConnectionPool)
    assert lent == returned[0]


def test_after_a_burst_the_pool_lends_the_connection_it_lent_most_not_the_last_returned() -> None:
    """Ten requests one after another warm one connection; a burst of three borrows it and two
    more; whichever the burst returns last, the next borrower gets the warm one back (it has
    prepared and planned what the process runs), not one the burst opened."""
    with LifoConnectionPool(kwargs=_conninfo(), min_size=3, max_size=3, open=True) as pool:
        pool.wait()
        for _ in range(10):
            conn = pool.getconn()
            warm = conn.info.backend_pid
            pool.putconn(conn)
        burst = [pool.getconn() for _ in range(3)]
        assert burst[0].info.backend_pid == warm
        for conn in burst:  # the warm one returned first, the burst's last returned last
            pool.putconn(conn)
        lent = pool.getconn()
        try:
            assert lent.info.backend_pid == warm
            assert lent.info.backend_pid != burst[-1].info.backend_pid
        finally:
            pool.putconn(lent)


def test_django_connections_come_from_that_pool() -> None:
    assert isinstance(connection.pool, LifoConnectionPool)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
