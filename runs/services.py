"""Every state change of Runsite, in one place.

Views, API handlers, consumers, commands and the engine call these functions; none of them
decides state itself. Each function is atomic and announces its change only after commit
(`live.run_changed_on_commit`), and wakes workers with `pg_notify` inside the transaction so a
notification never arrives before the row it talks about.

Lock order (deadlock avoidance): thread row (FOR NO KEY UPDATE, which does not block the
KEY SHARE locks that inserting checkpoints/events takes), then run rows by id, then tool calls.
Worker writes are *fenced*: they only touch a run while (id, lease_owner, attempt, status=running)
still match, so a worker that lost its lease cannot write anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Case, Exists, F, Q, QuerySet, Value, When
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from runs import live, metrics
from runs.engine import wakeup
from runs.engine.agent import schema_errors
from runs.engine.registry import get_agent
from runs.exceptions import AlreadyDecided, Conflict, LeaseLost, NotFound, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    PENDING_DECISION_STATUSES,
    TERMINAL_STATUSES,
    ApiKey,
    AuditEntry,
    CancelAction,
    Checkpoint,
    MultitaskStrategy,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
    ToolCallStatus,
)

logger = logging.getLogger("runs")

QUEUE_CHANNEL = "runsite_queue"
CANCEL_CHANNEL = "runsite_cancel"
REJECT_MESSAGE = (
    "Thread is already running a task. Wait for it to finish or choose a different "
    "multitask strategy."
)
DEFAULT_DECLINE_TEXT = "The reviewer declined this tool call."

Actor = Any  # a User, a string such as "api:ci-key", or None for the system


def actor_name(actor: Actor) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    return actor.get_username()


@dataclass(frozen=True)
class Lease:
    """What a worker holds on a run it claimed; every write it makes is fenced by it."""

    run_id: UUID
    owner: str
    attempt: int
    # Known at claim time; lets fenced writes lock the thread and publish without a lookup.
    thread_id: UUID | None = None
    agent_id: str = ""
    parent_run_id: UUID | None = None


@dataclass
class StepWrite:
    """One checkpoint the step loop wants written (ids are chosen up front so steps can chain)."""

    id: UUID
    step: int
    values: dict[str, Any]
    pending: list[str]
    parent_id: UUID | None


@dataclass
class ClaimedRun:
    run: Run
    lease: Lease


@dataclass
class FenceResult:
    last_seq: int
    cancel_action: str | None


@dataclass
class BulkCancelResult:
    interrupted: list[UUID] = field(default_factory=list)  # done at once (pending/suspended)
    deleted: list[UUID] = field(default_factory=list)  # rolled back at once
    requested: list[UUID] = field(default_factory=list)  # running: the worker finishes it

    @property
    def count(self) -> int:
        return len(self.interrupted) + len(self.deleted) + len(self.requested)


@dataclass
class SuspendPlan:
    """One run to park: its waiting tool calls and the state they wait in."""

    lease: Lease
    waiting: list[dict[str, Any]]  # {tool_call_id, status, suspend_payload, resume_schema, ...}


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _now() -> datetime:
    return timezone.now()


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _update_returning(qs: QuerySet, returning: Sequence[str], **values: Any) -> list[tuple]:
    """UPDATE … RETURNING through the ORM (PostgreSQL and SQLite ≥ 3.35 both support it).

    Django's public update() returns only a row count; the fenced writes need the row back in
    the same statement so the fence check, the event-sequence bump and the cancel check are one
    round trip. This uses the compiler's `execute_returning_sql` (Django 6.1, pinned).
    """
    query = qs.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()
    model = qs.model
    fields = [model._meta.get_field(name) for name in returning]
    with transaction.mark_for_rollback_on_error(using=qs.db):
        return query.get_compiler(qs.db).execute_returning_sql(fields)


def _notify(channel: str, payload: str = "") -> None:
    # Delivered by PostgreSQL at commit, never before the row is visible.
    if _is_postgres() and settings.RUNS_NOTIFY:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])
    # A worker in this very process (embedded mode, tests) is poked directly after commit.
    if channel == CANCEL_CHANNEL:
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
        )
    )


def _append_events(run_id: UUID, events: Sequence[tuple[str, dict[str, Any], str]]) -> int:
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
    first = last - len(events) + 1
    RunEvent.objects.bulk_create(
        RunEvent(run_id=run_id, seq=first + i, kind=kind, data=data, actor=actor)
        for i, (kind, data, actor) in enumerate(events)
    )
    return last


def _insert_events(run_id: UUID, last_seq: int, events: Sequence[tuple[str, dict, str]]) -> None:
    """Insert events whose seqs were already reserved (ending at last_seq) by a fenced update."""
    first = last_seq - len(events) + 1
    RunEvent.objects.bulk_create(
        RunEvent(run_id=run_id, seq=first + i, kind=kind, data=data, actor=actor)
        for i, (kind, data, actor) in enumerate(events)
    )


def _audit(
    *,
    actor: Actor,
    action: str,
    run: Run | None = None,
    tool_call_id: str = "",
    reason: str = "",
    before: Any = None,
    after: Any = None,
    thread_id: UUID | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
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


def _lock_thread(thread_id: UUID | None) -> None:
    if thread_id is not None:
        list(Thread.objects.select_for_update(no_key=True).filter(id=thread_id).values("id"))


def _lock_run(run_id: UUID) -> Run:
    """Lock a run for a decision or a cancel, in the documented order (thread, then run)."""
    thread_id = Run.objects.filter(id=run_id).values_list("thread_id", flat=True).first()
    if thread_id is None and not Run.objects.filter(id=run_id).exists():
        raise NotFound(f"Run {run_id} not found")
    _lock_thread(thread_id)
    run = Run.objects.select_for_update(no_key=True).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found")
    return run


def _latest_thread_values(thread_id: UUID) -> Any:
    return (
        Checkpoint.objects.filter(thread_id=thread_id)
        .order_by("-created_at", "-id")
        .values_list("values", flat=True)
        .first()
    )


_UNSET: Any = object()


def _refresh_thread(
    thread_id: UUID | None, *, values: Any = _UNSET, finished_status: str | None = None
) -> str | None:
    """Derive the thread's status from its runs (and optionally store new values).

    busy: a pending or running run; interrupted: a suspended run; error: the last finished run
    failed; idle otherwise. Caller holds the thread lock. One UPDATE: the active-run checks are
    subqueries of it, evaluated under the lock.
    """
    if thread_id is None:
        return None
    runs = Run.objects.filter(thread_id=thread_id, parent_run__isnull=True)
    if finished_status is not None:
        # The caller just finished a run: it is the thread's last finished run.
        failed = finished_status in (RunStatus.ERROR, RunStatus.TIMEOUT)
    else:
        last = (
            runs.filter(status__in=TERMINAL_STATUSES)
            .order_by(F("finished_at").desc(nulls_last=True), "-created_at")
            .values_list("status", flat=True)
            .first()
        )
        failed = last in (RunStatus.ERROR, RunStatus.TIMEOUT)
    idle = ThreadStatus.ERROR if failed else ThreadStatus.IDLE
    status = Case(
        When(
            Exists(runs.filter(status__in=(RunStatus.PENDING, RunStatus.RUNNING))),
            then=Value(ThreadStatus.BUSY),
        ),
        When(Exists(runs.filter(status=RunStatus.SUSPENDED)), then=Value(ThreadStatus.INTERRUPTED)),
        default=Value(idle),
    )
    update: dict[str, Any] = {"status": status, "updated_at": _now()}
    if values is not _UNSET:
        update["values"] = values
    rows = _update_returning(Thread.objects.filter(id=thread_id), ["status"], **update)
    return rows[0][0] if rows else None


def _check_scope(obj: Thread | Run, pinned_resource_id: str | None, what: str) -> None:
    # An API key pinned to a resource sees nothing else: out of scope looks like not found.
    if pinned_resource_id is not None and obj.resource_id != pinned_resource_id:
        raise NotFound(f"{what} {obj.id} not found")


def _check_json_size(value: Any, field_name: str, limit: int = 1_000_000) -> None:
    """Refuse values PostgreSQL's jsonb cannot store (NaN, Infinity, NUL) or that are too big."""
    import json

    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ValidationFailed(
            f"{field_name} is not valid JSON (NaN and Infinity are not allowed)",
            errors=[{"field": field_name, "message": "not valid JSON"}],
        ) from None
    if "\\u0000" in text:
        raise ValidationFailed(
            f"{field_name} contains a NUL character (\\u0000), which cannot be stored",
            errors=[{"field": field_name, "message": "contains \\u0000"}],
        )
    if len(text) > limit:
        raise ValidationFailed(
            f"{field_name} is too large ({len(text)} bytes, limit {limit})",
            errors=[{"field": field_name, "message": "too large"}],
        )


