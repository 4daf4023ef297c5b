"""Cancellation: interrupt (keep the record) and rollback (delete it, the thread reverts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import DateTimeField, F, Model, QuerySet

from runs import metrics
from runs.contracts import Actor, BulkCancelResult, actor_name
from runs.exceptions import Conflict, NotFound, ValidationFailed
from runs.join_body import (
    result_after_cancel_params,
    result_after_cancel_sql,
    result_from_column,
)
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AuditEntry,
    CancelAction,
    Run,
    RunEvent,
    RunStatus,
)
from runs.rows import (
    array_param,
    insert,
    insert_arrays_statement,
    insert_statements,
    instances,
    write_together,
)
from runs.services.core import (
    _LOCK_RUN_COLUMNS,
    LATEST_VALUES,
    LEASE_CLEARED,
    _audit,
    _audit_entry,
    _check_scope,
    _clear_lease,
    _in,
    _insert_events,
    _is_postgres,
    _lock_run,
    _lock_selected_runs,
    _notices_by_select,
    _notifies_in_sql,
    _notify,
    _notify_in_process,
    _now,
    _publish,
    _refresh_thread,
    _refresh_threads_statement,
    _sql_in,
    _update_returning,
    _uuid_param,
    _validate_choice,
    _with_flags,
    logger,
)
from runs.services.notices import (
    CANCEL_CHANNEL,
    SEND_SQL,
    cancel_channel,
    cancel_channel_sql,
    cancel_notice,
    holding,
    keep,
    sent_now,
)
from runs.services.notifications import _announce


def run_cancel(
    *, run: Run, action: str, actor: Actor, reason: str = "", pinned_resource_id: str | None = None
) -> Run | None:
    """Cancel one run. Returns the run, or None once it has been rolled back (deleted).

    pending/suspended: done at once. running: the request is written on the row and the worker
    is notified; it stops before its next step or tool call (the heartbeat catches a lost
    notification). Finished runs: Conflict, nothing changes.
    """
    _validate_choice(action, CancelAction.values, "action")
    _check_scope(run, pinned_resource_id, "Run")
    with transaction.atomic():
        return _cancel_top_level(
            _lock_run(run.id, known=run), action=action, actor=actor, reason=reason
        )


class CancelAnswer:
    """Pass one to `run_cancel_on_thread` (a cancel with wait=true) for what LangGraph's join
    answers for the run once the cancel is committed (`selectors.run_result`): `result`, when
    `read`. The cancel's own statement reads it where it can (`join_body`: a run without
    sub-agent runs in flight); otherwise the caller reads it after the commit."""

    __slots__ = ("read", "result")

    def __init__(self) -> None:
        self.read = False
        self.result: Any = None


def run_cancel_on_thread(
    *,
    thread_id: UUID,
    run_id: UUID,
    action: str,
    actor: Actor,
    reason: str = "",
    pinned_resource_id: str | None = None,
    answer: CancelAnswer | None = None,
) -> Run | None:
    """`run_cancel` of a run named by its thread and id, as LangGraph's cancel path names it,
    without reading it first: the lock finds it on that thread, in the key's scope, or answers
    NotFound (`run_not_found`) having changed nothing. Returns what `run_cancel` returns;
    `answer`, when given, holds the run's join body after it (see CancelAnswer)."""
    _validate_choice(action, CancelAction.values, "action")
    if _is_postgres():
        done, result = _cancel_at_once(
            run_id,
            thread_id,
            action=action,
            actor=actor,
            reason=reason,
            pinned_resource_id=pinned_resource_id,
            answer=answer,
        )
        if done:
            return result
    with transaction.atomic():
        locked = _lock_run(run_id, on_thread=thread_id, pinned_resource_id=pinned_resource_id)
        return _cancel_top_level(locked, action=action, actor=actor, reason=reason, answer=answer)


def _cancel_top_level(
    run: Run, *, action: str, actor: Actor, reason: str, answer: CancelAnswer | None = None
) -> Run | None:
    _refuse_sub_agent_run(run)
    return _cancel_locked(run, action=action, actor=actor, reason=reason, answer=answer)


def _refuse_sub_agent_run(run: Run) -> None:
    if run.parent_run_id is not None:
        raise Conflict(
            f"Run {run.id} is a sub-agent run; cancel its supervisor run "
            f"{run.parent_run_id} instead",
            code="sub_agent_run",
        )


