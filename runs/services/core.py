"""Shared pieces of the service layer: locks, events, audit, the thread-status rule, publishing.

Lock order (deadlock avoidance): thread row (FOR NO KEY UPDATE, which does not block the
KEY SHARE locks that inserting checkpoints/events takes), then run rows by id, then tool calls.
Worker writes are *fenced*: they only touch a run while (id, lease_owner, attempt, status=running)
still match, so a worker that lost its lease cannot write anything.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, cast
from uuid import UUID

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models import DateTimeField, F, Q, QuerySet
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from runs import live
from runs.contracts import (
    Actor,
    Event,
    FenceResult,
    JSONObject,
    JSONValue,
    Lease,
    actor_name,
)
from runs.engine import wakeup
from runs.exceptions import LeaseLost, NotFound, RunCancelled, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    PENDING_DECISION_STATUSES,
    TERMINAL_STATUSES,
    AuditEntry,
    Checkpoint,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
)
from runs.rows import array_param, execute_planned, insert, instances, instances_from_json
from runs.services.notices import is_cancel_channel, sent_now

logger = logging.getLogger("runs")


QUEUE_CHANNEL = "runsite_queue"


REJECT_MESSAGE = (
    "Thread is already running a task. Wait for it to finish or choose a different "
    "multitask strategy."
)


DEFAULT_DECLINE_TEXT = "The reviewer declined this tool call."


# The columns of a run's lease, cleared together whenever a run stops running (nobody holds it):
# `.update(**LEASE_CLEARED)`, or `_clear_lease(run)` then `save(update_fields=[*LEASE_CLEARED])`.
LEASE_CLEARED: Final[Mapping[str, None]] = MappingProxyType(
    {"lease_owner": None, "lease_expires_at": None, "deadline_at": None}
)


def _clear_lease(run: Run) -> None:
    for name, value in LEASE_CLEARED.items():
        setattr(run, name, value)


def _now() -> datetime:
    return timezone.now()


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _sql_in(values: Iterable[str]) -> str:
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


def _thread_has_run_in(thread: str, statuses: Iterable[str], *, besides: str = "") -> str:
    """SQL: whether the thread (an SQL expression) has a top-level run in one of `statuses`
    (`besides`: more conditions on `o`, starting with AND).

    One EXISTS per status, each an equality the partial index of that status matches
    (`run_thread_queue_idx` for pending, `one_running_run_per_thread` for running,
    `run_thread_suspended_idx` for suspended; the planner may prefer the global queue or status
    index while it holds only a few rows). One `status IN (...)` instead matched none of them,
    and the planner walked every run the thread ever had, or every pending and running run
    with dead index entries, checking each row's status: a thread's thousandth run paid for the
    other 999 at every change of its status."""
    return (
        "("
        + " OR ".join(
            f"EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = {thread}"
            f" AND o.parent_run_id IS NULL{besides} AND o.status = '{status}')"
            for status in statuses
        )
        + ")"
    )


def _update_returning(
    qs: QuerySet[Any], returning: Sequence[str], **values: object
) -> list[tuple[Any, ...]]:
    """UPDATE … RETURNING through the ORM (PostgreSQL and SQLite ≥ 3.35 both support it).

    Django's public update() returns only a row count; the fenced writes need the row back in
    the same statement so the fence check, the event-sequence bump and the cancel check are one
    round trip. This uses the compiler's `execute_returning_sql` (Django 6.1, pinned).
    """
    # chain(klass) returns an instance of klass; the stub only says Query.
    query = cast(UpdateQuery, qs.query.chain(UpdateQuery))
    query.add_update_values(values)
    query.clear_select_clause()
    model = qs.model
    fields = [model._meta.get_field(name) for name in returning]
    with transaction.mark_for_rollback_on_error(using=qs.db):
        return query.get_compiler(qs.db).execute_returning_sql(fields)


def _notify(channel: str, payload: str = "") -> None:
    # Delivered by PostgreSQL at commit, never before the row is visible (a cancel notice
    # held for after a request's answer later: services/notices.py).
    if _notifies_in_sql() and sent_now([(channel, payload)]):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
    _notify_in_process(channel, payload)


def _notifies_in_sql() -> bool:
    """Whether `_notify` sends a NOTIFY (PostgreSQL): a statement that notifies as part of
    itself calls `pg_notify` only then, and `_notify_in_process` in any case."""
    return _is_postgres() and bool(settings.RUNS_NOTIFY)


def _notified_by_select(channel: str, payloads: Sequence[str]) -> tuple[list[str], list[Any]]:
    """`_notify` of each payload, as expressions for the SELECT of a statement that writes the
    change (`rows.write_together`): (expressions, their params); none where `_notify` sends no
    NOTIFY. The in-process pokes are registered here."""
    return _notices_by_select([(channel, payload) for payload in payloads])


def _notices_by_select(notices: Sequence[tuple[str, str]]) -> tuple[list[str], list[Any]]:
    """`_notified_by_select` of (channel, payload) pairs."""
    for channel, payload in notices:
        _notify_in_process(channel, payload)
    if not _notifies_in_sql():
        return [], []
    notices = sent_now(notices)
    return ["pg_notify(%s, %s)"] * len(notices), [p for notice in notices for p in notice]


def _notify_in_process(channel: str, payload: str = "") -> None:
    # A worker in this very process (embedded mode, tests) is poked directly after commit.
    if is_cancel_channel(channel):
        ids = payload.split(",")
        transaction.on_commit(lambda: wakeup.cancel_requested(ids), robust=True)
    else:
        transaction.on_commit(wakeup.wake, robust=True)


def _publish(run: Run, *, status: str | None = None, seq: int | None = None) -> None:
    live.run_changed_on_commit(
        live.RunChange(
            run_id=str(run.id),
            thread_id=str(run.thread_id) if run.thread_id else None,
            agent_id=run.agent_id,
            status=status or run.status,
            seq=seq if seq is not None else run.last_seq,
            parent_run_id=str(run.parent_run_id) if run.parent_run_id else None,
            resource_id=run.resource_id,
        )
    )


def _append_events(run_id: UUID, events: Sequence[Event]) -> int:
    """Add events to a run's timeline and return the last seq. Caller holds the run's row lock."""
    if not events:
        return Run.objects.filter(id=run_id).values_list("last_seq", flat=True).first() or 0
    rows = _update_returning(
        Run.objects.filter(id=run_id),
        ["last_seq"],
        last_seq=F("last_seq") + len(events),
        updated_at=_now(),
    )
    if not rows:
        raise NotFound(f"Run {run_id} not found")
    last = rows[0][0]
    _insert_events(run_id, last, events)
    return last


def _insert_events(run_id: UUID, last_seq: int, events: Sequence[Event]) -> None:
    """Insert events whose seqs were already reserved (ending at last_seq) by a fenced update."""
    insert(_event_rows(run_id, last_seq, events))


def _event_rows(run_id: UUID, last_seq: int, events: Sequence[Event]) -> list[RunEvent]:
    """The rows of events whose seqs end at `last_seq` (`_insert_events`'), unsaved."""
    first = last_seq - len(events) + 1
    return [
        RunEvent(run_id=run_id, seq=first + i, kind=kind, data=data, actor=actor)
        for i, (kind, data, actor) in enumerate(events)
    ]


def _audit(**fields: Any) -> None:
    """Write an audit entry (`_audit_entry`'s fields)."""
    insert([_audit_entry(**fields)])


def _audit_entry(
    *,
    actor: Actor,
    action: str,
    run: Run | None = None,
    tool_call_id: str = "",
    reason: str = "",
    before: JSONValue = None,
    after: JSONValue = None,
    thread_id: UUID | None = None,
) -> AuditEntry:
    """The audit entry `_audit` writes, unsaved (for a caller that writes it with more)."""
    return AuditEntry(
        actor=actor_name(actor),
        action=action,
        run_id=run.id if run else None,
        thread_id=run.thread_id if run else thread_id,
        agent_id=run.agent_id if run else "",
        resource_id=run.resource_id if run else None,
        tool_call_id=tool_call_id,
        reason=reason,
        before=before,
        after=after,
    )


# The two statements every worker step and most requests make, written out: the ORM compiled
# each on every call (~0.3-0.5 ms of CPU, more than PostgreSQL takes to run them).
_LOCK_THREAD_SQL = {
    "postgresql": "SELECT id FROM runs_thread WHERE id = %s FOR NO KEY UPDATE",
    # SQLite has no row locks: its IMMEDIATE transactions serialise writers (the ORM's
    # select_for_update reads the row there all the same, so the read stays).
    "sqlite": "SELECT id FROM runs_thread WHERE id = %s",
}
_FENCE_SQL = """
UPDATE runs_run SET last_seq = last_seq + %s, updated_at = %s
 WHERE id = %s AND lease_owner = %s AND attempt = %s AND status = 'running'{also}
RETURNING last_seq, cancel_action{more}
"""


def _uuid_param(value: UUID) -> Any:
    return Run._meta.pk.get_db_prep_value(value, connection)  # a 32-digit hex text on SQLite


# `had_runs`: whether any run was ever created on the thread (none can be while it is locked).
_LOCK_THREAD_ROW = (
    "SELECT *, EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = runs_thread.id) AS had_runs"
    " FROM runs_thread WHERE id = %s"
)
_LOCK_THREAD_ROW_SQL = {
    "postgresql": f"{_LOCK_THREAD_ROW} FOR NO KEY UPDATE OF runs_thread",
    "sqlite": _LOCK_THREAD_ROW,
}


def _lock_thread_row(thread_id: UUID) -> Thread | None:
    """Lock a thread and read it in one statement (what it holds under the lock), with
    `had_runs` (whether it has had any run) as an attribute."""
    found = instances(
        Thread, _LOCK_THREAD_ROW_SQL[connection.vendor], [_uuid_param(thread_id)], planned=True
    )
    return found[0] if found else None


def _lock_thread(thread_id: UUID | None) -> None:
    if thread_id is not None:
        with connection.cursor() as cursor:
            cursor.execute(_LOCK_THREAD_SQL[connection.vendor], [_uuid_param(thread_id)])
            cursor.fetchall()


# A run locked and read for a decision or a cancel, written out (the ORM compiled the locking
# read with its annotation on every call): `has_rules`, whether notification rules may want its
# events (spares `_announce` a query when none do), and `has_children`, whether it has sub-agent
# runs in flight.
_LOCK_RUN_COLUMNS = (
    "SELECT r.*, EXISTS (SELECT 1 FROM runs_notificationrule n"
    " WHERE n.active AND n.agent_id = r.agent_id) AS has_rules,"
    " EXISTS (SELECT 1 FROM runs_run c WHERE c.parent_run_id = r.id"
    f" AND c.status IN {_sql_in(ACTIVE_STATUSES)}) AS has_children"
    " FROM runs_run r WHERE r.id = %s"
)
# A thread's lock taken first in a run's locking statement (PostgreSQL): the run's scan
# evaluates it (a one-time condition, `EXISTS (SELECT 1 FROM t)`) before its own lock.
_THREAD_LOCK_CTE = (
    "WITH t AS MATERIALIZED (SELECT id FROM runs_thread WHERE id = %s FOR NO KEY UPDATE) "
)
_LOCK_THREAD_THEN_RUN_SQL = (
    _THREAD_LOCK_CTE + _LOCK_RUN_COLUMNS + " AND EXISTS (SELECT 1 FROM t) FOR NO KEY UPDATE OF r"
)
_LOCK_RUN_SQL = {
    "postgresql": f"{_LOCK_RUN_COLUMNS} FOR NO KEY UPDATE OF r",
    "sqlite": _LOCK_RUN_COLUMNS,  # its IMMEDIATE transaction already holds the writer lock
}


def _lock_threads(thread_ids: Sequence[UUID]) -> None:
    """Lock threads in id order (callers pass them sorted), in one statement."""
    if not thread_ids:
        return
    in_threads, params = _in("id", thread_ids)
    lock = " ORDER BY id FOR NO KEY UPDATE" if _is_postgres() else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM runs_thread WHERE {in_threads}{lock}", params)
        cursor.fetchall()


def _lock_runs(run_ids: Sequence[UUID]) -> list[Run]:
    """Lock the active ones of these runs in id order and read them as `_lock_run` does (with
    `has_rules` and `has_children`), in one statement. Caller holds their threads' locks."""
    if not run_ids:
        return []
    in_runs, params = _in("r.id", run_ids)
    sql = _LOCK_RUN_COLUMNS.replace(
        "r.id = %s", f"{in_runs} AND r.status IN {_sql_in(ACTIVE_STATUSES)}"
    )
    sql += " ORDER BY r.id" + (" FOR NO KEY UPDATE OF r" if _is_postgres() else "")
    return _with_flags(instances(Run, sql, params))


# `_lock_selected_runs`' statement: the runs a query selects (`{selected}`, its id and
# thread_id), their threads locked in id order, then the runs in id order, read as `_lock_runs`
# reads them. The threads' lock is a one-time condition of the runs' scan (no column of `r` in
# it), so it is taken before any run's. `fresh`: every locked row is the version the statement's
# snapshot sees (see `_CANCEL_AT_ONCE_HEAD` in cancel.py: a lock waited for may return a newer
# one, whose flags the snapshot's reads would not match).
_LOCK_SELECTED_RUNS_SQL = (
    "WITH s AS MATERIALIZED ({selected}),"
    " t AS MATERIALIZED (SELECT id, xmin AS row_version FROM runs_thread"
    " WHERE id IN (SELECT thread_id FROM s) ORDER BY id FOR NO KEY UPDATE)"
    + _LOCK_RUN_COLUMNS.replace(
        " FROM runs_run r",
        ", r.xmin = (SELECT v.xmin FROM runs_run v WHERE v.id = r.id)"
        " AND NOT EXISTS (SELECT 1 FROM t JOIN runs_thread v ON v.id = t.id"
        " WHERE v.xmin <> t.row_version) AS fresh FROM runs_run r",
        1,
    ).replace(
        "r.id = %s",
        f"r.id IN (SELECT id FROM s) AND r.status IN {_sql_in(ACTIVE_STATUSES)}"
        " AND (SELECT count(*) FROM t) >= 0",
    )
    + " ORDER BY r.id FOR NO KEY UPDATE OF r"
)


def _lock_selected_runs(selected: QuerySet[Run] | tuple[str, list[Any]]) -> list[Run]:
    """The active ones of the runs `selected` finds, locked as `_lock_threads` then `_lock_runs`
    lock them (threads in id order, then runs in id order) and read as `_lock_runs` reads them.
    On PostgreSQL in one statement, whose runs are read again under the locks it holds when a
    lock it waited for returned a row changed since its snapshot; on SQLite as those two do.
    `selected`: a QuerySet, or on PostgreSQL a statement written out (sql, params) selecting
    `id, thread_id` by key, which is then planned once per connection (the API's bulk cancel).
    Call it inside a transaction."""
    if not _is_postgres():
        if isinstance(selected, tuple):
            raise ValueError("_lock_selected_runs(): a statement written out is PostgreSQL's")
        targets = list(selected.order_by("thread_id", "id").values_list("id", "thread_id"))
        _lock_threads(sorted({t for _, t in targets if t is not None}))
        return _lock_runs([r for r, _ in targets])
    if isinstance(selected, tuple):
        query, params = selected
    else:
        try:
            query, found = selected.order_by().values("id", "thread_id").query.sql_with_params()
            params = list(found)
        except EmptyResultSet:  # a query that can select nothing (no ids): nothing to lock
            return []
    runs = _with_flags(
        instances(
            Run,
            _LOCK_SELECTED_RUNS_SQL.replace("{selected}", query, 1),
            list(params),
            planned=isinstance(selected, tuple),
        )
    )
    if all(run.fresh for run in runs):
        return runs
    return _lock_runs([run.id for run in runs])  # locked already: read after the locks


def _lock_newest_suspended_run(
    thread_id: UUID,
    *,
    lock_thread: bool = False,
    pinned_resource_id: str | None = None,
    waiting: bool = False,
) -> Run | None:
    """Lock and read (as `_lock_run`) the thread's newest suspended top-level run, if any, in
    one statement. The caller holds the thread's lock, or `lock_thread` takes it first: in the
    same statement on PostgreSQL (as `_LOCK_THREAD_THEN_RUN_SQL` does), the thread matched in
    `pinned_resource_id`'s scope, so a thread missing or out of scope reads no run either.

    `waiting` (with `lock_thread`, PostgreSQL): the same statement also locks and reads the
    run's calls waiting for a human, in their order (`created_at`, `id`), and leaves them on
    the run as `waiting_calls`, unless a transaction changed the run while the statement
    waited for its locks (see `_CANCEL_AT_ONCE_HEAD`: the statement's snapshot is older than
    its locks; a change to the run's calls changes the run too): then the caller reads them
    after the lock, as without `waiting`."""
    where = f"r.thread_id = %s AND r.status = '{RunStatus.SUSPENDED}' AND r.parent_run_id IS NULL"
    params: list[Any] = [_uuid_param(thread_id)]
    scoped = pinned_resource_id is not None
    if lock_thread and _is_postgres():
        head = _THREAD_LOCK_CTE
        if scoped:
            head = head.replace("id = %s", "id = %s AND resource_id = %s")
        where += " AND EXISTS (SELECT 1 FROM t)"
        params = [_uuid_param(thread_id), *([pinned_resource_id] if scoped else []), *params]
    else:
        head = ""
        if lock_thread:
            _lock_thread(thread_id)
        if scoped:
            where += (
                " AND EXISTS (SELECT 1 FROM runs_thread s WHERE s.id = r.thread_id"
                " AND s.resource_id = %s)"
            )
            params.append(pinned_resource_id)
    sql = head + _LOCK_RUN_COLUMNS.replace("r.id = %s", where)
    sql += " ORDER BY r.suspended_at DESC, r.id DESC LIMIT 1"
    if _is_postgres():
        sql += " FOR NO KEY UPDATE OF r"
    if waiting and lock_thread and _is_postgres():
        found = _with_flags(
            instances(Run, _with_waiting_calls(sql, len(head)), params, planned=True)
        )
        if found:
            calls = found[0].__dict__.pop("waiting_calls")
            if calls is not None:
                found[0].waiting_calls = instances_from_json(
                    ToolCall, json.loads(calls) if isinstance(calls, str) else calls
                )
    else:
        found = _with_flags(instances(Run, sql, params))
    return found[0] if found else None


def _with_waiting_calls(sql: str, head_length: int) -> str:
    """`_lock_newest_suspended_run`'s statement (its `WITH t` head `head_length` long) with
    the run's waiting calls locked and read as JSON in the same statement, when the run's row
    as locked is the one the statement's snapshot sees (`waiting_calls` NULL otherwise)."""
    head, select = sql[:head_length], sql[head_length:]
    select = select.replace("SELECT r.*,", "SELECT r.*, r.xmin AS row_version,", 1)
    same = "s.row_version = (SELECT v.xmin FROM runs_run v WHERE v.id = s.id)"
    return (
        f"{head.rstrip()}, s AS MATERIALIZED ({select}),"
        " w AS MATERIALIZED (SELECT tc.* FROM runs_toolcall tc, s"
        f" WHERE tc.run_id = s.id AND tc.status IN {_sql_in(PENDING_DECISION_STATUSES)}"
        f" AND {same} FOR NO KEY UPDATE OF tc)"
        f" SELECT s.*, CASE WHEN {same} THEN (SELECT COALESCE(jsonb_agg(to_jsonb(w)"
        " ORDER BY w.created_at, w.id), '[]') FROM w) END AS waiting_calls FROM s"
    )


def _lock_run(
    run_id: UUID,
    *,
    known: Run | None = None,
    on_thread: UUID | None = None,
    pinned_resource_id: str | None = None,
) -> Run:
    """Lock a run for a decision or a cancel, in the documented order (thread, then run), and
    read it with `has_rules` and `has_children` (see _LOCK_RUN_COLUMNS).

    `known`: the run as the caller read it (a run never changes thread: no lookup needed).
    `on_thread`: the thread the caller names the run by (LangGraph's paths), read nowhere
    before: the run is locked only if it is on that thread and in `pinned_resource_id`'s scope;
    otherwise NotFound, as `selectors.run_get` answers, and no run row was locked.
    """
    if on_thread is not None:
        return _lock_run_on_thread(run_id, on_thread, pinned_resource_id)
    if known is not None:
        thread_id = known.thread_id
    else:
        thread_id = Run.objects.filter(id=run_id).values_list("thread_id", flat=True).first()
        if thread_id is None and not Run.objects.filter(id=run_id).exists():
            raise NotFound(f"Run {run_id} not found")
    if thread_id is not None and _is_postgres():
        # Both locks in one statement, the thread's first: the run's scan evaluates the
        # thread's lock (a one-time condition) before the run's row reaches its own lock.
        sql, params = _LOCK_THREAD_THEN_RUN_SQL, [_uuid_param(thread_id), _uuid_param(run_id)]
    else:
        _lock_thread(thread_id)
        sql, params = _LOCK_RUN_SQL[connection.vendor], [_uuid_param(run_id)]
    found = _with_flags(instances(Run, sql, params))
    if not found:
        raise NotFound(f"Run {run_id} not found")
    return found[0]


def _lock_run_on_thread(run_id: UUID, thread_id: UUID, pinned_resource_id: str | None) -> Run:
    where, params = "r.id = %s AND r.thread_id = %s", [_uuid_param(run_id), _uuid_param(thread_id)]
    if pinned_resource_id is not None:
        where += " AND r.resource_id = %s"
        params.append(pinned_resource_id)
    if _is_postgres():
        sql = _LOCK_THREAD_THEN_RUN_SQL.replace("r.id = %s", where)
        params = [_uuid_param(thread_id), *params]
    else:
        _lock_thread(thread_id)
        sql = _LOCK_RUN_SQL[connection.vendor].replace("r.id = %s", where)
    found = _with_flags(instances(Run, sql, params))
    if not found:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    return found[0]


def _with_flags(runs: list[Run]) -> list[Run]:
    """`has_rules` and `has_children` (read by _LOCK_RUN_COLUMNS) as booleans (SQLite: 0, 1)."""
    for run in runs:
        run.has_rules = bool(run.has_rules)  # type: ignore[attr-defined]
        run.has_children = bool(run.has_children)  # type: ignore[attr-defined]
    return runs


def _newest_checkpoints(thread_id: UUID) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(thread_id=thread_id).order_by("-created_at", "-id")


def _latest_thread_values(thread_id: UUID) -> JSONObject | None:
    return _newest_checkpoints(thread_id).values_list("values", flat=True).first()


class _Unset(enum.Enum):
    """The default of parameters for which None is a meaningful value."""

    UNSET = enum.auto()


_UNSET: Final = _Unset.UNSET


class _Latest(enum.Enum):
    """`values=LATEST_VALUES`: store each thread's newest checkpoint (a correlated subquery)."""

    VALUES = enum.auto()


LATEST_VALUES: Final = _Latest.VALUES


def _refresh_thread(
    thread_id: UUID | None,
    *,
    values: JSONObject | _Latest | _Unset | None = _UNSET,
    finished_status: str | None = None,
    one_in_flight: bool = False,
) -> str | None:
    """Derive the thread's status from its runs (and optionally store new values).

    busy: a pending or running run; interrupted: a suspended run; error: the last finished run
    failed; idle otherwise. Caller holds the thread lock. One UPDATE: the run checks are
    subqueries of it, evaluated under the lock.
    """
    if thread_id is None:
        return None
    statuses = _refresh_threads(
        [thread_id], values=values, finished_status=finished_status, one_in_flight=one_in_flight
    )
    return statuses[0] if statuses else None


# The thread-status rule as SQL (PostgreSQL and SQLite alike). Written out rather than built with
# the ORM: this runs on every create, suspend, resume, cancel and end of a run, and compiling
# the same UPDATE through Case/Exists/Subquery cost ~4 ms of CPU a call against well under 1 ms
# to run it. Twin: the `thread` CTE of finish._FINISH_SQL_POSTGRES.
_IN_FLIGHT = (RunStatus.PENDING, RunStatus.RUNNING)


def _thread_status_sql(idle: str, besides: str = "") -> str:
    """The rule: busy with a run in flight, interrupted with one waiting for a human, else
    `idle` (an SQL expression). `besides`: runs left out, as `_thread_has_run_in` takes it."""
    busy = _thread_has_run_in("runs_thread.id", _IN_FLIGHT, besides=besides)
    waiting = _thread_has_run_in("runs_thread.id", (RunStatus.SUSPENDED,), besides=besides)
    return (
        f"CASE WHEN {busy} THEN '{ThreadStatus.BUSY}'"
        f" WHEN {waiting} THEN '{ThreadStatus.INTERRUPTED}' ELSE {idle} END"
    )


def _expires_sql(besides: str = "") -> str:
    """A stateless run's thread expires once nothing on it is active (the time is a parameter)."""
    active = _thread_has_run_in("runs_thread.id", ACTIVE_STATUSES, besides=besides)
    return (
        f"CASE WHEN delete_when_done AND expires_at IS NULL AND NOT {active}"
        " THEN %s ELSE expires_at END"
    )


_LAST_FINISHED_FAILED = (
    "(SELECT o.status FROM runs_run o WHERE o.thread_id = runs_thread.id"
    f" AND o.parent_run_id IS NULL AND o.status IN {_sql_in(TERMINAL_STATUSES)}"
    " ORDER BY o.finished_at DESC NULLS LAST, o.created_at DESC LIMIT 1)"
    f" IN {_sql_in((RunStatus.ERROR, RunStatus.TIMEOUT))}"
)
_LATEST_VALUES_SQL = (
    '(SELECT c."values" FROM runs_checkpoint c WHERE c.thread_id = runs_thread.id'
    " ORDER BY c.created_at DESC, c.id DESC LIMIT 1)"
)


def _refresh_threads(
    thread_ids: Sequence[UUID],
    *,
    values: JSONObject | _Latest | _Unset | None = _UNSET,
    finished_status: str | None = None,
    one_in_flight: bool = False,
) -> list[str]:
    """`_refresh_thread` for many threads in one UPDATE (caller holds their locks)."""
    if not thread_ids:
        return []
    sql, params = _refresh_threads_statement(
        thread_ids, values=values, finished_status=finished_status, one_in_flight=one_in_flight
    )
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING status", params)
        return [row[0] for row in cursor.fetchall()]


def _refresh_threads_statement(
    thread_ids: Sequence[UUID],
    *,
    values: JSONObject | _Latest | _Unset | None = _UNSET,
    finished_status: str | None = None,
    one_in_flight: bool = False,
    ending: Sequence[UUID] = (),
    deleting: bool = False,
    suspending: bool = False,
    any_number: bool = False,
) -> tuple[str, list[Any]]:
    """The UPDATE of `_refresh_threads`, (sql, params), for `rows.write_together`.

    `ending`: runs this same statement ends (or, `deleting`, deletes). In one statement
    (PostgreSQL) the thread's rule would still read them as they were, so they are left out of
    the rule, and deleted runs' checkpoints out of `LATEST_VALUES` (they go with them); run
    after the runs' own writes (SQLite) the statement reads the same either way.
    `any_number`: one text for any number of threads and `ending` runs, none included (`_in`).
    `suspending`: the `ending` runs are parked for a human (interrupted unless another run is
    in flight; the thread does not expire while one waits)."""
    if suspending:
        idle = f"'{ThreadStatus.INTERRUPTED}'"
    elif one_in_flight:
        # The caller just parked or queued a run of this thread: busy or interrupted, never
        # the idle/error fallback, so the last finished run need not be looked up.
        idle = f"'{ThreadStatus.IDLE}'"
    elif finished_status is not None:
        # The caller just finished a run: it is the thread's last finished run.
        failed = finished_status in (RunStatus.ERROR, RunStatus.TIMEOUT)
        idle = f"'{ThreadStatus.ERROR if failed else ThreadStatus.IDLE}'"
    else:
        idle = (
            f"CASE WHEN {_LAST_FINISHED_FAILED} THEN '{ThreadStatus.ERROR}'"
            f" ELSE '{ThreadStatus.IDLE}' END"
        )
    now = _now()
    db_time = DateTimeField().get_db_prep_value
    params: list[Any] = []
    besides = ""
    ending_in = bool(ending) or any_number
    if ending_in:
        left_out, left_out_params = _not_in("o.id", ending, any_number=any_number)
        besides = f" AND {left_out}"
    rule, expires, latest = (
        _thread_status_sql(idle, besides),
        _expires_sql(besides),
        _LATEST_VALUES_SQL,
    )
    if ending_in:
        params += left_out_params * rule.count(left_out)
    params.append(db_time(now, connection))
    if suspending:
        expires = "expires_at"
    else:
        if ending_in:
            params += left_out_params * expires.count(left_out)
        params.append(db_time(stateless_expiry(now), connection))
    assignments = ""
    if values is LATEST_VALUES:
        if ending_in and deleting:
            gone, gone_params = _not_in("c.run_id", ending, any_number=any_number)
            latest = latest.replace("ORDER BY", f"AND (c.run_id IS NULL OR {gone}) ORDER BY")
            params += gone_params
        assignments = f', "values" = {latest}'
    elif values is not _UNSET:
        assignments = ', "values" = %s'
        params.append(Thread._meta.get_field("values").get_db_prep_save(values, connection))
    in_threads, thread_params = _in("id", thread_ids, any_number=any_number)
    params += thread_params
    sql = (
        f"UPDATE runs_thread SET status = {rule},"
        f" updated_at = %s, expires_at = {expires}{assignments}"
        f" WHERE {in_threads}"
    )
    return sql, params


def _in(column: str, ids: Sequence[UUID], *, any_number: bool = False) -> tuple[str, list[Any]]:
    """`column IN (ids)` written for the database: on PostgreSQL `column = %s` for one id, else
    one array parameter (two statement texts whatever the number: each prepared once); a list
    of parameters on SQLite. `any_number`: one text for any number, none included (an array,
    `rows.array_param`), for a statement a connection should plan once whatever its size.

    One id is written as an equality because PostgreSQL plans a prepared statement anew on
    every execution while its generic plan looks dearer than the plans made for the values
    given, and an array of unknown length makes it look so: the thread refresh of a cancel was
    planned at every call, 0.8 ms of its 1.5 ms (docs/benchmarks.md)."""
    if _is_postgres():
        if any_number:
            return f"{column} = ANY(%s::uuid[])", [array_param(ids, connection.alias)]
        if len(ids) == 1:
            return f"{column} = %s", [ids[0]]
        return f"{column} = ANY(%s)", [list(ids)]
    return f"{column} IN ({', '.join(['%s'] * len(ids))})", [_uuid_param(i) for i in ids]


def _not_in(column: str, ids: Sequence[UUID], *, any_number: bool = False) -> tuple[str, list[Any]]:
    """`column NOT IN (ids)`, as `_in` writes it."""
    if _is_postgres():
        if any_number:
            return f"{column} <> ALL(%s::uuid[])", [array_param(ids, connection.alias)]
        if len(ids) == 1:
            return f"{column} <> %s", [ids[0]]
        return f"{column} <> ALL(%s)", [list(ids)]
    return f"{column} NOT IN ({', '.join(['%s'] * len(ids))})", [_uuid_param(i) for i in ids]


def stateless_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.RUNS_STATELESS_KEEP_SECONDS)