# --------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------


def thread_create(
    *,
    metadata: dict[str, Any] | None = None,
    thread_id: UUID | None = None,
    if_exists: str = "raise",
    pinned_resource_id: str | None = None,
) -> Thread:
    metadata = dict(metadata or {})
    if if_exists not in ("raise", "do_nothing"):
        raise ValidationFailed(
            f"if_exists must be 'raise' or 'do_nothing', not {if_exists!r}",
            errors=[{"field": "if_exists", "message": "must be 'raise' or 'do_nothing'"}],
        )
    _check_json_size(metadata, "metadata")
    resource = metadata.get("resource_id")
    # A pinned API key always wins over what the client sends.
    resource_id = pinned_resource_id if pinned_resource_id is not None else resource
    if resource_id is not None and not isinstance(resource_id, str):
        resource_id = str(resource_id)
    if pinned_resource_id is not None:
        metadata["resource_id"] = pinned_resource_id
    with transaction.atomic():
        if thread_id is not None:
            existing = Thread.objects.filter(id=thread_id).first()
            if existing is not None:
                in_scope = pinned_resource_id is None or existing.resource_id == pinned_resource_id
                if if_exists == "do_nothing" and in_scope:
                    return existing
                raise Conflict(f"Thread with ID {thread_id} already exists", code="thread_exists")
        try:
            with transaction.atomic():
                thread = Thread.objects.create(
                    id=thread_id or Thread._meta.pk.default(),
                    metadata=metadata,
                    resource_id=resource_id,
                )
        except IntegrityError:
            raise Conflict(
                f"Thread with ID {thread_id} already exists", code="thread_exists"
            ) from None
    return thread


def thread_update(*, thread: Thread, metadata: dict[str, Any]) -> Thread:
    """Merge `metadata` into the thread's metadata (keys set to None are kept as None)."""
    if not isinstance(metadata, dict):
        raise ValidationFailed(
            "metadata must be an object", errors=[{"field": "metadata", "message": "not an object"}]
        )
    with transaction.atomic():
        _lock_thread(thread.id)
        thread.refresh_from_db()
        merged = {**thread.metadata, **metadata}
        _check_json_size(merged, "metadata")
        if thread.resource_id is not None:
            merged["resource_id"] = thread.metadata.get("resource_id", thread.resource_id)
        thread.metadata = merged
        thread.save(update_fields=["metadata", "updated_at"])
    return thread


def thread_delete(*, thread: Thread, actor: Actor) -> None:
    with transaction.atomic():
        _lock_thread(thread.id)
        active = list(
            Run.objects.filter(thread_id=thread.id, status__in=ACTIVE_STATUSES).values_list(
                "id", flat=True
            )
        )
        if active:
            # Running work would be orphaned; their workers' fenced writes fail and they stop.
            _notify_cancel_many(active)
        _audit(
            actor=actor,
            action="thread_delete",
            thread_id=thread.id,
            reason=f"deleted thread with {len(active)} active run(s)",
            before={"active_runs": [str(r) for r in active]},
        )
        Thread.objects.filter(id=thread.id).delete()


def thread_update_state(*, thread: Thread, values: Any, actor: Actor) -> Checkpoint:
    """Write a checkpoint by hand (LangGraph `POST /threads/{id}/state`)."""
    if values is not None and not isinstance(values, dict):
        raise ValidationFailed(
            "values must be an object or null",
            errors=[{"field": "values", "message": "must be an object or null"}],
        )
    _check_json_size(values, "values")
    with transaction.atomic():
        _lock_thread(thread.id)
        if Run.objects.filter(
            thread_id=thread.id, status__in=(RunStatus.PENDING, RunStatus.RUNNING)
        ).exists():
            raise Conflict(f"Thread {thread.id} has in-flight runs", code="thread_busy")
        parent = (
            Checkpoint.objects.filter(thread_id=thread.id).order_by("-created_at", "-id").first()
        )
        merged = {**(parent.values if parent else {}), **(values or {})}
        checkpoint = Checkpoint.objects.create(
            thread_id=thread.id, run=None, parent=parent, step=0, values=merged, pending=[]
        )
        Thread.objects.filter(id=thread.id).update(values=merged, updated_at=_now())
        _audit(actor=actor, action="state_update", thread_id=thread.id, after=values)
    return checkpoint


# --------------------------------------------------------------------------------------------
# Creating runs
# --------------------------------------------------------------------------------------------


def _validate_choice(value: str, choices: Iterable[str], field_name: str) -> str:
    allowed = list(choices)
    if value not in allowed:
        raise ValidationFailed(
            f"{field_name} must be one of {', '.join(allowed)}; got {value!r}",
            errors=[{"field": field_name, "message": f"must be one of {', '.join(allowed)}"}],
        )
    return value


def run_create(
    *,
    agent_id: str,
    actor: Actor,
    thread_id: UUID | None = None,
    input: Any = None,
    command: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    multitask_strategy: str = MultitaskStrategy.ENQUEUE,
    if_not_exists: str = "reject",
    after_seconds: float | None = None,
    pinned_resource_id: str | None = None,
) -> Run:
    """Create a run (or, with `command.resume`, resume the thread's suspended run).

    Without a thread the run is stateless: it gets a temporary thread, deleted at the end when
    `kwargs["on_completion"]` is "delete" (the default).
    """
    agent = get_agent(agent_id)
    _validate_choice(multitask_strategy, MultitaskStrategy.values, "multitask_strategy")
    _validate_choice(if_not_exists, ("reject", "create"), "if_not_exists")
    if after_seconds is not None and (after_seconds < 0 or after_seconds > 86400 * 365):
        raise ValidationFailed(
            "after_seconds must be between 0 and one year",
            errors=[{"field": "after_seconds", "message": "out of range"}],
        )
    if command:
        if "resume" not in command:
            raise ValidationFailed(
                "command supports only 'resume' (update and goto are not available)",
                errors=[{"field": "command", "message": "only 'resume' is supported"}],
            )
        if thread_id is None:
            raise ValidationFailed(
                "You must provide a thread_id when resuming.",
                errors=[{"field": "thread_id", "message": "required with command.resume"}],
            )
        thread = _thread_in_scope(thread_id, pinned_resource_id)
        return thread_resume(thread=thread, resume=command["resume"], actor=actor)

    errors = agent.input_errors(input)
    if errors:
        raise ValidationFailed(
            f"input does not match agent {agent_id}'s input schema",
            errors=[
                {**e, "field": f"input.{e['field']}" if e["field"] != "(root)" else "input"}
                for e in errors
            ],
        )
    _check_json_size(input, "input")
    _check_json_size(metadata or {}, "metadata")
    kwargs = dict(kwargs or {})

    with transaction.atomic():
        if thread_id is None:
            thread = Thread.objects.create(
                metadata={"stateless": True, "graph_id": agent_id},
                resource_id=pinned_resource_id,
            )
            kwargs.setdefault("on_completion", "delete")
        else:
            thread = Thread.objects.filter(id=thread_id).first()
            if thread is None or (
                pinned_resource_id is not None and thread.resource_id != pinned_resource_id
            ):
                if if_not_exists != "create" or thread is not None:
                    raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
                thread = thread_create(
                    thread_id=thread_id,
                    metadata={"graph_id": agent_id},
                    pinned_resource_id=pinned_resource_id,
                )
        _lock_thread(thread.id)
        inflight = list(
            Run.objects.select_for_update(no_key=True)
            .filter(
                thread_id=thread.id,
                parent_run__isnull=True,
                status__in=(RunStatus.PENDING, RunStatus.RUNNING),
            )
            .order_by("id")
        )
        if inflight and multitask_strategy == MultitaskStrategy.REJECT:
            raise Conflict(REJECT_MESSAGE, code="thread_busy")
        now = _now()
        run = Run.objects.create(
            thread=thread,
            agent_id=agent_id,
            resource_id=thread.resource_id,
            status=RunStatus.PENDING,
            input=input,
            metadata=metadata or {},
            kwargs=kwargs,
            multitask_strategy=multitask_strategy,
            not_before=now + timedelta(seconds=after_seconds) if after_seconds else None,
        )
        seq = _append_events(
            run.id,
            [
                (
                    "created",
                    {"input": input, "multitask_strategy": multitask_strategy},
                    actor_name(actor),
                )
            ],
        )
        run.last_seq = seq
        if inflight and multitask_strategy in (
            MultitaskStrategy.INTERRUPT,
            MultitaskStrategy.ROLLBACK,
        ):
            for old in inflight:
                _cancel_locked(
                    old,
                    action=multitask_strategy,
                    actor=actor,
                    reason=f"multitask_strategy={multitask_strategy} by run {run.id}",
                )
        _refresh_thread(thread.id)
        _notify(QUEUE_CHANNEL)
        _publish(run)
    return run