def _refuse_finished_run(run: Run) -> None:
    if run.status in TERMINAL_STATUSES:
        raise Conflict(
            f"Run {run.id} is already {run.status}; only pending, running or suspended runs "
            "can be cancelled",
            code="run_not_active",
            extra={"status": run.status},
        )


def _cancel_locked(
    run: Run,
    *,
    action: str,
    actor: Actor,
    reason: str = "",
    via: str = "",
    answer: CancelAnswer | None = None,
) -> Run | None:
    transaction.on_commit(lambda: metrics.CANCELS.labels(action).inc())
    _refuse_finished_run(run)
    audit = _audit_entry(
        actor=actor,
        action=f"cancel_{action}",
        run=run,
        reason=reason,
        before={"status": run.status},
        after={
            "status": "deleted" if action == CancelAction.ROLLBACK else RunStatus.INTERRUPTED,
            **({"via": via} if via else {}),
        },
    )
    # The cancel ends a running run here, in this transaction: its lease is cleared, so the
    # worker's next fenced write is refused (RunCancelled) and it stops; told at commit (NOTIFY
    # / in process) it stops at once. A tool then still executing has its outcome recorded
    # (`steps.tool_call_update`), nothing else it would write is kept.
    tell_worker = run.status == RunStatus.RUNNING
    if getattr(run, "has_children", True) is False:  # read by _lock_run: none in flight
        return _cancel_together(
            run,
            action=action,
            actor=actor,
            reason=reason,
            audit=audit,
            tell_worker=tell_worker,
            answer=answer,
        )
    insert([audit])
    if tell_worker:
        _notify(cancel_channel(run.lease_owner), cancel_notice(run.id, action))
    return _apply_cancel(run, action=action, actor=actor, reason=reason)


_INTERRUPT_SQL = (
    "UPDATE runs_run SET status = %s, finished_at = %s, cancel_action = %s,"
    " cancel_requested_at = %s, cancel_reason = %s, updated_at = %s, last_seq = %s,"
    " lease_owner = NULL, lease_expires_at = NULL, deadline_at = NULL WHERE id = %s"
)


def _cancel_together(
    run: Run,
    *,
    action: str,
    actor: Actor,
    reason: str,
    audit: AuditEntry,
    tell_worker: bool,
    answer: CancelAnswer | None = None,
) -> Run | None:
    """`_apply_cancel` of a run without sub-agent runs in flight, locked and read under the lock
    (its `last_seq` is the one to follow): the run's end or deletion, its event, the audit
    entry, the thread's status and values and the worker's notice in one statement on
    PostgreSQL (`rows.write_together`; eight statements through `_apply_cancel`). `answer`:
    the statement also reads the run's join body (a top-level run on a thread, whose thread
    this statement refreshes)."""
    notices = _cancel_notices([(run.id, run.lease_owner)], action) if tell_worker else []
    told, select_params = _notices_by_select(notices)
    deleted = action == CancelAction.ROLLBACK
    answering = answer is not None and run.thread_id is not None and run.parent_run_id is None
    if answering:
        # First, so that the row's first column is the answer whatever else is selected.
        told = [result_after_cancel_sql(deleted=deleted), *told]
        select_params = [
            *result_after_cancel_params(run.id, run.thread_id, deleted=deleted),
            *select_params,
        ]
    select = f"SELECT {', '.join(told) or '1'}"
    result: Run | None
    if action == CancelAction.ROLLBACK:
        logger.info(
            "cancel run=%s agent=%s action=rollback attempt=%s", run.id, run.agent_id, run.attempt
        )
        writes = [("DELETE FROM runs_run WHERE id = %s", [_uuid_param(run.id)])]
        writes += insert_statements([audit])
        if run.thread_id is not None:
            # Runs on a thread execute one at a time, so its newest checkpoint once this run's
            # are gone is the state from before it.
            writes.append(
                _refresh_threads_statement(
                    [run.thread_id], values=LATEST_VALUES, ending=[run.id], deleting=True
                )
            )
        row = write_together(writes, select, select_params, connection.alias)
        _publish(run, status="deleted", seq=run.last_seq + 1)
        result = None
    else:
        now = _interrupted(run, reason)
        run.last_seq += 1
        db_time = DateTimeField().get_db_prep_value
        update = [
            run.status,
            db_time(now, connection),
            run.cancel_action,
            db_time(run.cancel_requested_at, connection),
            run.cancel_reason,
            db_time(now, connection),
            run.last_seq,
            _uuid_param(run.id),
        ]
        event = RunEvent(
            run_id=run.id,
            seq=run.last_seq,
            kind="cancelled",
            data={"action": "interrupt", "reason": run.cancel_reason},
            actor=actor_name(actor),
        )
        writes = [(_INTERRUPT_SQL, update), *insert_statements([event])]
        writes += insert_statements([audit])
        if run.parent_run_id is None and run.thread_id is not None:
            # It just ended: the thread's last finished run (idle unless another is in flight).
            writes.append(
                _refresh_threads_statement(
                    [run.thread_id],
                    values=LATEST_VALUES,
                    finished_status=RunStatus.INTERRUPTED,
                    ending=[run.id],
                )
            )
        row = write_together(writes, select, select_params, connection.alias)
        logger.info(
            "cancel run=%s agent=%s action=interrupt attempt=%s", run.id, run.agent_id, run.attempt
        )
        _announce(run, RunStatus.INTERRUPTED)
        _publish(run)
        result = run
    if answering and answer is not None and row is not None:
        answer.read, answer.result = True, result_from_column(row[0])
    return result


