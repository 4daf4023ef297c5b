"""The PostgreSQL connection pool: the connection it lends, and the check it runs before lending.

**Which connection.** psycopg's pool lends the connection idle longest (first in, first out), so a
process cycles through every connection it ever opened. Each PostgreSQL connection keeps its own
caches: the catalog entries of the tables it has touched, the statements psycopg has prepared on
it (`DATABASE_PREPARE_THRESHOLD`) and, after five runs of a prepared statement, its generic plan.
Cycling through ten connections, a statement run once per request (a cancel, a suspension) meets a
cold connection every time: parsed and planned again, its tables' catalog read again (a cancel's
write: 1.1 ms planned against 0.6 ms with its cached plan; 3-7 ms on a connection that never saw
it). `LifoConnectionPool` lends the idle connection it lent most often (of two lent as often, the one
returned last, as SQLAlchemy's `pool_use_lifo` does): the few connections a process keeps busy
stay warm, and the ones a burst opened stay idle until the pool's `max_idle` closes them (the pool
closes from the other end, the idle-longest). Lending the one returned last alone, the request
after a burst (ten concurrent reads, then a bulk cancel) went to whichever connection the burst
returned last, often one opened for the burst that had never planned what it was asked next.

**The check.** The pool runs it before it lends a connection (settings: `check=`).

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

from psycopg_pool import ConnectionPool

if typing.TYPE_CHECKING:
    import psycopg


class LifoConnectionPool(ConnectionPool):
    """psycopg's pool, lending the warmest idle connection first (see above): the one lent
    most often, and of those the one returned last."""

    def _get_ready_connection(self, timeout: float | None) -> typing.Any:
        # Called under the pool's lock. Idle connections queue oldest first and the pool
        # lends from the left: move the chosen one there. The rest keep their order, so the
        # pool's shrinking (also from the left) still closes the one idle longest.
        if self._pool:
            warmest = max(
                range(len(self._pool)), key=lambda i: (getattr(self._pool[i], _LOANS, 0), i)
            )
            conn = self._pool[warmest]
            del self._pool[warmest]
            self._pool.appendleft(conn)
            setattr(conn, _LOANS, getattr(conn, _LOANS, 0) + 1)
        return super()._get_ready_connection(timeout)


# How many times the pool lent a connection (an attribute of the connection).
_LOANS = "runsite_loans"


def check_pooled_connection(conn: psycopg.Connection[typing.Any]) -> None:
    """Return quietly for a usable connection; raise for one the pool must not lend."""
    from psycopg import OperationalError
    from psycopg.pq import TransactionStatus

    if conn.closed or conn.broken:
        raise OperationalError("the connection is closed")
    # A transaction marked but never begun when the connection came back (runsite/postgres/
    # lazy_begin.py: Django closed it inside `atomic`) is not the next borrower's: the check's
    # own query below must not begin it.
    if getattr(conn, "begin_pending", False):
        conn.begin_pending = False  # type: ignore[attr-defined]
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