def _thread_in_scope(thread_id: UUID, pinned_resource_id: str | None) -> Thread:
    thread = Thread.objects.filter(id=thread_id).first()
    if thread is None:
        raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
    _check_scope(thread, pinned_resource_id, "Thread")
    return thread


def run_create_child(*, lease: Lease, tool_call: ToolCall, agent_id: str, input: Any) -> Lease:
    """Start (or take over) the sub-agent run of a delegation tool call, owned like its parent.

    The child never enters the queue: the parent's worker executes it inline, so it inherits the
    parent's lease owner. Re-executing after a crash takes the child over from the dead worker.
    """
    get_agent(agent_id)
    with transaction.atomic():
        _fence(lease)
        parent = Run.objects.get(id=lease.run_id)
        child_id = ToolCall.objects.filter(id=tool_call.id).values_list("child_run", flat=True)[0]
        now = _now()
        if child_id is None:
            child = Run.objects.create(
                thread=None,
                agent_id=agent_id,
                parent_run=parent,
                resource_id=parent.resource_id,
                status=RunStatus.RUNNING,
                input=input,
                metadata={"parent_tool_call_id": tool_call.tool_call_id},
                attempt=1,
                lease_owner=lease.owner,
                lease_expires_at=parent.lease_expires_at,
                started_at=now,
            )
            ToolCall.objects.filter(id=tool_call.id).update(child_run=child)
            seq = _append_events(
                child.id,
                [("created", {"input": input, "parent_run_id": str(parent.id)}, "system")],
            )
            seq = _append_events(child.id, [("started", {"attempt": 1}, "system")])
            child.last_seq = seq
        else:
            child = Run.objects.select_for_update(no_key=True).get(id=child_id)
            if child.status in TERMINAL_STATUSES:
                return Lease(
                    child.id, child.lease_owner or "", child.attempt, None, agent_id, parent.id
                )
            child.status = RunStatus.RUNNING
            child.attempt += 1
            child.lease_owner = lease.owner
            child.lease_expires_at = parent.lease_expires_at
            child.save(
                update_fields=["status", "attempt", "lease_owner", "lease_expires_at", "updated_at"]
            )
            child.last_seq = _append_events(
                child.id, [("started", {"attempt": child.attempt}, "system")]
            )
        _publish(child)
    return Lease(child.id, lease.owner, child.attempt, None, agent_id, lease.run_id)


# --------------------------------------------------------------------------------------------
# The queue: claim, heartbeat, reap, release (used by runs/engine/worker.py)
# --------------------------------------------------------------------------------------------

_CLAIM_SQL_POSTGRES = """
WITH candidate AS (
    SELECT r.id, r.started_at IS NULL AS fresh
      FROM runs_run r,
           -- A claim lost in a database crash leaves the run pending (safe), and the worker's
           -- next synchronous commit flushes it anyway: no need to wait for the WAL flush.
           (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
     WHERE r.status = 'pending' AND r.parent_run_id IS NULL
       AND (r.not_before IS NULL OR r.not_before <= %(now)s)
       -- r is the head of its thread's queue, and its thread runs nothing. Written as scalar
       -- subqueries over small partial indexes so the plan stays per-row index lookups even
       -- when statistics are stale (a burst on a fresh table turned NOT EXISTS anti-joins into
       -- O(n^2) plans: 7 s per claim with 6,000 queued runs).
       AND r.id = (SELECT o.id FROM runs_run o
                    WHERE o.thread_id = r.thread_id AND o.status = 'pending'
                      AND o.parent_run_id IS NULL
                    ORDER BY o.created_at, o.id LIMIT 1)
       AND (SELECT o.id FROM runs_run o
             WHERE o.thread_id = r.thread_id AND o.status = 'running' LIMIT 1) IS NULL
     ORDER BY r.created_at, r.id
     LIMIT %(limit)s
     FOR UPDATE OF r SKIP LOCKED
), claimed AS (
    UPDATE runs_run SET status = 'running', lease_owner = %(owner)s,
           attempt = runs_run.attempt + 1, lease_expires_at = %(expires)s,
           deadline_at = %(deadline)s, started_at = COALESCE(runs_run.started_at, %(now)s),
           updated_at = %(now)s, last_seq = runs_run.last_seq + 1
      FROM candidate WHERE runs_run.id = candidate.id
    RETURNING runs_run.*, candidate.fresh
), started AS (
    INSERT INTO runs_runevent (run_id, seq, kind, data, actor, created_at)
    SELECT id, last_seq, 'started',
           jsonb_build_object('attempt', attempt, 'worker', %(owner)s::text), '', %(now)s
      FROM claimed
)
SELECT claimed.*, base.id AS base_checkpoint_id, base.values AS base_values
  FROM claimed
  LEFT JOIN LATERAL (
        SELECT c.id, c.values FROM runs_checkpoint c
         WHERE c.thread_id = claimed.thread_id
         ORDER BY c.created_at DESC, c.id DESC LIMIT 1) base ON claimed.fresh
"""
# One statement, one round trip: pick (the CTE is an optimisation fence: with `WHERE id IN
# (subquery … LIMIT)` the planner may re-run the subquery per row and lock more rows than
# LIMIT, as Oban's engine notes), claim, write the `started` events, and fetch the thread state
# a fresh run starts from.


def run_claim(*, owner: str, limit: int = 1) -> list[ClaimedRun]:
    """Claim up to `limit` runnable runs: oldest pending whose thread has no running run.

    Each claimed Run carries `fresh` (never started before: no checkpoint of its own) and, on
    PostgreSQL, `base_checkpoint_id`/`base_values` (the thread state it starts from).
    """
    now = _now()
    expires = now + timedelta(seconds=settings.RUNS_LEASE_SECONDS)
    # Default deadline (+ grace) so the reaper can time out a run stuck in a tool; agents with
    # their own time limit move it when they start.
    deadline = now + timedelta(seconds=settings.RUNS_DEFAULT_TIME_LIMIT + 5)
    params = {"now": now, "limit": limit, "owner": owner, "expires": expires, "deadline": deadline}
    for _ in range(5):
        try:
            if _is_postgres():
                runs = list(Run.objects.raw(_CLAIM_SQL_POSTGRES, params))
                for run in runs:
                    if isinstance(run.base_values, str):
                        run.base_values = json.loads(run.base_values)
            else:
                with transaction.atomic():
                    runs = _claim_sqlite(**params)
                    RunEvent.objects.bulk_create(
                        RunEvent(
                            run_id=r.id,
                            seq=r.last_seq,
                            kind="started",
                            data={"attempt": r.attempt, "worker": owner},
                        )
                        for r in runs
                    )
        except IntegrityError:
            # Another worker claimed a run on the same thread between our NOT EXISTS check and
            # our UPDATE (one_running_run_per_thread). Try again: the next pick skips it.
            continue
        if not runs:
            return []
        runs.sort(key=lambda r: (r.created_at, r.id))
        claimed = []
        for run in runs:
            _publish(run)
            lease = Lease(
                run.id, owner, run.attempt, run.thread_id, run.agent_id, run.parent_run_id
            )
            claimed.append(ClaimedRun(run=run, lease=lease))
        metrics.CLAIMS.inc(len(claimed))
        return claimed
    return []