# The statement of `_cancel_at_once`, up to its writes: the thread's lock, the run's (read as
# `_lock_run` reads it), and `ok`, the run if this statement may cancel it. A statement's
# snapshot is taken before it waits for a lock: a transaction that committed a change to the
# run or its thread meanwhile (a worker's step, a new run queued on the thread) is seen in the
# locked rows but not by the statement's reads (the thread's status and values, the answer).
# Each row's version (`xmin`) as locked is compared with the one the snapshot sees: unequal,
# nothing is written, and the cancel takes the full path, whose reads follow its locks.
_CANCEL_AT_ONCE_HEAD = (
    "WITH t AS MATERIALIZED (SELECT id, xmin AS row_version FROM runs_thread WHERE id = %s"
    " FOR NO KEY UPDATE),"
    " l AS MATERIALIZED ("
    + _LOCK_RUN_COLUMNS.replace("SELECT r.*,", "SELECT r.*, r.xmin AS row_version,", 1).replace(
        "r.id = %s", "r.id = %s AND r.thread_id = %s{scope}"
    )
    + " AND EXISTS (SELECT 1 FROM t) FOR NO KEY UPDATE OF r),"
    f" ok AS MATERIALIZED (SELECT * FROM l WHERE l.status IN {_sql_in(ACTIVE_STATUSES)}"
    " AND l.parent_run_id IS NULL AND NOT l.has_children AND NOT l.has_rules"
    " AND l.webhook = ''"
    " AND l.row_version = (SELECT s.xmin FROM runs_run s WHERE s.id = l.id)"
    " AND (SELECT t.row_version FROM t)"
    " = (SELECT s.xmin FROM runs_thread s WHERE s.id = l.thread_id))"
)
# A run's cancel reason as `_interrupted` sets it: the one asked for first, else this one.
_REASON_SQL = "COALESCE(NULLIF(ok.cancel_reason, ''), %s)"