def _check_scope(obj: Thread | Run, pinned_resource_id: str | None, what: str) -> None:
    # An API key pinned to a resource sees nothing else: out of scope looks like not found.
    if pinned_resource_id is not None and obj.resource_id != pinned_resource_id:
        raise NotFound(f"{what} {obj.id} not found")


def _check_json_size(value: JSONValue, field_name: str, limit: int = 1_000_000) -> None:
    """Refuse values PostgreSQL's jsonb cannot store (NaN, Infinity, NUL) or that are too big."""

    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ValidationFailed.field(
            field_name,
            "not valid JSON",
            detail=f"{field_name} is not valid JSON (NaN and Infinity are not allowed)",
        ) from None
    if "\\u0000" in text:
        raise ValidationFailed.field(
            field_name,
            "contains \\u0000",
            detail=f"{field_name} contains a NUL character (\\u0000), which cannot be stored",
        )
    if len(text) > limit:
        raise ValidationFailed.field(
            field_name,
            "too large",
            detail=f"{field_name} is too large ({len(text)} bytes, limit {limit})",
        )


def _validate_choice(value: str, choices: Iterable[str], field_name: str) -> str:
    allowed = list(choices)
    if value not in allowed:
        raise ValidationFailed.field(
            field_name,
            f"must be one of {', '.join(allowed)}",
            detail=f"{field_name} must be one of {', '.join(allowed)}; got {value!r}",
        )
    return value