def _claim_sqlite(
    *, owner: str, limit: int, now: datetime, expires: datetime, deadline: datetime
) -> list[Run]:
    # SQLite serialises writers (IMMEDIATE transactions), so a read-then-conditional-update in
    # one transaction cannot race; there is no SKIP LOCKED to need.
    busy_threads = set(
        Run.objects.filter(status=RunStatus.RUNNING, thread__isnull=False).values_list(
            "thread_id", flat=True
        )
    )
    seen: set[UUID] = set()
    chosen: list[UUID] = []
    candidates = (
        Run.objects.filter(status=RunStatus.PENDING, parent_run__isnull=True)
        .order_by("created_at", "id")
        .values_list("id", "thread_id", "not_before")
    )
    for rid, tid, not_before in candidates.iterator():
        if tid in busy_threads or tid in seen:
            seen.add(tid)
            continue
        seen.add(tid)  # later runs on this thread wait for this one (FIFO per thread)
        if not_before is not None and not_before > now:
            continue
        chosen.append(rid)
        if len(chosen) >= limit:
            break
    if not chosen:
        return []
    fresh = set(
        Run.objects.filter(id__in=chosen, started_at__isnull=True).values_list("id", flat=True)
    )
    Run.objects.filter(id__in=chosen, status=RunStatus.PENDING).update(
        status=RunStatus.RUNNING,
        lease_owner=owner,
        attempt=F("attempt") + 1,
        lease_expires_at=expires,
        deadline_at=deadline,
        updated_at=now,
        last_seq=F("last_seq") + 1,
    )
    Run.objects.filter(id__in=chosen, started_at__isnull=True).update(started_at=now)
    runs = list(Run.objects.filter(id__in=chosen, lease_owner=owner, status=RunStatus.RUNNING))
    for run in runs:
        run.fresh = run.id in fresh
    return runs


def run_heartbeat(*, owner: str, run_ids: Sequence[UUID]) -> dict[UUID, str | None]:
    """Renew the leases of the runs this worker holds; also reads their cancel requests.

    Returns {run_id: cancel_action or None} for the runs still held. A run missing from the
    answer was lost (reaped, cancelled with rollback, deleted): its executor must stop.
    """
    if not run_ids:
        return {}
    now = _now()
    rows = _update_returning(
        Run.objects.filter(id__in=list(run_ids), lease_owner=owner, status=RunStatus.RUNNING),
        ["id", "cancel_action"],
        lease_expires_at=now + timedelta(seconds=settings.RUNS_LEASE_SECONDS),
    )
    return {rid: action for rid, action in rows}


def run_set_deadline(*, lease: Lease, deadline: datetime) -> None:
    Run.objects.filter(
        id=lease.run_id, lease_owner=lease.owner, attempt=lease.attempt, status=RunStatus.RUNNING
    ).update(deadline_at=deadline)


def runs_reap(*, max_attempts: int | None = None) -> dict[str, int]:
    """Return runs whose worker vanished to the queue (or fail them after too many attempts).

    Safe on every worker at once: the statements only touch rows whose lease already expired,
    and a run claimed again in between no longer matches.
    """
    max_attempts = max_attempts or settings.RUNS_MAX_ATTEMPTS
    try:
        return _reap(max_attempts)
    except OperationalError as exc:
        # A lock held by a frozen process: try again on the next round rather than hang.
        logger.warning("reaper: skipped a round (%s)", exc)
        return {"requeued": 0, "failed": 0, "cancelled": 0, "timed_out": 0}


def _lock_timeout() -> None:
    if _is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")


def _reap(max_attempts: int) -> dict[str, int]:
    now = _now()
    counts = {"requeued": 0, "failed": 0, "cancelled": 0, "timed_out": 0}
    expired = Q(status=RunStatus.RUNNING, lease_expires_at__lt=now, parent_run__isnull=True)

    # A pending cancel request wins over a retry: the user asked for the run to stop.
    for run_id in Run.objects.filter(expired, cancel_requested_at__isnull=False).values_list(
        "id", flat=True
    ):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, expired)
            if run is not None:
                _apply_cancel(run, action=run.cancel_action or CancelAction.INTERRUPT, actor=None)
                counts["cancelled"] += 1
                metrics.REAPED.labels("cancelled").inc()

    with transaction.atomic():
        _lock_timeout()
        rows = _update_returning(
            Run.objects.filter(expired, cancel_requested_at__isnull=True, attempt__lt=max_attempts),
            ["id", "thread_id", "last_seq", "attempt"],
            status=RunStatus.PENDING,
            lease_owner=None,
            lease_expires_at=None,
            deadline_at=None,
            updated_at=now,
            last_seq=F("last_seq") + 1,
        )
        if rows:
            RunEvent.objects.bulk_create(
                RunEvent(
                    run_id=rid,
                    seq=seq,
                    kind="lease_expired",
                    data={"attempt": attempt, "requeued": True},
                )
                for rid, _tid, seq, attempt in rows
            )
            _notify(QUEUE_CHANNEL)
            for run in Run.objects.filter(id__in=[r[0] for r in rows]):
                _publish(run)
            counts["requeued"] = len(rows)
            logger.info("reaper: requeued %d run(s) whose lease expired", len(rows))
            metrics.REAPED.labels("requeued").inc(len(rows))

    for run_id in Run.objects.filter(
        expired, cancel_requested_at__isnull=True, attempt__gte=max_attempts
    ).values_list("id", flat=True):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, expired)
            if run is not None:
                error = {
                    "error": "LeaseExpired",
                    "message": f"the worker running it stopped responding {run.attempt} time(s)",
                }
                _finish_locked(run, status=RunStatus.ERROR, error=error, kind="lease_expired")
                counts["failed"] += 1
                metrics.REAPED.labels("failed").inc()

    for run_id in Run.objects.filter(
        status=RunStatus.RUNNING, parent_run__isnull=True, deadline_at__lt=now
    ).values_list("id", flat=True):
        with transaction.atomic():
            _lock_timeout()
            run = _lock_run_if(run_id, Q(status=RunStatus.RUNNING, deadline_at__lt=now))
            if run is not None:
                error = {"error": "TimeoutError", "message": "run exceeded its time limit"}
                _finish_locked(run, status=RunStatus.TIMEOUT, error=error, kind="finished")
                counts["timed_out"] += 1
                metrics.REAPED.labels("timed_out").inc()
    return counts


def _lock_run_if(run_id: UUID, condition: Q) -> Run | None:
    try:
        run = _lock_run(run_id)
    except NotFound:
        return None
    if not Run.objects.filter(condition, id=run_id).exists():
        return None
    return run


def run_release(*, lease: Lease) -> bool:
    """Give a claimed run back to the queue (graceful shutdown). It does not count as an attempt."""
    with transaction.atomic():
        rows = _update_returning(
            Run.objects.filter(
                id=lease.run_id,
                lease_owner=lease.owner,
                attempt=lease.attempt,
                status=RunStatus.RUNNING,
            ),
            ["last_seq"],
            status=RunStatus.PENDING,
            lease_owner=None,
            lease_expires_at=None,
            deadline_at=None,
            attempt=F("attempt") - 1,
            last_seq=F("last_seq") + 1,
            updated_at=_now(),
        )
        if not rows:
            return False
        _insert_events(
            lease.run_id, rows[0][0], [("released", {"attempt": lease.attempt}, "system")]
        )
        _notify(QUEUE_CHANNEL)
        _publish(Run.objects.get(id=lease.run_id))
    return True


# --------------------------------------------------------------------------------------------
# Fenced writes from the step loop
# --------------------------------------------------------------------------------------------


def _fence(lease: Lease, *, events: int = 0, **changes: Any) -> FenceResult:
    """Check that `lease` still holds the run, reserving `events` sequence numbers.

    One statement: UPDATE … WHERE id, owner, attempt, status=running RETURNING. It also takes
    the run's row lock for the rest of the transaction, and applies `changes` to the row.
    """
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
        raise LeaseLost(
            f"run {lease.run_id}: lease (owner {lease.owner}, attempt {lease.attempt}) lost"
        )
    return FenceResult(last_seq=rows[0][0], cancel_action=rows[0][1])


def _complete_lease(lease: Lease) -> Lease:
    """Fill in a lease built by hand (tests, older callers) from the run row."""
    if lease.agent_id:
        return lease
    row = (
        Run.objects.filter(id=lease.run_id).values("thread_id", "agent_id", "parent_run_id").first()
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
    )