def _cancel_at_once(
    run_id: UUID,
    thread_id: UUID,
    *,
    action: str,
    actor: Actor,
    reason: str,
    pinned_resource_id: str | None,
    answer: CancelAnswer | None,
) -> tuple[bool, Run | None]:
    """`run_cancel_on_thread` as one statement on PostgreSQL, for a top-level run without
    sub-agent runs in flight, notification rules or a webhook: both locks, the checks, the
    writes of `_cancel_together` (the run's end or deletion, its event, the audit entry, the
    thread's status and values), the worker's notice and the answer, in one round trip that
    commits alone (BEGIN, the locking read, the write and COMMIT were four).

    Returns (True, what `run_cancel` returns), or raises what the full path raises (NotFound,
    Conflict); (False, None) when the full path must do it (the run is of another kind, or a
    transaction changed its row or its thread's while the statement waited for their locks,
    see `_CANCEL_AT_ONCE_HEAD`): nothing was written then, and no lock is kept outside a
    transaction."""
    deleted = action == CancelAction.ROLLBACK
    now = _now()
    at = DateTimeField().get_db_prep_value(now, connection)
    params: list[Any] = [_uuid_param(thread_id), _uuid_param(run_id), _uuid_param(thread_id)]
    if pinned_resource_id is not None:
        params.append(pinned_resource_id)
    head = _CANCEL_AT_ONCE_HEAD.replace(
        "{scope}", " AND r.resource_id = %s" if pinned_resource_id is not None else ""
    )
    writes: list[tuple[str, list[Any]]] = []
    if deleted:
        writes.append(("DELETE FROM runs_run USING ok WHERE runs_run.id = ok.id", []))
        thread_sql, thread_params = _refresh_threads_statement(
            [thread_id], values=LATEST_VALUES, ending=[run_id], deleting=True
        )
    else:
        writes.append(
            (
                "UPDATE runs_run SET status = %s, finished_at = %s, cancel_action = %s,"
                " cancel_requested_at = COALESCE(ok.cancel_requested_at, %s),"
                f" cancel_reason = {_REASON_SQL}, updated_at = %s, last_seq = ok.last_seq + 1,"
                " lease_owner = NULL, lease_expires_at = NULL, deadline_at = NULL"
                " FROM ok WHERE runs_run.id = ok.id",
                [RunStatus.INTERRUPTED, at, CancelAction.INTERRUPT, at, reason, at],
            )
        )
        writes.append(
            (
                "INSERT INTO runs_runevent (run_id, seq, kind, data, actor, created_at)"
                " SELECT ok.id, ok.last_seq + 1, 'cancelled',"
                f" jsonb_build_object('action', 'interrupt', 'reason', {_REASON_SQL}), %s, %s"
                " FROM ok",
                [reason, actor_name(actor), at],
            )
        )
        thread_sql, thread_params = _refresh_threads_statement(
            [thread_id],
            values=LATEST_VALUES,
            finished_status=RunStatus.INTERRUPTED,
            ending=[run_id],
        )
    after = {"status": "deleted" if deleted else RunStatus.INTERRUPTED}
    writes.append(
        (
            "INSERT INTO runs_auditentry (actor, action, run_id, thread_id, agent_id,"
            " resource_id, tool_call_id, reason, before, after, created_at)"
            " SELECT %s, %s, ok.id, ok.thread_id, ok.agent_id, ok.resource_id, '', %s,"
            " jsonb_build_object('status', ok.status), %s, %s FROM ok",
            [
                actor_name(actor),
                f"cancel_{action}",
                reason,
                AuditEntry._meta.get_field("after").get_db_prep_save(after, connection),
                at,
            ],
        )
    )
    writes.append((f"{thread_sql} AND EXISTS (SELECT 1 FROM ok)", thread_params))
    select = ["l.*", "ok.id IS NOT NULL AS cancelled"]
    if answer is not None:
        select.append(f"{result_after_cancel_sql(deleted=deleted)} AS answer")
        params_after = result_after_cancel_params(run_id, thread_id, deleted=deleted)
    else:
        params_after = []
    notice = cancel_notice(run_id, action)
    # The worker's notice in the statement, unless this thread holds its cancel notices for
    # after its answer (services/notices.py): then from the row read, below.
    told_after = holding()
    if _notifies_in_sql() and not told_after:
        select.append(
            f"CASE WHEN ok.status = '{RunStatus.RUNNING}'"
            f" THEN pg_notify({cancel_channel_sql('ok.lease_owner')}, %s) END AS told"
        )
        params_after.append(notice)
    parts = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(writes))
    statement = f"{head}, {parts} SELECT {', '.join(select)} FROM l LEFT JOIN ok ON true"
    params += [p for _, write_params in writes for p in write_params] + params_after
    found = _with_flags(instances(Run, statement, params, long=True))
    if not found:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    run = found[0]
    if not run.cancelled:  # type: ignore[attr-defined]
        _refuse_sub_agent_run(run)
        _refuse_finished_run(run)
        return False, None
    transaction.on_commit(lambda: metrics.CANCELS.labels(action).inc())
    if run.status == RunStatus.RUNNING:
        _notify_in_process(CANCEL_CHANNEL, notice)
        if _notifies_in_sql() and told_after:
            keep([(cancel_channel(run.lease_owner), notice)])
    result: Run | None
    if deleted:
        logger.info(
            "cancel run=%s agent=%s action=rollback attempt=%s", run.id, run.agent_id, run.attempt
        )
        _publish(run, status="deleted", seq=run.last_seq + 1)
        result = None
    else:
        _interrupted(run, reason, now)
        run.last_seq += 1
        logger.info(
            "cancel run=%s agent=%s action=interrupt attempt=%s", run.id, run.agent_id, run.attempt
        )
        _publish(run)
        result = run
    if answer is not None:
        answer.read, answer.result = True, result_from_column(run.answer)  # type: ignore[attr-defined]
    return True, result


