"""Ending a run the worker holds: success, error, timeout, retry, acknowledged cancel."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Exists

from runs.contracts import (
    Event,
    FenceResult,
    HeldWrites,
    JSONObject,
    JSONValue,
    Lease,
    StepWrite,
    step_event,
)
from runs.exceptions import RunCancelled
from runs.models import (
    ACTIVE_STATUSES,
    CancelAction,
    Run,
    RunStatus,
    ThreadStatus,
)
from runs.rows import execute_last, execute_planned, insert, insert_statements, statements_together
from runs.services.cancel import _apply_cancel
from runs.services.core import (
    _UNSET,
    LEASE_CLEARED,
    QUEUE_CHANNEL,
    _append_events,
    _clear_lease,
    _complete_lease,
    _fence,
    _insert_events,
    _is_postgres,
    _latest_thread_values,
    _lease_lost,
    _lock_thread,
    _notify,
    _now,
    _publish,
    _publish_fenced,
    _refresh_thread,
    _thread_has_run_in,
    _thread_status_sql,
    _Unset,
    _validate_choice,
    logger,
    stateless_expiry,
)
from runs.services.notifications import _announce, _rules_of_run
from runs.services.search import (
    DocumentSource,
    calls_source_sql,
    search_refresh,
    source_columns,
    source_of,
)
from runs.services.steps import (
    _new_tool_calls,
    _outcome_statement,
    _record_outcome,
    _record_outcome_after_cancel,
    _write_steps,
)


def run_finish(
    *,
    lease: Lease,
    status: str,
    output: JSONValue = None,
    error: JSONObject | None = None,
    values: JSONObject | _Unset | None = _UNSET,
    steps: Sequence[StepWrite] = (),
    events: Sequence[Event] = (),
    held: HeldWrites | None = None,
    source: DocumentSource | None = None,
) -> FenceResult:
    """End a run the worker holds (success, error or timeout), with its last steps, in one go;
    `held`: writes the step loop skipped (`HeldWrites`), made first; `source`: what the run's
    search document is made of as the worker holds it (`search.source_in_hand`), which lets a
    success end in one round trip (`_end_at_once`).

    The common path (an agent that answers at once) is a single transaction: lock the thread,
    one fenced UPDATE that also ends the run, bulk inserts, and the thread's new status.
    """
    held = held or HeldWrites()
    try:
        return _finish(lease, status, output, error, values, steps, events, held, source)
    except RunCancelled as stop:
        if held.outcome is not None and not stop.deleted:
            _record_outcome_after_cancel(lease, held.outcome)
        raise


def _finish(
    lease: Lease,
    status: str,
    output: JSONValue,
    error: JSONObject | None,
    values: JSONObject | _Unset | None,
    steps: Sequence[StepWrite],
    events: Sequence[Event],
    held: HeldWrites,
    source: DocumentSource | None = None,
) -> FenceResult:
    _validate_choice(status, (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.TIMEOUT), "status")
    finished: dict[str, object] = {"status": status}
    if output is not None:
        finished["output"] = output
    if error is not None:
        finished["error"] = error
    all_events = [
        *held.events,
        *events,
        *(step_event(w) for w in steps),
        ("finished", finished, "system"),
    ]
    lease = _complete_lease(lease)
    # Twins: on PostgreSQL a success ends in one statement (_FINISH_SQL_POSTGRES, below); every
    # other end, and SQLite, takes the ORM path that follows. Change one, change the other.
    if (
        _is_postgres()
        and status == RunStatus.SUCCESS
        and lease.parent_run_id is None
        and lease.thread_id is not None
    ):
        if values is _UNSET:
            values = steps[-1].values if steps else _latest_thread_values(lease.thread_id)
        return _finish_success_postgres(lease, output, values, steps, all_events, held, source)
    with transaction.atomic():
        _lock_thread(lease.thread_id)
        now = _now()
        fence = _fence(
            lease,
            events=len(all_events),
            status=status,
            output=output,
            error=error,
            finished_at=now,
            **LEASE_CLEARED,
        )
        _write_steps(lease, [*held.steps, *steps])
        if held.outcome is not None:
            _record_outcome(held.outcome)
        insert(_new_tool_calls(lease, held.steps, held.tool_calls))
        _insert_events(lease.run_id, fence.last_seq, all_events)
        search_refresh(run_ids=[lease.run_id])
        if status != RunStatus.SUCCESS:
            _fail_children(lease.run_id, status)
        if lease.parent_run_id is None and lease.thread_id is not None:
            if values is _UNSET:
                values = steps[-1].values if steps else _latest_thread_values(lease.thread_id)
            _refresh_thread(lease.thread_id, values=values, finished_status=status)
        _announce(lease.run_id, status)
        _publish_fenced(lease, fence.last_seq, status=status, outcome=_success_body(status, steps))
    return fence


# Twin of run_finish's ORM path above (fence, end the run, steps, events, thread status).
_OTHERS = " AND o.id <> %(run)s"  # the run's own row still reads `running` in the snapshot
_FINISH_SQL = """
WITH f AS (
    UPDATE runs_run
       SET status = 'success', output = %(output)s::jsonb, error = NULL, finished_at = %(now)s,
           lease_owner = NULL, lease_expires_at = NULL, deadline_at = NULL, updated_at = %(now)s,
           last_seq = last_seq + %(n_events)s
     WHERE id = %(run)s AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND status = 'running'{guard}
    RETURNING last_seq, cancel_action
), steps AS (
    INSERT INTO runs_checkpoint (id, thread_id, run_id, parent_id, step, values, pending, created_at)
    SELECT x.id, %(thread)s, %(run)s, x.parent_id, x.step, x.values, x.pending, %(now)s
      FROM f, jsonb_to_recordset(%(steps)s::jsonb)
           AS x(id uuid, parent_id uuid, step integer, values jsonb, pending jsonb)
), events AS (
    INSERT INTO runs_runevent (run_id, seq, kind, data, actor, created_at)
    SELECT %(run)s, f.last_seq - %(n_events)s + x.n, x.kind, x.data, x.actor, %(now)s
      FROM f, ROWS FROM (jsonb_to_recordset(%(events)s::jsonb) AS (kind text, data jsonb, actor text))
           WITH ORDINALITY AS x(kind, data, actor, n)
), doc AS (
    INSERT INTO runs_runsearch (run_id, document) SELECT %(run)s, %(document)s FROM f
    ON CONFLICT (run_id) DO UPDATE SET document = EXCLUDED.document
), thread AS (
    -- The run's own row still reads `running` in this statement's snapshot: leave it out.
    UPDATE runs_thread
       SET status = {status},
           values = %(values)s::jsonb, updated_at = %(now)s,
           -- A stateless run's thread expires once nothing on it is in flight (as
           -- core._expires_sql, whose time parameter is positional).
           expires_at = CASE
             WHEN runs_thread.delete_when_done AND runs_thread.expires_at IS NULL
                  AND NOT {active}
             THEN %(expires)s ELSE runs_thread.expires_at END
     WHERE id = %(thread)s AND EXISTS (SELECT 1 FROM f)
)
{last}
"""
_FINISH_PARTS = {
    # core's rules, with the run that ends here left out (it just succeeded: idle otherwise).
    "status": _thread_status_sql(f"'{ThreadStatus.IDLE}'", besides=_OTHERS),
    "active": _thread_has_run_in("runs_thread.id", ACTIVE_STATUSES, besides=_OTHERS),
}
# A lost lease: no row.
_FINISH_SQL_POSTGRES = _FINISH_SQL.format(
    last="SELECT last_seq, cancel_action FROM f", guard="", **_FINISH_PARTS
)
# `_end_at_once`'s end: the run's document built from what its worker holds, written only if
# that is what the run's document is made of now (the thread's metadata and the run's calls as
# `search.source_columns` reads them; its input never changes, its output and error are this
# end's) and the end has no deliveries to write (no webhook, no rule for its agent); otherwise
# no row, and nothing written.
_AT_ONCE_GUARD = """
       AND webhook = '' AND NOT EXISTS (
           SELECT 1 FROM runs_notificationrule n
            WHERE n.agent_id = runs_run.agent_id AND n.active)
       AND (SELECT t.metadata FROM runs_thread t WHERE t.id = %(thread)s)
           IS NOT DISTINCT FROM %(metadata)s::jsonb
       AND {calls} = %(calls)s::jsonb""".format(calls=calls_source_sql("%(run)s"))
_FINISH_AT_ONCE_SQL_POSTGRES = _FINISH_SQL.format(
    last="SELECT last_seq, cancel_action FROM f", guard=_AT_ONCE_GUARD, **_FINISH_PARTS
)
# ...behind held writes: it fails instead (as `_FINISH_SQL_POSTGRES_OR_FAIL`), so that they roll
# back with it.
_FINISH_AT_ONCE_SQL_POSTGRES_OR_FAIL = _FINISH_SQL.format(
    last="SELECT (SELECT last_seq FROM f), (SELECT cancel_action FROM f),"
    " runs_lease_held((SELECT count(*) FROM f))",
    guard=_AT_ONCE_GUARD,
    **_FINISH_PARTS,
)
# Its first statement, in the same round trip: the thread locked before the run (the order
# every writer takes them in), so that the end's statement, whose snapshot follows it, reads
# what the thread holds now.
_LOCK_THREAD_SQL = "SELECT 1 FROM runs_thread WHERE id = %s FOR NO KEY UPDATE"
# A lost lease: the statement fails (runs_lease_held, migration 0015), and so does everything
# queued behind it, its COMMIT too. The end with held writes: they, this and the COMMIT go in
# one round trip, and a lost lease rolls them back.
_FINISH_SQL_POSTGRES_OR_FAIL = _FINISH_SQL.format(
    last="SELECT (SELECT last_seq FROM f), (SELECT cancel_action FROM f),"
    " runs_lease_held((SELECT count(*) FROM f))",
    guard="",
    **_FINISH_PARTS,
)
# The SQLSTATE runs_lease_held raises.
LEASE_LOST_SQLSTATE = "RSL01"


# The thread locked (the end takes it: thread, then run), what the run's document is made of and
# whether its end has deliveries to write (its webhook, or a rule for its agent) read, in one
# statement; the run's row itself is locked by the end's fenced UPDATE.
_LOCK_THREAD_READ_SOURCE = """
SELECT {source}, r.webhook <> '' OR EXISTS (
       SELECT 1 FROM runs_notificationrule n WHERE n.agent_id = r.agent_id AND n.active)
  FROM runs_thread t JOIN runs_run r ON r.thread_id = t.id
 WHERE t.id = %s AND r.id = %s
   FOR NO KEY UPDATE OF t