def _step_event(w: StepWrite) -> tuple[str, dict[str, Any], str]:
    return ("step", {"step": w.step, "checkpoint_id": str(w.id), "values": w.values}, "system")


def _write_steps(lease: Lease, steps: Sequence[StepWrite]) -> None:
    Checkpoint.objects.bulk_create(
        Checkpoint(
            id=w.id,
            thread_id=lease.thread_id if lease.parent_run_id is None else None,
            run_id=lease.run_id,
            parent_id=w.parent_id,
            step=w.step,
            values=w.values,
            pending=w.pending,
        )
        for w in steps
    )


def run_save_steps(
    *,
    lease: Lease,
    steps: Sequence[StepWrite],
    new_tool_calls: Sequence[dict[str, Any]] = (),
    events: Sequence[tuple[str, dict[str, Any], str]] = (),
) -> FenceResult:
    """Write steps (checkpoints), the tool calls the model proposed, and timeline events."""
    lease = _complete_lease(lease)
    with transaction.atomic():
        all_events = [*events, *(_step_event(w) for w in steps)]
        fence = _fence(lease, events=len(all_events))
        _write_steps(lease, steps)
        if new_tool_calls:
            step = steps[-1].step if steps else 0
            ToolCall.objects.bulk_create(
                ToolCall(run_id=lease.run_id, step=step, **tc) for tc in new_tool_calls
            )
        _insert_events(lease.run_id, fence.last_seq, all_events)
        _publish_fenced(lease, fence.last_seq)
    return fence


def _publish_fenced(lease: Lease, seq: int, status: str = RunStatus.RUNNING) -> None:
    live.run_changed_on_commit(
        live.RunChange(
            run_id=str(lease.run_id),
            thread_id=str(lease.thread_id) if lease.thread_id else None,
            agent_id=lease.agent_id,
            status=status,
            seq=seq,
            parent_run_id=str(lease.parent_run_id) if lease.parent_run_id else None,
        )
    )


def tool_call_update(
    *,
    lease: Lease,
    tool_call: ToolCall,
    status: str,
    result: Any = _UNSET,
    event: tuple[str, dict[str, Any], str] | None = None,
) -> FenceResult:
    """Record a tool call's progress (running / succeeded / failed) under the run's fence."""
    lease = _complete_lease(lease)
    with transaction.atomic():
        fence = _fence(lease, events=1 if event else 0)
        now = _now()
        update: dict[str, Any] = {"status": status}
        if status == ToolCallStatus.RUNNING:
            update["started_at"] = now
        if status in (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED):
            update["finished_at"] = now
        if result is not _UNSET:
            update["result"] = result
        ToolCall.objects.filter(id=tool_call.id).update(**update)
        for key, value in update.items():
            setattr(tool_call, key, value)
        if event:
            _insert_events(lease.run_id, fence.last_seq, [event])
            _publish_fenced(lease, fence.last_seq)
    return fence


def run_emit(*, lease: Lease, kind: str, data: dict[str, Any]) -> None:
    """A custom event from inside a tool (`ctx.emit`), streamed as LangGraph `custom`."""
    _check_json_size(data, "data", limit=256_000)
    lease = _complete_lease(lease)
    with transaction.atomic():
        fence = _fence(lease, events=1)
        _insert_events(lease.run_id, fence.last_seq, [(kind, data, "system")])
        _publish_fenced(lease, fence.last_seq)


def run_suspend(*, plans: Sequence[SuspendPlan], values: dict[str, Any] | None = None) -> str:
    """Park one run (or a supervisor with its sub-agents, innermost first) for a human.

    All plans commit together: a reviewer deciding the sub-agent's call can never find the
    supervisor still running (and so miss the supervisor's delegation call). A cancel
    requested while the run was still running wins: the run is cancelled instead of parked.
    Returns the outer run's new status ("suspended", "interrupted" or "deleted").
    """
    with transaction.atomic():
        outer = plans[-1].lease
        thread_id = Run.objects.filter(id=outer.run_id).values_list("thread_id", flat=True).first()
        _lock_thread(thread_id)
        outer_fence = _fence(outer, events=1)
        if outer_fence.cancel_action:
            run = Run.objects.select_for_update(no_key=True).get(id=outer.run_id)
            _apply_cancel(run, action=outer_fence.cancel_action, actor=None)
            return "deleted" if outer_fence.cancel_action == CancelAction.ROLLBACK else run.status
        now = _now()
        for plan in plans:
            fence = outer_fence if plan is plans[-1] else _fence(plan.lease, events=1)
            interrupts = []
            for w in plan.waiting:
                ToolCall.objects.filter(
                    run_id=plan.lease.run_id, tool_call_id=w["tool_call_id"]
                ).update(
                    status=w["status"],
                    requires_approval=w.get("requires_approval", False),
                    suspend_payload=w.get("suspend_payload"),
                    resume_schema=w.get("resume_schema"),
                    suspended_at=now,
                )
                interrupts.append(_interrupt_of(w))
            Run.objects.filter(id=plan.lease.run_id).update(
                status=RunStatus.SUSPENDED,
                suspended_at=now,
                lease_owner=None,
                lease_expires_at=None,
                deadline_at=None,
                updated_at=now,
            )
            _insert_events(
                plan.lease.run_id,
                fence.last_seq,
                [("suspended", {"interrupts": interrupts}, "system")],
            )
            run = Run.objects.get(id=plan.lease.run_id)
            logger.info(
                "suspend run=%s agent=%s attempt=%s waiting=%s",
                run.id,
                run.agent_id,
                run.attempt,
                [w["tool_call_id"] for w in plan.waiting],
            )
            _publish(run)
        if thread_id is not None:
            latest = values if values is not None else _latest_thread_values(thread_id)
            _refresh_thread(thread_id, values=latest)
    metrics.SUSPENSIONS.inc(len(plans))
    return RunStatus.SUSPENDED


def _interrupt_of(w: dict[str, Any]) -> dict[str, Any]:
    """The LangGraph-style interrupt a waiting tool call shows to clients."""
    if w["status"] == ToolCallStatus.AWAITING_APPROVAL:
        value = {
            "type": "approval",
            "tool_call_id": w["tool_call_id"],
            "tool_name": w.get("tool_name"),
            "args": w.get("args"),
        }
        if w.get("suspend_payload") is not None:
            value["payload"] = w["suspend_payload"]
    else:
        value = {
            "type": "input",
            "tool_call_id": w["tool_call_id"],
            "tool_name": w.get("tool_name"),
            "payload": w.get("suspend_payload"),
            "resume_schema": w.get("resume_schema"),
        }
    return {"id": w["tool_call_id"], "value": value}


def run_finish(
    *,
    lease: Lease,
    status: str,
    output: Any = None,
    error: dict[str, Any] | None = None,
    values: Any = _UNSET,
    steps: Sequence[StepWrite] = (),
    events: Sequence[tuple[str, dict[str, Any], str]] = (),
) -> FenceResult:
    """End a run the worker holds (success, error or timeout), with its last steps, in one go.

    The common path (an agent that answers at once) is a single transaction: lock the thread,
    one fenced UPDATE that also ends the run, bulk inserts, and the thread's new status.
    """
    _validate_choice(status, (RunStatus.SUCCESS, RunStatus.ERROR, RunStatus.TIMEOUT), "status")
    finished: dict[str, Any] = {"status": status}
    if output is not None:
        finished["output"] = output
    if error is not None:
        finished["error"] = error
    all_events = [*events, *(_step_event(w) for w in steps), ("finished", finished, "system")]
    lease = _complete_lease(lease)
    if (
        _is_postgres()
        and status == RunStatus.SUCCESS
        and lease.parent_run_id is None
        and lease.thread_id is not None
    ):
        if values is _UNSET:
            values = steps[-1].values if steps else _latest_thread_values(lease.thread_id)
        return _finish_success_postgres(lease, output, values, steps, all_events)
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
            lease_owner=None,
            lease_expires_at=None,
            deadline_at=None,
        )
        _write_steps(lease, steps)
        _insert_events(lease.run_id, fence.last_seq, all_events)
        if status != RunStatus.SUCCESS:
            _fail_children(lease.run_id, status)
        if lease.parent_run_id is None and lease.thread_id is not None:
            if values is _UNSET:
                values = steps[-1].values if steps else _latest_thread_values(lease.thread_id)
            _refresh_thread(lease.thread_id, values=values, finished_status=status)
        _publish_fenced(lease, fence.last_seq, status=status)
    return fence