def _interrupted(run: Run, reason: str, now: datetime | None = None) -> datetime:
    """Set the interrupted run's fields as its row is about to be written; returns the time."""
    now = now or _now()
    run.status = RunStatus.INTERRUPTED
    run.finished_at = now
    run.cancel_action = CancelAction.INTERRUPT
    run.cancel_requested_at = run.cancel_requested_at or now
    run.cancel_reason = run.cancel_reason or reason
    _clear_lease(run)
    run.updated_at = now
    return now


def _apply_cancel(run: Run, *, action: str, actor: Actor, reason: str = "") -> Run | None:
    """End a run now (caller holds thread + run locks); a worker executing it is fenced out."""
    if action == CancelAction.ROLLBACK:
        _rollback_locked(run)
        return None
    now = _interrupted(run, reason)
    # The row and the event's sequence number in one statement (the event follows).
    rows = _update_returning(
        Run.objects.filter(id=run.id),
        ["last_seq"],
        status=run.status,
        finished_at=now,
        cancel_action=run.cancel_action,
        cancel_requested_at=run.cancel_requested_at,
        cancel_reason=run.cancel_reason,
        updated_at=now,
        last_seq=F("last_seq") + 1,
        **LEASE_CLEARED,
    )
    run.last_seq = rows[0][0]
    _insert_events(
        run.id,
        run.last_seq,
        [("cancelled", {"action": "interrupt", "reason": run.cancel_reason}, actor_name(actor))],
    )
    logger.info(
        "cancel run=%s agent=%s action=interrupt attempt=%s", run.id, run.agent_id, run.attempt
    )
    for child in Run.objects.filter(parent_run=run, status__in=ACTIVE_STATUSES):
        _apply_cancel(
            child, action=CancelAction.INTERRUPT, actor=actor, reason="supervisor cancelled"
        )
    if run.parent_run_id is None and run.thread_id is not None:
        # It just ended: the thread's last finished run (idle unless another is in flight).
        _refresh_thread(run.thread_id, values=LATEST_VALUES, finished_status=RunStatus.INTERRUPTED)
    _announce(run, RunStatus.INTERRUPTED)
    _publish(run)
    return run


def _rollback_locked(run: Run) -> None:
    """Delete the run with its checkpoints, events, tool calls and sub-agent runs; revert state."""
    thread_id = run.thread_id
    logger.info(
        "cancel run=%s agent=%s action=rollback attempt=%s", run.id, run.agent_id, run.attempt
    )
    _publish(run, status="deleted", seq=run.last_seq + 1)
    Run.objects.filter(id=run.id).delete()
    if thread_id is not None:
        # Runs on a thread execute one at a time, so the newest checkpoint left is the state
        # from before this run.
        _refresh_thread(thread_id, values=LATEST_VALUES)


def runs_cancel_many(
    *,
    action: str,
    actor: Actor,
    run_ids: Sequence[UUID] | None = None,
    thread_id: UUID | None = None,
    status: str | None = None,
    pinned_resource_id: str | None = None,
    queryset: QuerySet | None = None,
    reason: str = "",
    include_suspended: bool = True,
) -> BulkCancelResult:
    """Cancel many runs: by ids (optionally on one thread), by status, or by a filtered queryset.

    `status` is pending, running, suspended or all (pending + running). By ids or queryset,
    runs waiting for a human are included unless `include_suspended=False` (the dashboard asks
    first); by thread only pending and running ones. Finished runs among the ids are skipped,
    not an error: a bulk action must not fail because one run just ended.
    """
    _validate_choice(action, CancelAction.values, "action")
    if status is not None and (run_ids is not None or thread_id is not None):
        raise ValidationFailed.field(
            "status",
            "cannot be combined with thread_id/run_ids",
            detail="When providing a 'status', 'thread_id' and 'run_ids' must be omitted",
        )
    statuses: tuple[str, ...]
    if status is not None:
        _validate_choice(status, ("pending", "running", "suspended", "all"), "status")
        # "all" is LangGraph's: pending + running. Runs waiting for a human are cancelled only
        # when asked for by name ("suspended") or by id, never swept up with everything else.
        statuses = (RunStatus.PENDING, RunStatus.RUNNING) if status == "all" else (status,)
    elif run_ids is not None or (queryset is not None and thread_id is None):
        statuses = tuple(ACTIVE_STATUSES)
    elif thread_id is not None:
        statuses = (RunStatus.PENDING, RunStatus.RUNNING)
    else:
        raise ValidationFailed.field(
            "status",
            "one of run_ids, thread_id, status is required",
            detail="Give run_ids, thread_id or status",
        )
    if not include_suspended:
        statuses = tuple(s for s in statuses if s != RunStatus.SUSPENDED)
    selected = _selection(
        queryset,
        statuses=statuses,
        run_ids=run_ids,
        thread_id=thread_id,
        pinned_resource_id=pinned_resource_id,
    )
    result = BulkCancelResult()
    with transaction.atomic():
        # Threads, then runs, each in id order (the documented order), in one statement.
        runs = _lock_selected_runs(selected)
        # All of them in a few statements whatever their number (a sweep of hundreds of
        # runaway runs must not take a round trip each).
        if action == CancelAction.ROLLBACK:
            _rollback_many(runs, actor=actor, reason=reason, ends_transaction=True)
            result.deleted.extend(r.id for r in runs)
        else:
            _interrupt_many(runs, actor=actor, reason=reason, ends_transaction=True)
            result.interrupted.extend(r.id for r in runs)
    return result