"""


_Param = UUID | str | int | datetime | None


def _finish_success_postgres(
    lease: Lease,
    output: JSONValue,
    values: JSONObject | None,
    steps: Sequence[StepWrite],
    all_events: Sequence[Event],
    held: HeldWrites,
    source: DocumentSource | None = None,
) -> FenceResult:
    """The common end of a run in two round trips: lock the thread (reading what the run's
    search document is made of), then one statement that fences and ends the run, writes its
    last steps, events and document, and updates the thread, with its COMMIT. Held calls and a
    held outcome are one statement more, sent in that second round trip before the end's, which
    then fails on a lost lease (raised as `_lease_lost`), so that they roll back. With the
    document's source in hand, in one round trip first (`_end_at_once`)."""
    now = _now()
    params: dict[str, _Param] = {
        "run": lease.run_id,
        "owner": lease.owner,
        "attempt": lease.attempt,
        "thread": lease.thread_id,
        "now": now,
        "expires": stateless_expiry(now),
        "output": None if output is None else json.dumps(output, allow_nan=False),
        "values": json.dumps(values, allow_nan=False),
        "n_events": len(all_events),
        "steps": json.dumps(
            [
                {
                    "id": str(w.id),
                    "parent_id": str(w.parent_id) if w.parent_id else None,
                    "step": w.step,
                    "values": w.values,
                    "pending": w.pending,
                }
                for w in [*held.steps, *steps]
            ],
            allow_nan=False,
        ),
        "events": json.dumps(
            [{"kind": k, "data": d, "actor": a} for k, d, a in all_events], allow_nan=False
        ),
    }
    if source is not None:
        done = _end_at_once(lease, output, params, source, steps, held)
        if done is not None:
            return done
    try:
        with transaction.atomic():
            ended = _end_in_transaction(lease, output, params, held)
            if ended is not None:
                row, announce = ended
                if announce:
                    _announce(lease.run_id, RunStatus.SUCCESS)
                outcome = _success_body(RunStatus.SUCCESS, steps)
                _publish_fenced(lease, row[0], status=RunStatus.SUCCESS, outcome=outcome)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LEASE_LOST_SQLSTATE:
            raise _lease_lost(lease) from None  # (the held writes rolled back)
        raise
    if ended is None:
        # Asked after the transaction: its COMMIT may have gone with the end's statement, and
        # nothing may run in it after that.
        raise _lease_lost(lease)
    return FenceResult(last_seq=row[0], cancel_action=row[1])