_FINISH_SQL_POSTGRES = """
WITH f AS (
    UPDATE runs_run
       SET status = 'success', output = %(output)s::jsonb, error = NULL, finished_at = %(now)s,
           lease_owner = NULL, lease_expires_at = NULL, deadline_at = NULL, updated_at = %(now)s,
           last_seq = last_seq + %(n_events)s
     WHERE id = %(run)s AND lease_owner = %(owner)s AND attempt = %(attempt)s
       AND status = 'running'
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
), thread AS (
    -- The run's own row still reads `running` in this statement's snapshot: leave it out.
    UPDATE runs_thread
       SET status = CASE
             WHEN EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = %(thread)s
                             AND o.parent_run_id IS NULL AND o.id <> %(run)s
                             AND o.status IN ('pending', 'running')) THEN 'busy'
             WHEN EXISTS (SELECT 1 FROM runs_run o WHERE o.thread_id = %(thread)s
                             AND o.parent_run_id IS NULL AND o.id <> %(run)s
                             AND o.status = 'suspended') THEN 'interrupted'
             ELSE 'idle' END,
           values = %(values)s::jsonb, updated_at = %(now)s
     WHERE id = %(thread)s AND EXISTS (SELECT 1 FROM f)
)
SELECT last_seq, cancel_action FROM f
"""


def _finish_success_postgres(
    lease: Lease,
    output: Any,
    values: Any,
    steps: Sequence[StepWrite],
    all_events: Sequence[tuple[str, dict[str, Any], str]],
) -> FenceResult:
    """The common end of a run as two statements: lock the thread, then one statement that
    fences and ends the run, writes its last steps and events, and updates the thread."""
    params = {
        "run": lease.run_id,
        "owner": lease.owner,
        "attempt": lease.attempt,
        "thread": lease.thread_id,
        "now": _now(),
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
                for w in steps
            ],
            allow_nan=False,
        ),
        "events": json.dumps(
            [{"kind": k, "data": d, "actor": a} for k, d, a in all_events], allow_nan=False
        ),
    }
    with transaction.atomic():
        _lock_thread(lease.thread_id)
        with connection.cursor() as cursor:
            cursor.execute(_FINISH_SQL_POSTGRES, params)
            row = cursor.fetchone()
        if row is None:
            raise LeaseLost(
                f"run {lease.run_id}: lease (owner {lease.owner}, attempt {lease.attempt}) lost"
            )
        _publish_fenced(lease, row[0], status=RunStatus.SUCCESS)
    return FenceResult(last_seq=row[0], cancel_action=row[1])


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
    output: Any = None,
    error: dict[str, Any] | None = None,
    values: Any = _UNSET,
    kind: str = "finished",
) -> None:
    now = _now()
    run.status = status
    run.output = output
    run.error = error
    run.finished_at = now
    run.lease_owner = None
    run.lease_expires_at = None
    run.deadline_at = None
    run.save(
        update_fields=[
            "status",
            "output",
            "error",
            "finished_at",
            "lease_owner",
            "lease_expires_at",
            "deadline_at",
            "updated_at",
        ]
    )
    data: dict[str, Any] = {"status": status}
    if output is not None:
        data["output"] = output
    if error is not None:
        data["error"] = error
    run.last_seq = _append_events(run.id, [(kind, data, "system")])
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
    _publish(run)


def run_fail_attempt(*, lease: Lease, error: dict[str, Any]) -> Run:
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
        run.lease_owner = None
        run.lease_expires_at = None
        run.deadline_at = None
        run.save(
            update_fields=["status", "lease_owner", "lease_expires_at", "deadline_at", "updated_at"]
        )
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
    """The worker stopped a run whose cancel was requested: apply interrupt or rollback."""
    with transaction.atomic():
        thread_id = Run.objects.filter(id=lease.run_id).values_list("thread_id", flat=True).first()
        _lock_thread(thread_id)
        fence = _fence(lease)
        run = Run.objects.select_for_update(no_key=True).get(id=lease.run_id)
        _apply_cancel(run, action=fence.cancel_action or CancelAction.INTERRUPT, actor=None)
        return None if fence.cancel_action == CancelAction.ROLLBACK else run


# --------------------------------------------------------------------------------------------
# Cancellation
# --------------------------------------------------------------------------------------------


def _notify_cancel_many(run_ids: Sequence[UUID]) -> None:
    # One notification per batch keeps the payload under PostgreSQL's 8000-byte limit.
    ids = [str(r) for r in run_ids]
    for i in range(0, len(ids), 200):
        _notify(CANCEL_CHANNEL, ",".join(ids[i : i + 200]))


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
        locked = _lock_run(run.id)
        if locked.parent_run_id is not None:
            raise Conflict(
                f"Run {run.id} is a sub-agent run; cancel its supervisor run "
                f"{locked.parent_run_id} instead",
                code="sub_agent_run",
            )
        result = _cancel_locked(locked, action=action, actor=actor, reason=reason)
    return result


def _cancel_locked(run: Run, *, action: str, actor: Actor, reason: str = "") -> Run | None:
    transaction.on_commit(lambda: metrics.CANCELS.labels(action).inc())
    if run.status in TERMINAL_STATUSES:
        raise Conflict(
            f"Run {run.id} is already {run.status}; only pending, running or suspended runs "
            "can be cancelled",
            code="run_not_active",
            extra={"status": run.status},
        )
    _audit(
        actor=actor,
        action=f"cancel_{action}",
        run=run,
        reason=reason,
        before={"status": run.status},
        after={"status": "deleted" if action == CancelAction.ROLLBACK else RunStatus.INTERRUPTED},
    )
    if run.status == RunStatus.RUNNING:
        if run.cancel_requested_at is None or run.cancel_action != action:
            now = _now()
            run.cancel_action = action
            run.cancel_requested_at = run.cancel_requested_at or now
            run.cancel_reason = reason
            run.save(
                update_fields=[
                    "cancel_action",
                    "cancel_requested_at",
                    "cancel_reason",
                    "updated_at",
                ]
            )
            run.last_seq = _append_events(
                run.id,
                [("cancel_requested", {"action": action, "reason": reason}, actor_name(actor))],
            )
            _notify(CANCEL_CHANNEL, str(run.id))
            logger.info(
                "cancel requested run=%s action=%s by=%s", run.id, action, actor_name(actor)
            )
            _publish(run)
        return run
    return _apply_cancel(run, action=action, actor=actor, reason=reason)


def _apply_cancel(run: Run, *, action: str, actor: Actor, reason: str = "") -> Run | None:
    """Stop a run now (caller holds thread + run locks and no worker is executing it)."""
    if action == CancelAction.ROLLBACK:
        _rollback_locked(run)
        return None
    now = _now()
    run.status = RunStatus.INTERRUPTED
    run.finished_at = now
    run.cancel_action = CancelAction.INTERRUPT
    run.cancel_requested_at = run.cancel_requested_at or now
    run.cancel_reason = run.cancel_reason or reason
    run.lease_owner = None
    run.lease_expires_at = None
    run.deadline_at = None
    run.save(
        update_fields=[
            "status",
            "finished_at",
            "cancel_action",
            "cancel_requested_at",
            "cancel_reason",
            "lease_owner",
            "lease_expires_at",
            "deadline_at",
            "updated_at",
        ]
    )
    run.last_seq = _append_events(
        run.id,
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
        _refresh_thread(run.thread_id, values=_latest_thread_values(run.thread_id))
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
        _refresh_thread(thread_id, values=_latest_thread_values(thread_id))


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
) -> BulkCancelResult:
    """Cancel many runs: by ids (optionally on one thread), by status, or by a filtered queryset.

    `status` is pending, running, suspended or all (every active run). Finished runs among the
    ids are skipped, not an error: a bulk action must not fail because one run just ended.
    """
    _validate_choice(action, CancelAction.values, "action")
    if status is not None and (run_ids is not None or thread_id is not None):
        raise ValidationFailed(
            "When providing a 'status', 'thread_id' and 'run_ids' must be omitted",
            errors=[{"field": "status", "message": "cannot be combined with thread_id/run_ids"}],
        )
    qs = queryset if queryset is not None else Run.objects.all()
    qs = qs.filter(parent_run__isnull=True)
    if status is not None:
        _validate_choice(status, ("pending", "running", "suspended", "all"), "status")
        statuses = ACTIVE_STATUSES if status == "all" else (status,)
        qs = qs.filter(status__in=statuses)
    elif run_ids is not None:
        qs = qs.filter(id__in=list(run_ids), status__in=ACTIVE_STATUSES)
        if thread_id is not None:
            qs = qs.filter(thread_id=thread_id)
    elif thread_id is not None:
        qs = qs.filter(thread_id=thread_id, status__in=ACTIVE_STATUSES)
    elif queryset is None:
        raise ValidationFailed(
            "Give run_ids, thread_id or status",
            errors=[
                {"field": "status", "message": "one of run_ids, thread_id, status is required"}
            ],
        )
    else:
        qs = qs.filter(status__in=ACTIVE_STATUSES)
    if pinned_resource_id is not None:
        qs = qs.filter(resource_id=pinned_resource_id)

    result = BulkCancelResult()
    targets = list(qs.order_by("thread_id", "id").values_list("id", "thread_id"))
    with transaction.atomic():
        for tid in sorted({t for _, t in targets if t is not None}):
            _lock_thread(tid)
        runs = list(
            Run.objects.select_for_update(no_key=True)
            .filter(id__in=[r for r, _ in targets], status__in=ACTIVE_STATUSES)
            .order_by("id")
        )
        for run in runs:
            outcome = _cancel_locked(run, action=action, actor=actor, reason=reason)
            if outcome is None:
                result.deleted.append(run.id)
            elif outcome.status == RunStatus.RUNNING:
                result.requested.append(run.id)
            else:
                result.interrupted.append(run.id)
    return result


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


