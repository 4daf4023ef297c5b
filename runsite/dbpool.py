"""The check psycopg's pool runs before it lends a PostgreSQL connection (settings: `check=`).

A connection the server has closed (a restart, `pg_terminate_backend`, a session timeout) has the
server's goodbye waiting on its socket: an error message, then end of file. A healthy idle one
has nothing to read. So the check looks at the socket first and pays psycopg_pool's round trip
(an empty query, which raises for a dead connection so that the pool replaces it) only when
something is waiting there. The round trip on every loan cost PostgreSQL a statement per API
request and per database call of a worker (docs/benchmarks.md).
"""

from __future__ import annotations

import select
import typing

if typing.TYPE_CHECKING:
    import psycopg


def check_pooled_connection(conn: psycopg.Connection[typing.Any]) -> None:
    """Return quietly for a usable connection; raise for one the pool must not lend."""
    from psycopg import OperationalError
    from psycopg.pq import TransactionStatus
    from psycopg_pool import ConnectionPool

    if conn.closed or conn.broken:
        raise OperationalError("the connection is closed")
    if conn.info.transaction_status == TransactionStatus.IDLE and not _has_input(conn):
        return
    ConnectionPool.check_connection(conn)


def _has_input(conn: psycopg.Connection[typing.Any]) -> bool:
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))  # POLLHUP and POLLERR are reported whatever was asked
    except (OSError, ValueError):
        return True  # cannot tell: ask the server