def _selection(
    queryset: QuerySet | None,
    *,
    statuses: Sequence[str],
    run_ids: Sequence[UUID] | None,
    thread_id: UUID | None,
    pinned_resource_id: str | None,
) -> QuerySet[Run] | tuple[str, list[Any]]:
    """The top-level runs in `statuses` that `runs_cancel_many` cancels, of `run_ids`, on
    `thread_id` and in the caller's scope where given: within `queryset` (the dashboard's
    filters) as a QuerySet; else, on PostgreSQL, written out by key (`_lock_selected_runs`
    plans it once per connection), its ids and statuses arrays, so that its text is the same
    whatever their number (the ORM writes a placeholder per id: a text per number of runs,
    each prepared and planned anew); else as a QuerySet."""
    if queryset is None and _is_postgres():
        where = ["parent_run_id IS NULL", "status = ANY(%s::varchar[])"]
        params: list[Any] = [list(statuses)]
        if run_ids is not None:
            where.append("id = ANY(%s::uuid[])")
            params.append(array_param(run_ids, connection.alias))
        if thread_id is not None:
            where.append("thread_id = %s")
            params.append(_uuid_param(thread_id))
        if pinned_resource_id is not None:
            where.append("resource_id = %s")
            params.append(pinned_resource_id)
        return f"SELECT id, thread_id FROM runs_run WHERE {' AND '.join(where)}", params
    qs = queryset if queryset is not None else Run.objects.all()
    qs = qs.filter(parent_run__isnull=True, status__in=statuses)
    if run_ids is not None:
        qs = qs.filter(id__in=list(run_ids))
    if thread_id is not None:
        qs = qs.filter(thread_id=thread_id)
    if pinned_resource_id is not None:
        qs = qs.filter(resource_id=pinned_resource_id)
    return qs


def bulk_cancel_planned() -> None:
    """Plan the API's bulk cancel on this connection (PostgreSQL): its locking read by status
    and by ids, and the write of each action, each run once with nothing to select or write.
    Their texts do not depend on the number of runs, so a
    connection that ran them, here or in any bulk cancel, runs the next one from its prepared
    statement and generic plan: cold, the first bulk cancel on a connection parsed and planned
    ~7 ms of statements (docs/benchmarks.md), and a bulk cancel is rare enough that each one
    met a connection that had never run it. `runsite/warmup.py` calls it as a web process
    starts. Changes nothing; elsewhere than PostgreSQL, does nothing."""
    if not _is_postgres():
        return
    nothing: dict[str, Any] = {"thread_id": None, "pinned_resource_id": None}
    # Committed, not rolled back: it wrote nothing, and psycopg deallocates every statement
    # prepared on a connection at any ROLLBACK (a transaction's or a savepoint's).
    with transaction.atomic():
        _lock_selected_runs(_selection(None, statuses=(), run_ids=None, **nothing))
        _lock_selected_runs(_selection(None, statuses=(), run_ids=(), **nothing))
        for write in (_interrupt_many_write, _rollback_many_write):
            write_together(*write([], actor="", reason=""), connection.alias)