def _end_at_once(
    lease: Lease,
    output: JSONValue,
    params: dict[str, _Param],
    source: DocumentSource,
    steps: Sequence[StepWrite],
    held: HeldWrites,
) -> FenceResult | None:
    """`_finish_success_postgres` in one round trip: BEGIN, the thread's lock, the held writes,
    the end with the run's document built from `source` instead of read under the lock first,
    and COMMIT. None when the end must take the two round trips: its document's source is not
    what the worker holds (the thread's metadata changed while the run ran), it has deliveries
    to write, or its lease is lost (which the two round trips raise), or what the worker holds
    is not plain JSON (a tool's result as it returned it: the database holds it as its encoder
    wrote it). Nothing was written then: behind held writes the end fails rather than match no
    row, and they roll back with it."""
    held_writes = _held_calls_statements(lease, held, source)
    source.ended(output=output)
    metadata = source.thread_metadata
    try:
        at_once = {
            **params,
            "document": source.document(),
            "metadata": None if metadata is None else json.dumps(metadata, allow_nan=False),
            "calls": json.dumps(source.calls, allow_nan=False),
        }
    except (TypeError, ValueError):
        return None
    end = _FINISH_AT_ONCE_SQL_POSTGRES_OR_FAIL if held_writes else _FINISH_AT_ONCE_SQL_POSTGRES
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                execute_last(
                    connection,
                    cursor,
                    end,
                    at_once,
                    before=[(_LOCK_THREAD_SQL, [lease.thread_id]), *held_writes],
                )
                row = cursor.fetchone()
            if row is None:
                return None
            outcome = _success_body(RunStatus.SUCCESS, steps)
            _publish_fenced(lease, row[0], status=RunStatus.SUCCESS, outcome=outcome)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == LEASE_LOST_SQLSTATE:
            return None  # (the held writes rolled back)
        raise
    return FenceResult(last_seq=row[0], cancel_action=row[1])