def _lock_timeout() -> None:
    if _is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")


def _lock_run_if(run_id: UUID, condition: Q) -> Run | None:
    try:
        run = _lock_run(run_id)
    except NotFound:
        return None
    if not Run.objects.filter(condition, id=run_id).exists():
        return None
    return run


def _fence(lease: Lease, *, events: int = 0, **changes: object) -> FenceResult:
    """Check that `lease` still holds the run, reserving `events` sequence numbers.

    One statement: UPDATE … WHERE id, owner, attempt, status=running RETURNING. It also takes
    the run's row lock for the rest of the transaction, and applies `changes` to the row.
    """
    if not changes:  # the usual fence, written out (the same statement the ORM compiles)
        return _fence_returning(lease, events=events)[0]
    rows = _update_returning(
        Run.objects.filter(
            id=lease.run_id,
            lease_owner=lease.owner,
            attempt=lease.attempt,
            status=RunStatus.RUNNING,
        ),
        ["last_seq", "cancel_action"],
        last_seq=F("last_seq") + events,
        updated_at=_now(),
        **changes,
    )
    if not rows:
        raise _lease_lost(lease)
    return FenceResult(last_seq=rows[0][0], cancel_action=rows[0][1])


def _fence_statement(
    lease: Lease, events: int = 0, more: str = "", *, also: str = ""
) -> tuple[str, list[Any]]:
    """The fence's UPDATE (sql, params): `more` columns returned, `also` more conditions."""
    updated_at = DateTimeField().get_db_prep_value(_now(), connection)
    return (
        _FENCE_SQL.format(more=f", {more}" if more else "", also=also),
        [events, updated_at, _uuid_param(lease.run_id), lease.owner, lease.attempt],
    )