def _bulk_cancelled(
    runs: Sequence[Run], *, action: str, actor: Actor, reason: str
) -> tuple[list[AuditEntry], tuple[str, list[Any]]]:
    """What every bulk cancel writes besides the runs: their audit entries, and the notices to
    the workers of the running ones (the SELECT of `rows.write_together`, with its params)."""
    target = "deleted" if action == CancelAction.ROLLBACK else RunStatus.INTERRUPTED
    audits = [
        _audit_entry(
            actor=actor,
            action=f"cancel_{action}",
            run=run,
            reason=reason,
            before={"status": run.status},
            after={"status": target},
        )
        for run in runs
    ]
    count = len(runs)
    transaction.on_commit(lambda: metrics.CANCELS.labels(action).inc(count))
    running = [(r.id, r.lease_owner) for r in runs if r.status == RunStatus.RUNNING]
    return audits, _told(_cancel_notices(running, action))


def _told(notices: Sequence[tuple[str, str]]) -> tuple[str, list[Any]]:
    """`_notices_by_select` as a SELECT whose text is the same whatever the number of notices."""
    for channel, payload in notices:
        _notify_in_process(channel, payload)
    if not _notifies_in_sql():
        return "SELECT 1", []
    notices = sent_now(notices)
    return SEND_SQL, [[c for c, _ in notices], [p for _, p in notices]]


def _inserted(model: type[Model], objs: Sequence[Model]) -> list[tuple[str, list[Any]]]:
    """The INSERT of `objs` for `write_together`: on PostgreSQL one statement whose text is the
    same for any number of rows (`rows.insert_arrays_statement`), elsewhere `insert_statements`'."""
    if _is_postgres():
        return [insert_arrays_statement(model, objs)]
    return insert_statements(objs)


_INTERRUPT_MANY_SQL = (
    "UPDATE runs_run SET status = %s, finished_at = %s, cancel_action = %s,"
    " cancel_requested_at = COALESCE(cancel_requested_at, %s),"
    " cancel_reason = CASE WHEN cancel_reason = '' THEN %s ELSE cancel_reason END,"
    " updated_at = %s, last_seq = last_seq + 1,"
    " lease_owner = NULL, lease_expires_at = NULL, deadline_at = NULL WHERE {runs}"
)


def _interrupt_many(
    runs: Sequence[Run], *, actor: Actor, reason: str, ends_transaction: bool = False
) -> None:
    """`_apply_cancel(action=interrupt)` for many top-level runs (locked, active) at once: the
    runs, their events and audit entries, their threads and the workers' notices in one
    statement on PostgreSQL (`rows.write_together`), whatever their number.

    `ends_transaction`: the caller runs nothing in the transaction after this; then, where no
    run has sub-agent runs in flight, notification rules or a webhook (whose cancels and
    deliveries follow the statement), its COMMIT goes in the same round trip."""
    if not runs:
        return
    write_together(
        *_interrupt_many_write(runs, actor=actor, reason=reason),
        connection.alias,
        commit=ends_transaction and not any(_writes_after_end(r) for r in runs),
    )
    if any(getattr(r, "has_children", True) for r in runs):
        for child in Run.objects.filter(
            parent_run_id__in=[r.id for r in runs], status__in=ACTIVE_STATUSES
        ):
            _apply_cancel(
                child, action=CancelAction.INTERRUPT, actor=actor, reason="supervisor cancelled"
            )
    for run in runs:
        _announce(run, RunStatus.INTERRUPTED)
        _publish(run)
    logger.info("cancel %d runs action=interrupt by=%s", len(runs), actor_name(actor))


def _interrupt_many_write(
    runs: Sequence[Run], *, actor: Actor, reason: str
) -> tuple[list[tuple[str, list[Any]]], str, list[Any]]:
    """`_interrupt_many`'s writes and select (`write_together`'s), one text for any number of
    runs on PostgreSQL; the runs' fields set as they are written."""
    audits, (told, told_params) = _bulk_cancelled(
        runs, action=CancelAction.INTERRUPT, actor=actor, reason=reason
    )
    now = _now()
    db_now = DateTimeField().get_db_prep_value(now, connection)
    name = actor_name(actor)
    for run in runs:
        _interrupted(run, reason, now)
        run.last_seq += 1  # read under the lock: the statement below adds the same one
    in_runs, run_params = _in("id", [r.id for r in runs], any_number=True)
    update = [RunStatus.INTERRUPTED, db_now, CancelAction.INTERRUPT, db_now, reason, db_now]
    events = [
        RunEvent(
            run_id=run.id,
            seq=run.last_seq,
            kind="cancelled",
            data={"action": "interrupt", "reason": run.cancel_reason},
            actor=name,
        )
        for run in runs
    ]
    writes = [
        (_INTERRUPT_MANY_SQL.format(runs=in_runs), update + run_params),
        *_inserted(RunEvent, events),
        *_inserted(AuditEntry, audits),
        *_threads_of(runs, values=LATEST_VALUES, finished_status=RunStatus.INTERRUPTED),
    ]
    return writes, told, told_params