# --------------------------------------------------------------------------------------------
# Human decisions: approve, decline, answer, resume
# --------------------------------------------------------------------------------------------


def _waiting_calls(run: Run) -> list[ToolCall]:
    return list(
        ToolCall.objects.select_for_update(no_key=True)
        .filter(run=run, status__in=PENDING_DECISION_STATUSES)
        .order_by("created_at", "id")
    )


def _pick_tool_call(run: Run, tool_call_id: str | None, decided_verb: str) -> ToolCall:
    if run.status != RunStatus.SUSPENDED:
        raise Conflict(
            f"Run {run.id} is {run.status}, not suspended; there is nothing to {decided_verb}",
            code="run_not_suspended",
            extra={"status": run.status},
        )
    if tool_call_id is None:
        waiting = _waiting_calls(run)
        if len(waiting) != 1:
            ids = [tc.tool_call_id for tc in waiting]
            raise Conflict(
                f"Run {run.id} waits on {len(ids)} tool calls; say which one with tool_call_id "
                f"(pending: {', '.join(ids)})",
                code="tool_call_required",
                extra={"pending_tool_call_ids": ids},
            )
        return waiting[0]
    tc = (
        ToolCall.objects.select_for_update(no_key=True)
        .filter(run=run, tool_call_id=tool_call_id)
        .first()
    )
    if tc is None:
        raise NotFound(
            f"Tool call {tool_call_id} not found on run {run.id}", code="tool_call_not_found"
        )
    return tc


def _ensure_waiting(tc: ToolCall, expected: Sequence[str], verb: str) -> None:
    if tc.status in expected:
        return
    if tc.decided_by:
        raise AlreadyDecided(
            f"Tool call {tc.tool_call_id} was already {tc.status} by {tc.decided_by}",
            extra={"status": tc.status, "decided_by": tc.decided_by},
        )
    raise Conflict(
        f"Tool call {tc.tool_call_id} is {tc.status}; it cannot be {verb}",
        code="tool_call_not_waiting",
        extra={"status": tc.status},
    )


def tool_call_approve(
    *,
    run: Run,
    actor: Actor,
    tool_call_id: str | None = None,
    args: dict[str, Any] | None = None,
    pinned_resource_id: str | None = None,
) -> Run:
    """Approve a tool call awaiting approval, optionally with edited arguments."""
    _check_scope(run, pinned_resource_id, "Run")
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "approve")
        _ensure_waiting(tc, (ToolCallStatus.AWAITING_APPROVAL,), "approved")
        if args is not None:
            _validate_edited_args(locked, tc, args)
        _decide(locked, tc, decision="approved", actor=actor, args=args)
        return _after_decision(locked, actor)


def tool_call_decline(
    *,
    run: Run,
    actor: Actor,
    tool_call_id: str | None = None,
    reason: str = "",
    pinned_resource_id: str | None = None,
) -> Run:
    """Decline a waiting tool call; the model gets the reason instead of a result."""
    _check_scope(run, pinned_resource_id, "Run")
    if reason is not None and len(reason) > 10_000:
        raise ValidationFailed(
            "reason is too long (10000 characters at most)",
            errors=[{"field": "reason", "message": "too long"}],
        )
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "decline")
        _ensure_waiting(tc, PENDING_DECISION_STATUSES, "declined")
        _decide(locked, tc, decision="declined", actor=actor, reason=reason or "")
        return _after_decision(locked, actor)


def tool_call_answer(
    *,
    run: Run,
    actor: Actor,
    resume_data: Any,
    tool_call_id: str | None = None,
    pinned_resource_id: str | None = None,
) -> Run:
    """Give a tool that called ctx.suspend() the data it asked for (checked against its schema)."""
    _check_scope(run, pinned_resource_id, "Run")
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "answer")
        _ensure_waiting(tc, (ToolCallStatus.AWAITING_INPUT,), "answered")
        _validate_resume_data(tc, resume_data)
        _decide(locked, tc, decision="answered", actor=actor, resume_data=resume_data)
        return _after_decision(locked, actor)


def thread_resume(*, thread: Thread, resume: Any, actor: Actor) -> Run:
    """LangGraph `command.resume`: decide the waiting tool calls of the thread's suspended run.

    For an approval the value is {"approved": true[, "args": {...}]} or {"approved": false,
    "reason": "..."}; for a tool that asked for input it is the resume data. With several
    waiting calls, a map {tool_call_id: value}.
    """
    with transaction.atomic():
        _lock_thread(thread.id)
        run_id = (
            Run.objects.filter(thread=thread, status=RunStatus.SUSPENDED, parent_run__isnull=True)
            .order_by("-suspended_at", "-id")
            .values_list("id", flat=True)
            .first()
        )
        if run_id is None:
            raise Conflict(
                f"Thread {thread.id} has no suspended run to resume", code="nothing_to_resume"
            )
        run = _lock_run(run_id)
        waiting = _waiting_calls(run)
        by_id = {tc.tool_call_id: tc for tc in waiting}
        if (
            isinstance(resume, dict)
            and resume
            and set(resume) <= set(by_id)
            and (len(waiting) > 1 or not _looks_like_value_for(waiting[0], resume))
        ):
            plan = [(by_id[k], v) for k, v in resume.items()]
        elif len(waiting) == 1:
            plan = [(waiting[0], resume)]
        else:
            raise Conflict(
                f"Run {run.id} waits on {len(waiting)} tool calls; resume with a map "
                f"{{tool_call_id: value}} (pending: {', '.join(by_id)})",
                code="tool_call_required",
                extra={"pending_tool_call_ids": list(by_id)},
            )
        for tc, value in plan:
            if tc.status == ToolCallStatus.AWAITING_APPROVAL:
                if not isinstance(value, dict) or not isinstance(value.get("approved"), bool):
                    raise ValidationFailed(
                        f"Tool call {tc.tool_call_id} needs an approval: resume with "
                        '{"approved": true} or {"approved": false, "reason": "..."}',
                        errors=[
                            {
                                "field": f"resume.{tc.tool_call_id}",
                                "message": 'expected {"approved": bool}',
                            }
                        ],
                    )
                if value["approved"]:
                    args = value.get("args")
                    if args is not None:
                        _validate_edited_args(run, tc, args)
                    _decide(run, tc, decision="approved", actor=actor, args=args)
                else:
                    _decide(
                        run,
                        tc,
                        decision="declined",
                        actor=actor,
                        reason=str(value.get("reason") or ""),
                    )
            else:
                _validate_resume_data(tc, value)
                _decide(run, tc, decision="answered", actor=actor, resume_data=value)
        return _after_decision(run, actor)


def _looks_like_value_for(tc: ToolCall, value: dict[str, Any]) -> bool:
    # {"approved": ...} or data matching the tool's schema is a value, not an id map.
    if tc.status == ToolCallStatus.AWAITING_APPROVAL:
        return "approved" in value
    return not schema_errors(tc.resume_schema, value)