def _end_in_transaction(
    lease: Lease, output: JSONValue, params: dict[str, _Param], held: HeldWrites
) -> tuple[tuple[int, str | None], bool] | None:
    """`_finish_success_postgres`'s statements: the end's row (last_seq, cancel_action) and
    whether it has deliveries to announce; None when the run is gone or its lease lost (nothing
    was written)."""
    with connection.cursor() as cursor:
        execute_planned(
            cursor,
            _LOCK_THREAD_READ_SOURCE.format(source=source_columns("r")),
            [lease.thread_id, lease.run_id],
        )
        found = cursor.fetchone()
        if found is None:  # the run was deleted (with its thread or by a rollback)
            return None
        *source_values, announce = found
        source = source_of(lease.run_id, source_values)
        held_writes = _held_calls_statements(lease, held, source)
        source.ended(output=output)
        params["document"] = source.document()
        # With held writes the end fails on a lost lease (their rollback); without, it finds
        # no row, and wrote nothing.
        end = _FINISH_SQL_POSTGRES_OR_FAIL if held_writes else _FINISH_SQL_POSTGRES
        if announce:
            # Its deliveries are written after it, in its transaction.
            for sql, write_params in held_writes:
                execute_planned(cursor, sql, write_params)
            execute_planned(cursor, end, params)
        else:
            # The transaction's last statement, its COMMIT with it, and the held writes in the
            # same round trip (rows.execute_last).
            execute_last(connection, cursor, end, params, before=held_writes)
        row = cursor.fetchone()
    if row is None:
        return None
    return (row[0], row[1]), announce


def _success_body(status: str, steps: Sequence[StepWrite]) -> JSONObject | None:
    """A run's wait/join body when it succeeds with these last steps: its newest checkpoint's
    values (`selectors.run_outcome`); None when it writes none (read back instead)."""
    return steps[-1].values if status == RunStatus.SUCCESS and steps else None