def _fence_returning(
    lease: Lease, *, events: int = 0, more: str = "", lock_thread: bool = False
) -> tuple[FenceResult, tuple[Any, ...]]:
    """`_fence` (without changes), also returning `more`: further columns of the run's row,
    or subqueries over it (`runs_run`), read under the lock the fence takes.

    `lock_thread`: the lease's thread locked first (`_lock_thread`), on PostgreSQL by the same
    statement (`_THREAD_LOCK_CTE`: taken before the run's row, as every path takes them), one
    round trip fewer."""
    if lock_thread and lease.thread_id is not None:
        if _is_postgres():
            fence, params = _fence_statement(
                lease, events, more, also=" AND EXISTS (SELECT 1 FROM t)"
            )
            sql, params = _THREAD_LOCK_CTE + fence, [_uuid_param(lease.thread_id), *params]
        else:
            _lock_thread(lease.thread_id)
            sql, params = _fence_statement(lease, events, more)
    else:
        sql, params = _fence_statement(lease, events, more)
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        execute_planned(cursor, sql, params)
        row = cursor.fetchone()
    if row is None:
        raise _lease_lost(lease)
    return FenceResult(last_seq=row[0], cancel_action=row[1]), tuple(row[2:])


def _fence_with(lease: Lease, write: tuple[str, list[Any]]) -> FenceResult:
    """`_fence` (no events, no changes) and `write`, an UPDATE that needs nothing from it, made
    only if the fence holds: on PostgreSQL one statement, which commits on its own outside a
    transaction (no BEGIN and COMMIT round trips); elsewhere the two in a transaction."""
    if not _is_postgres():
        with transaction.atomic():
            fence = _fence(lease)
            with connection.cursor() as cursor:
                cursor.execute(*write)
            return fence
    sql, params = write
    fence_sql, fence_params = _fence_statement(lease)
    with transaction.mark_for_rollback_on_error(), connection.cursor() as cursor:
        execute_planned(
            cursor,
            f"WITH f AS ({fence_sql}),"
            f" w AS ({sql} AND EXISTS (SELECT 1 FROM f)) SELECT last_seq, cancel_action FROM f",
            [*fence_params, *params],
        )
        row = cursor.fetchone()
    if row is None:
        raise _lease_lost(lease)
    return FenceResult(last_seq=row[0], cancel_action=row[1])


