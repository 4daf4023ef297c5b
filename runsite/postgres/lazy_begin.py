"""A transaction's BEGIN sent with its first statement, in one round trip (PostgreSQL).

psycopg opens a transaction by sending `BEGIN` and waiting for its answer before the first
statement, in pipeline mode too (it syncs after an implicit BEGIN: psycopg PR #401). Every
transaction Runsite makes pays that round trip: a run's create, its suspension, a decision, a
run's end; after the machine has been idle for a moment each one is ~0.4 ms
(`bench/idle_wake.py`, docs/benchmarks.md).

Here a pooled connection stays in psycopg's autocommit mode, and a transaction Django opens
(`atomic`, `set_autocommit(False)`) is only marked: the first statement that runs in it is sent
behind an explicit `BEGIN`, both in one pipeline (one Sync, one round trip). Statements after it
run in that transaction as usual; COMMIT and ROLLBACK are psycopg's own, which act on the
server's transaction status whatever the autocommit flag says. A statement that fails raises
from its `execute` as before (the pipeline syncs there) and leaves the transaction aborted for
Django's rollback.

The pipeline carries a first statement with parameters on a server-side-binding cursor
(Runsite's default, `DATABASE_PREPARE_THRESHOLD` > 0) and anything already in a pipeline
(`runs/rows.py`); any other first statement (one without parameters, which may hold several
statements; a client-side-binding cursor's; a named cursor's DECLARE) gets its BEGIN sent alone
first, as psycopg would.

A transaction's COMMIT may likewise go with its last statement (`queue_commit`, used by
`runs/rows.py` for the hot writes that end a transaction: a run's create, a decision, a
suspension, a run's end): one round trip less again. Django's own commit then finds the
connection idle and sends nothing (psycopg's `commit()` does nothing outside a transaction); its
on-commit hooks run as before. Anything the code tries to run in the transaction after that
statement is refused (`ProgrammingError`) instead of running outside it.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import pq
from psycopg.abc import PQGen

_IDLE = pq.TransactionStatus.IDLE


class LazyBeginConnection(psycopg.Connection[Any]):
    """A psycopg connection whose transactions begin with their first statement."""

    begin_pending = False
    # The transaction was committed with its last statement (`queue_commit`); Django has not
    # ended it yet (runsite/postgres/base.py clears this when it does).
    committed_early = False

    def _start_query(self) -> PQGen[None]:
        # psycopg's hook before every statement (its own BEGIN lives here); pinned in
        # requirements.txt and tested in tests/test_lazy_begin.py.
        if self.committed_early:
            raise psycopg.ProgrammingError(
                "the transaction was committed with its last statement: nothing may run in it"
                " after that (runs.rows.write_together(commit=True))"
            )
        if self.begin_pending and self.pgconn.transaction_status == _IDLE:
            self.begin_pending = False
            # Queued behind nothing in a pipeline (sent with the statement), else sent now.
            yield from self._exec_command(self._get_tx_start_command())
            return
        yield from super()._start_query()

    def queue_commit(self) -> None:
        """Queue the transaction's COMMIT in the open pipeline, behind its last statement: both
        are sent at the pipeline's Sync, in one round trip. A statement before it that fails
        aborts the pipeline, and the COMMIT is not run (the transaction is left for Django's
        rollback); a COMMIT that fails (a deferred constraint) raises at the Sync, with the
        transaction rolled back."""
        if self._pipeline is None:
            raise psycopg.ProgrammingError("queue_commit() needs an open pipeline")
        self.execute("COMMIT")
        self.committed_early = True


class FirstStatementWithBegin:
    """Cursor mixin: a statement that opens the transaction travels in one pipeline with its
    BEGIN; results, errors and `rowcount` are there when `execute` returns, as without it."""

    _conn: Any

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self._conn
        # Only a statement with parameters: it goes by the extended protocol anyway, as in a
        # pipeline; one without may hold several statements (a migration's SQL), which only
        # the simple protocol takes.
        if params and getattr(conn, "begin_pending", False) and conn._pipeline is None:
            with conn.pipeline():
                super().execute(query, params, **kwargs)  # type: ignore[misc]
            return self
        return super().execute(query, params, **kwargs)  # type: ignore[misc]


class ServerBindingCursor(FirstStatementWithBegin, base.ServerBindingCursor):
    pass