def _writes_after_end(run: Run) -> bool:
    """Whether `_interrupt_many` writes more for this run after its statement: the cancels of
    its sub-agent runs in flight, or the deliveries of its rules and webhook (`_announce`)."""
    return (
        getattr(run, "has_children", True) is not False
        or getattr(run, "has_rules", True) is not False
        or bool(run.webhook)
    )


def _threads_of(runs: Sequence[Run], **refresh: Any) -> list[tuple[str, list[Any]]]:
    """The statement refreshing the threads of runs this statement ends: on PostgreSQL one text
    for any number, none included; elsewhere none without a thread."""
    thread_ids = sorted({r.thread_id for r in runs if r.thread_id is not None})
    if _is_postgres():
        refresh["any_number"] = True
    elif not thread_ids:
        return []
    return [_refresh_threads_statement(thread_ids, ending=[r.id for r in runs], **refresh)]


def _rollback_many(
    runs: Sequence[Run], *, actor: Actor, reason: str, ends_transaction: bool = False
) -> None:
    """`_apply_cancel(action=rollback)` for many top-level runs (locked, active) at once: the
    runs deleted (with their rows, ON DELETE CASCADE), their audit entries, their threads and
    the workers' notices in one statement on PostgreSQL (`rows.write_together`); with its
    COMMIT in the same round trip when `ends_transaction` (the caller runs nothing after it)."""
    if not runs:
        return
    write_together(
        *_rollback_many_write(runs, actor=actor, reason=reason),
        connection.alias,
        commit=ends_transaction,
    )
    for run in runs:
        _publish(run, status="deleted", seq=run.last_seq + 1)
    logger.info("cancel %d runs action=rollback by=%s", len(runs), actor_name(actor))


def _rollback_many_write(
    runs: Sequence[Run], *, actor: Actor, reason: str
) -> tuple[list[tuple[str, list[Any]]], str, list[Any]]:
    """`_rollback_many`'s writes and select, one text for any number of runs on PostgreSQL."""
    audits, (told, told_params) = _bulk_cancelled(
        runs, action=CancelAction.ROLLBACK, actor=actor, reason=reason
    )
    in_runs, run_params = _in("id", [r.id for r in runs], any_number=True)
    writes = [
        (f"DELETE FROM runs_run WHERE {in_runs}", run_params),
        *_inserted(AuditEntry, audits),
        # Runs on a thread execute one at a time, so the newest checkpoint left on each is
        # the state from before its run.
        *_threads_of(runs, values=LATEST_VALUES, deleting=True),
    ]
    return writes, told, told_params


def _notify_cancel_many(runs: Sequence[tuple[UUID, str | None]], action: str) -> None:
    """Tell the workers of `runs` (run id, lease owner) that this transaction applies their
    cancel (`action`)."""
    for channel, payload in _cancel_notices(runs, action):
        _notify(channel, payload)


def _cancel_notices(runs: Sequence[tuple[UUID, str | None]], action: str) -> list[tuple[str, str]]:
    """The (channel, payload) notices of the cancel of `runs` (run id, lease owner): one channel
    per worker (`cancel_channel`), in batches that keep a payload under PostgreSQL's 8000-byte
    limit."""
    by_channel: dict[str, list[str]] = {}
    for run_id, owner in runs:
        by_channel.setdefault(cancel_channel(owner), []).append(cancel_notice(run_id, action))
    return [
        (channel, ",".join(notices[i : i + 150]))
        for channel, notices in by_channel.items()
        for i in range(0, len(notices), 150)
    ]


def run_delete(*, run: Run, actor: Actor, pinned_resource_id: str | None = None) -> None:
    """Delete a run record (LangGraph `DELETE /threads/{t}/runs/{r}`). Active runs: Conflict."""
    _check_scope(run, pinned_resource_id, "Run")
    with transaction.atomic():
        locked = _lock_run(run.id)
        if locked.status in (RunStatus.PENDING, RunStatus.RUNNING):
            raise Conflict(
                f"Run {run.id} is {locked.status}; cancel it before deleting it",
                code="run_active",
            )
        _audit(actor=actor, action="run_delete", run=locked, before={"status": locked.status})
        _rollback_locked(locked)