def _lease_lost(lease: Lease) -> LeaseLost:
    """Why a fenced write matched no row: cancelled under this lease (RunCancelled: the worker
    stops quietly), or lost (reaped and claimed again, released, deleted with its thread)."""
    row = Run.objects.filter(id=lease.run_id).values_list("status", "attempt").first()
    lost = f"run {lease.run_id}: lease (owner {lease.owner}, attempt {lease.attempt})"
    if row is None:
        # A running run disappears through a rollback (or with its thread): nothing to keep.
        return RunCancelled(f"{lost}: the run was deleted", deleted=True)
    if row == (RunStatus.INTERRUPTED, lease.attempt):
        return RunCancelled(f"{lost}: the run was cancelled", deleted=False)
    return LeaseLost(f"{lost} lost")


def _complete_lease(lease: Lease) -> Lease:
    """Fill in a lease built by hand (tests, older callers) from the run row."""
    if lease.agent_id:
        return lease
    row = (
        Run.objects.filter(id=lease.run_id)
        .values("thread_id", "agent_id", "parent_run_id", "resource_id")
        .first()
    )
    if row is None:
        raise LeaseLost(f"run {lease.run_id} no longer exists")
    return Lease(
        lease.run_id,
        lease.owner,
        lease.attempt,
        row["thread_id"],
        row["agent_id"],
        row["parent_run_id"],
        row["resource_id"],
    )


def _publish_fenced(
    lease: Lease, seq: int, status: str = RunStatus.RUNNING, outcome: JSONValue = None
) -> None:
    """Publish a worker's change after commit; `outcome`: the wait/join body of a run this write
    stops, exactly as `selectors.run_outcome` would read it back (carried when small)."""
    if outcome is not None and len(json.dumps(outcome, default=str)) > live.OUTCOME_CARRIED_BYTES:
        outcome = None
    live.run_changed_on_commit(
        live.RunChange(
            run_id=str(lease.run_id),
            thread_id=str(lease.thread_id) if lease.thread_id else None,
            agent_id=lease.agent_id,
            status=status,
            seq=seq,
            parent_run_id=str(lease.parent_run_id) if lease.parent_run_id else None,
            resource_id=lease.resource_id,
            attempt=lease.attempt if outcome is not None else None,
            outcome=outcome,
        )
    )
