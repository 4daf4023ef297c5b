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

A connection also keeps its hot statements' plan mode between them (`generic_plans_only`).
Runsite's hand-written hot statements run with `plan_cache_mode = force_generic_plan`, so that
PostgreSQL plans each once per connection (runs/rows.py `_execute_planned_once`); every other
statement keeps the server's choice of plan. That setting was set and reset around each hot
statement in its pipeline: two statements more for each one, ~20 % of the client's CPU per echo
run and ~8 % of PostgreSQL's (`bench/run_cpu.py`, docs/benchmarks.md). Here the connection sends
the `SET` before a hot statement and the `RESET` before the next statement with parameters that
is not one, only when the session's setting is not already the one needed (in the same pipeline,
one round trip): a worker's connections, which run little else, keep it set. A statement without
parameters has no plan to choose and changes nothing. A `SET` is transactional, so after a
rollback (of a transaction, to a savepoint, or of a pipeline's implicit transaction when a
statement failed) the connection no longer knows the setting and sends it again before the next
statement that needs one or the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import pq
from psycopg.abc import PQGen

_IDLE = pq.TransactionStatus.IDLE
_GENERIC_PLANS = b"SET plan_cache_mode = force_generic_plan"
_SERVER_PLANS = b"RESET plan_cache_mode"


class _FirstErrorPipeline(psycopg.Pipeline):
    """psycopg's pipeline, whose exit raises the error of the statement that failed, never the
    `pipeline aborted` of one the server skipped behind it. psycopg sends the Sync and reads
    what has come back, then reads the rest in a `finally`: when the failed statement's error
    came back before the statements queued behind it had even been sent (a COMMIT or a plan
    mode queued as a command of the connection's own, which sends nothing until the Sync),
    the skipped one's `pipeline aborted` replaced the error, and a run's end that lost its
    lease, say, was reported as a broken pipeline instead (tests/test_lazy_begin.py)."""

    def _exit_gen(self) -> PQGen[None]:
        try:
            self._enqueue_sync()
            yield from self._communicate_gen()
        except BaseException:
            # What the server skipped because of the error raised says nothing more.
            with suppress(psycopg.errors.PipelineAborted):
                yield from self._fetch_gen(flush=True)
            raise
        yield from self._fetch_gen(flush=True)


class LazyBeginConnection(psycopg.Connection[Any]):
    """A psycopg connection whose transactions begin with their first statement."""

    begin_pending = False
    # The transaction was committed with its last statement (`queue_commit`); Django has not
    # ended it yet (runsite/postgres/base.py clears this when it does).
    committed_early = False
    # The session's `plan_cache_mode` as far as this connection knows: False (the server's own
    # choice, as at connect), True (force_generic_plan), None (unknown: rolled back since).
    generic_plans: bool | None = False
    # What the statement being started needs: True for a hot one (`generic_plans_only`), False
    # for another with parameters (`FirstStatementWithBegin`), None for one without (no plan).
    plans_wanted: bool | None = None

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
        else:
            yield from super()._start_query()
        wanted = self.plans_wanted
        if wanted is not None and wanted is not self.generic_plans:
            # In a transaction just begun, after its BEGIN: rolled back with it.
            self.generic_plans = wanted
            yield from self._exec_command(_GENERIC_PLANS if wanted else _SERVER_PLANS)

    def plans_due(self) -> bool:
        """Whether the statement about to start needs the plan mode sent first."""
        wanted = self.plans_wanted
        return wanted is not None and wanted is not self.generic_plans

    @contextmanager
    def generic_plans_only(self) -> Iterator[None]:
        """Statements started in the block (hot ones: runs/rows.py) run with `plan_cache_mode =
        force_generic_plan`; the connection sends it before the first of them unless the
        session has it already, and leaves it set after the block."""
        previous = self.plans_wanted
        self.plans_wanted = True
        try:
            yield
        finally:
            self.plans_wanted = previous

    def wait(self, gen: PQGen[Any], *args: Any, **kwargs: Any) -> Any:
        # Every statement, pipeline Sync, COMMIT and ROLLBACK goes through here: one that
        # failed rolled back the transaction it was in, with any SET sent in it.
        try:
            return super().wait(gen, *args, **kwargs)
        except BaseException:
            self.generic_plans = None
            raise

    def rollback(self) -> None:
        self.generic_plans = None  # undone with the transaction, if sent in it
        super().rollback()

    @contextmanager
    def pipeline(self) -> Iterator[psycopg.Pipeline]:
        # psycopg's own, with `_FirstErrorPipeline` (pinned in requirements.txt).
        with self.lock:
            self._check_connection_ok()
            if (pipeline := self._pipeline) is None:
                pipeline = self._pipeline = _FirstErrorPipeline(self)
        try:
            with pipeline:
                yield pipeline
        finally:
            if pipeline.level == 0:
                with self.lock:
                    assert pipeline is self._pipeline
                    self._pipeline = None

    def queue_commit(self) -> None:
        """Queue the transaction's COMMIT in the open pipeline, behind its last statement: both
        are sent at the pipeline's Sync, in one round trip. A statement before it that fails
        aborts the pipeline, and the COMMIT is not run (the transaction is left for Django's
        rollback); a COMMIT that fails (a deferred constraint) raises at the Sync, with the
        transaction rolled back."""
        if self._pipeline is None:
            raise psycopg.ProgrammingError("queue_commit() needs an open pipeline")
        self.wait(self._exec_command(b"COMMIT"))  # queued: its result is checked at the Sync
        self.committed_early = True


class FirstStatementWithBegin:
    """Cursor mixin: a statement that opens the transaction travels in one pipeline with its
    BEGIN; results, errors and `rowcount` are there when `execute` returns, as without it."""

    _conn: Any

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        conn = self._conn
        if not isinstance(conn, LazyBeginConnection):
            return super().execute(query, params, **kwargs)  # type: ignore[misc]
        previous = conn.plans_wanted
        # A statement with parameters needs the server's plan choice, but in a hot block; one
        # without has no plan to choose and changes nothing.
        conn.plans_wanted = (previous or False) if params else None
        try:
            # Only a statement with parameters goes in a pipeline: it goes by the extended
            # protocol anyway; one without may hold several statements (a migration's SQL),
            # which only the simple protocol takes.
            if params and conn._pipeline is None and (conn.begin_pending or conn.plans_due()):
                with conn.pipeline():
                    super().execute(query, params, **kwargs)  # type: ignore[misc]
                return self
            return super().execute(query, params, **kwargs)  # type: ignore[misc]
        finally:
            conn.plans_wanted = previous


class ServerBindingCursor(FirstStatementWithBegin, base.ServerBindingCursor):
    pass