def _validate_edited_args(run: Run, tc: ToolCall, args: Any) -> None:
    if not isinstance(args, dict):
        raise ValidationFailed(
            "args must be an object", errors=[{"field": "args", "message": "must be an object"}]
        )
    _check_json_size(args, "args")
    if tc.child_run_id is not None:
        return  # checked against the sub-agent's tool when carried down
    try:
        tool = get_agent(run.agent_id).get_tool(tc.tool_name)
    except NotFound:
        tool = None
    if tool is not None:
        errors = tool.argument_errors(args)
        if errors:
            raise ValidationFailed(
                f"args do not match the arguments of tool {tc.tool_name}",
                errors=[
                    {**e, "field": f"args.{e['field']}" if e["field"] != "(root)" else "args"}
                    for e in errors
                ],
            )


def _validate_resume_data(tc: ToolCall, data: Any) -> None:
    _check_json_size(data, "resume_data")
    errors = schema_errors(tc.resume_schema, data)
    if errors:
        listed = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise ValidationFailed(
            f"resume_data does not match the schema of tool call {tc.tool_call_id}: {listed}",
            errors=[
                {
                    **e,
                    "field": f"resume_data.{e['field']}"
                    if e["field"] != "(root)"
                    else "resume_data",
                }
                for e in errors
            ],
        )


def _decide(
    run: Run,
    tc: ToolCall,
    *,
    decision: str,
    actor: Actor,
    args: dict[str, Any] | None = None,
    reason: str = "",
    resume_data: Any = None,
    carry_down: bool = True,
    carried_from: Run | None = None,
) -> None:
    """Record one decision on a waiting tool call (caller holds the run lock).

    On a delegation call (`child_run` set) the decision is carried down to the sub-agent's
    waiting calls unless it came up from there (`carry_down=False`).
    """
    now = _now()
    before = {"status": tc.status, "args": tc.args}
    tc.decided_by = actor_name(actor)
    tc.decided_at = now
    tc.decision_reason = reason
    if decision == "approved":
        tc.status = ToolCallStatus.APPROVED
        if args is not None and args != tc.args and tc.child_run_id is None:
            tc.original_args = tc.args
            tc.args = args
    elif decision == "declined":
        tc.status = ToolCallStatus.DECLINED
    else:
        tc.status = ToolCallStatus.ANSWERED
        tc.resume_data = resume_data
    tc.save()
    transaction.on_commit(lambda: _count_decision(decision, tc.suspended_at, now))
    data: dict[str, Any] = {
        "tool_call_id": tc.tool_call_id,
        "tool_name": tc.tool_name,
        "decision": decision,
    }
    if tc.original_args is not None and decision == "approved":
        data["args"] = tc.args
        data["original_args"] = tc.original_args
    if reason:
        data["reason"] = reason
    if decision == "answered":
        data["resume_data"] = resume_data
    if carried_from is not None:
        data["carried_from_run_id"] = str(carried_from.id)
    run.last_seq = _append_events(run.id, [("decision", data, actor_name(actor))])
    _audit(
        actor=actor,
        action={"approved": "approve", "declined": "decline", "answered": "answer"}[decision],
        run=run,
        tool_call_id=tc.tool_call_id,
        reason=reason,
        before=before,
        after={
            "status": tc.status,
            "args": tc.args,
            **({"resume_data": resume_data} if decision == "answered" else {}),
        },
    )
    logger.info(
        "decision run=%s tool_call=%s %s by=%s",
        run.id,
        tc.tool_call_id,
        decision,
        actor_name(actor),
    )
    if tc.child_run_id is not None and carry_down:
        _carry_down(
            run,
            tc,
            decision=decision,
            actor=actor,
            args=args,
            reason=reason,
            resume_data=resume_data,
        )


def _count_decision(decision: str, suspended_at: datetime | None, decided_at: datetime) -> None:
    metrics.DECISIONS.labels(decision).inc()
    if suspended_at is not None:
        metrics.DECISION_LATENCY.observe(max(0.0, (decided_at - suspended_at).total_seconds()))


def _carry_down(
    parent: Run,
    tc: ToolCall,
    *,
    decision: str,
    actor: Actor,
    args: Any,
    reason: str,
    resume_data: Any,
) -> None:
    """A decision on a supervisor's delegation call decides the sub-agent's waiting calls."""
    child = Run.objects.select_for_update(no_key=True).filter(id=tc.child_run_id).first()
    if child is None or child.status != RunStatus.SUSPENDED:
        return
    waiting = _waiting_calls(child)
    if args is not None and len(waiting) != 1:
        raise ValidationFailed(
            f"the sub-agent run {child.id} waits on {len(waiting)} calls; edit arguments on it directly",
            errors=[{"field": "args", "message": "ambiguous for several sub-agent calls"}],
        )
    for inner in waiting:
        if decision == "approved" and inner.status != ToolCallStatus.AWAITING_APPROVAL:
            raise Conflict(
                f"the sub-agent's tool call {inner.tool_call_id} asks for input, not approval",
                code="tool_call_not_waiting",
            )
        if decision == "answered":
            _validate_resume_data(inner, resume_data)
        if decision == "approved" and args is not None:
            _validate_edited_args(child, inner, args)
        _decide(
            child,
            inner,
            decision=decision,
            actor=actor,
            args=args,
            reason=reason,
            resume_data=resume_data,
            carried_from=parent,
        )
    if not _waiting_calls(child):
        _release_decided(child, actor)


def _release_decided(run: Run, actor: Actor) -> None:
    """Every waiting call of `run` is decided: it continues (a sub-agent through its parent)."""
    run.status = RunStatus.PENDING
    run.save(update_fields=["status", "updated_at"])
    run.last_seq = _append_events(run.id, [("resumed", {}, actor_name(actor))])
    _publish(run)


def _after_decision(run: Run, actor: Actor) -> Run:
    """After a decision on `run`: continue it when nothing is left waiting (and its parents)."""
    if _waiting_calls(run):
        _publish(run)
        return run
    _release_decided(run, actor)
    current = run
    while current.parent_run_id is not None:
        parent = Run.objects.select_for_update(no_key=True).get(id=current.parent_run_id)
        if parent.status != RunStatus.SUSPENDED:
            break
        delegation = (
            ToolCall.objects.select_for_update(no_key=True)
            .filter(run=parent, child_run=current, status__in=PENDING_DECISION_STATUSES)
            .first()
        )
        if delegation is not None:
            decision = (
                "approved" if delegation.status == ToolCallStatus.AWAITING_APPROVAL else "answered"
            )
            _decide(
                parent,
                delegation,
                decision=decision,
                actor=actor,
                reason=f"decided on sub-agent run {current.id}",
                carry_down=False,
                carried_from=current,
            )
        if _waiting_calls(parent):
            _publish(parent)
            break
        _release_decided(parent, actor)
        current = parent
    top = current if current.parent_run_id is None else None
    if top is not None and top.status == RunStatus.PENDING:
        _refresh_thread(top.thread_id)
        _notify(QUEUE_CHANNEL)
    run.refresh_from_db()
    return run


# --------------------------------------------------------------------------------------------
# API keys
# --------------------------------------------------------------------------------------------


def api_key_create(*, name: str, resource_id: str | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw secret (shown once, stored only as a hash)."""
    import secrets

    if not name or len(name) > 100:
        raise ValidationFailed(
            "name must be 1 to 100 characters",
            errors=[{"field": "name", "message": "1 to 100 characters"}],
        )
    raw = "rs_" + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        name=name, prefix=raw[:10], key_hash=ApiKey.hash_key(raw), resource_id=resource_id or None
    )
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = _now()
        key.save(update_fields=["revoked_at"])
    return key


def api_key_touch(*, key: ApiKey) -> None:
    """Record use, at most once a minute (a write per request would serialise on the row)."""
    now = _now()
    if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
        ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        key.last_used_at = now


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------

GROUP_PERMISSIONS = {"Reviewers": ["review_run"], "Support": ["cancel_run"]}


def groups_ensure() -> None:
    """Create the Reviewers and Support groups with their permissions (idempotent)."""
    from django.contrib.auth.models import Group, Permission

    for group_name, codenames in GROUP_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(
            *Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
        )