def _held_calls_statements(
    lease: Lease, held: HeldWrites, source: DocumentSource
) -> list[tuple[str, list[Any]]]:
    """A held outcome and the held calls (`HeldWrites`) as statements to run before the end's
    (none when nothing is held); the run's document source follows them."""
    writes: list[tuple[str, list[Any]]] = []
    if held.outcome is not None:
        writes.append(_outcome_statement(held.outcome, source))
    created = _new_tool_calls(lease, held.steps, held.tool_calls)
    writes += insert_statements(created)
    source.calls_added(created)
    return statements_together(writes, "SELECT 1", []) if writes else []


def _fail_children(run_id: UUID, status: str) -> None:
    # Sub-agent runs still active under a failed supervisor would never be picked up again.
    for child in Run.objects.filter(parent_run_id=run_id, status__in=ACTIVE_STATUSES):
        _finish_locked(
            child,
            status=RunStatus.ERROR,
            error={"error": "ParentFailed", "message": f"supervisor run ended {status}"},
        )


def _finish_locked(
    run: Run,
    *,
    status: str,
    output: JSONValue = None,
    error: JSONObject | None = None,
    values: JSONObject | _Unset | None = _UNSET,
    kind: str = "finished",
) -> None:
    now = _now()
    run.status = status
    run.output = output
    run.error = error
    run.finished_at = now
    _clear_lease(run)
    run.save(
        update_fields=[
            "status",
            "output",
            "error",
            "finished_at",
            *LEASE_CLEARED,
            "updated_at",
        ]
    )
    data: dict[str, object] = {"status": status}
    if output is not None:
        data["output"] = output
    if error is not None:
        data["error"] = error
    run.last_seq = _append_events(run.id, [(kind, data, "system")])
    search_refresh(run_ids=[run.id])
    duration = (now - run.started_at).total_seconds() if run.started_at else 0.0
    logger.info(
        "finish run=%s agent=%s attempt=%s status=%s duration=%.3fs",
        run.id,
        run.agent_id,
        run.attempt,
        status,
        duration,
    )
    if status != RunStatus.SUCCESS:
        _fail_children(run.id, status)
    if run.parent_run_id is None and run.thread_id is not None:
        if values is _UNSET:
            values = _latest_thread_values(run.thread_id)
        _refresh_thread(run.thread_id, values=values)
    _announce(run, status)
    _publish(run)


def run_fail_attempt(*, lease: Lease, error: JSONObject) -> Run:
    """The agent raised. Retry (back to pending) while attempts remain, else end with error."""
    with transaction.atomic():
        thread_id = Run.objects.filter(id=lease.run_id).values_list("thread_id", flat=True).first()
        _lock_thread(thread_id)
        _fence(lease)
        run = Run.objects.select_for_update(no_key=True).get(id=lease.run_id)
        if run.attempt >= settings.RUNS_MAX_ATTEMPTS or run.parent_run_id is not None:
            _finish_locked(run, status=RunStatus.ERROR, error=error)
            return run
        run.status = RunStatus.PENDING
        _clear_lease(run)
        run.save(update_fields=["status", *LEASE_CLEARED, "updated_at"])
        run.last_seq = _append_events(
            run.id, [("retry", {"attempt": run.attempt, "error": error}, "system")]
        )
        logger.info(
            "retry run=%s agent=%s attempt=%s error=%s",
            run.id,
            run.agent_id,
            run.attempt,
            error.get("error"),
        )
        _notify(QUEUE_CHANNEL)
        _publish(run)
    return run


def run_acknowledge_cancel(*, lease: Lease) -> Run | None:
    """The worker stopped a run it was told was cancelled. Returns the run, or None if deleted.

    A cancel ends a running run in its own transaction, so normally there is nothing left to
    do. A request written on the row but not applied (by an older version, during an upgrade)
    is applied here, as before.
    """
    lease = _complete_lease(lease)  # a worker's lease knows its thread: no lookup
    try:
        with transaction.atomic():
            _lock_thread(lease.thread_id)
            fence = _fence(lease)
            # has_rules: whether notification rules may want this run's end (saves _announce a
            # query when none do).
            run = (
                Run.objects.select_for_update(no_key=True)
                .annotate(has_rules=Exists(_rules_of_run))
                .get(id=lease.run_id)
            )
            _apply_cancel(run, action=fence.cancel_action or CancelAction.INTERRUPT, actor=None)
            return None if fence.cancel_action == CancelAction.ROLLBACK else run
    except RunCancelled as done:
        return None if done.deleted else Run.objects.filter(id=lease.run_id).first()
