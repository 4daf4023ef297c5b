"""Fenced writes from the step loop: checkpoints, tool-call progress, custom events, suspension."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from uuid import UUID

from django.db import connection, transaction
from django.db.models import DateTimeField, F

from runs import metrics
from runs.contracts import (
    Event,
    FenceResult,
    HeldWrites,
    JSONObject,
    JSONValue,
    Lease,
    StepWrite,
    SuspendPlan,
    ToolOutcome,
    interrupt_of,
    step_event,
)
from runs.engine.registry import review_policy, tool_description
from runs.exceptions import RunCancelled
from runs.models import (
    CancelAction,
    Checkpoint,
    Run,
    RunStatus,
    ToolCall,
    ToolCallStatus,
)
from runs.rows import insert, insert_statements, instances, update_statement, write_together
from runs.services.cancel import _apply_cancel
from runs.services.core import (
    _UNSET,
    LEASE_CLEARED,
    _check_json_size,
    _complete_lease,
    _event_rows,
    _fence,
    _fence_returning,
    _fence_with,
    _insert_events,
    _latest_thread_values,
    _lock_thread,
    _now,
    _publish,
    _publish_fenced,
    _refresh_thread,
    _refresh_threads_statement,
    _Unset,
    _update_returning,
    _uuid_param,
    logger,
)
from runs.services.notifications import _announce
from runs.services.review_deadlines import review_deadline_fields
from runs.services.search import (
    DocumentSource,
    search_refresh,
    source_columns,
    source_of,
    source_read,
)


def _write_steps(lease: Lease, steps: Sequence[StepWrite]) -> None:
    insert(_checkpoint_rows(lease, steps))


def _checkpoint_rows(lease: Lease, steps: Sequence[StepWrite]) -> list[Checkpoint]:
    return [
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
    ]


def _fence_for_write(
    lease: Lease, *, events: int, document: bool
) -> tuple[FenceResult, DocumentSource | None]:
    """`_fence`, and when the write changes the run's search document (`document`), what the
    document is made of: read by the fence itself on PostgreSQL, so the write carries the new
    document instead of reading it back afterwards; a read of its own on SQLite."""
    if not document:
        return _fence(lease, events=events), None
    columns = source_columns("runs_run")
    if columns is None:
        fence = _fence(lease, events=events)
        return fence, source_read(lease.run_id)
    fence, values = _fence_returning(lease, events=events, more=columns)
    return fence, source_of(lease.run_id, values)


def run_save_steps(
    *,
    lease: Lease,
    steps: Sequence[StepWrite],
    new_tool_calls: Sequence[JSONObject] = (),
    events: Sequence[Event] = (),
    outcome: ToolOutcome | None = None,
    held: HeldWrites | None = None,
) -> FenceResult:
    """Write steps (checkpoints), the tool calls the model proposed, and timeline events.

    `outcome`: the result of the tool call that ran last, recorded in the same transaction (the
    step that follows it is what the loop writes next, with no other work in between). A new
    call with status `running` is one the loop runs right after this write. `held`: writes the
    loop skipped (`HeldWrites`), made first. The FenceResult carries the created tool calls
    (the held ones first) as written.

    Two statements on PostgreSQL: the fence (reading what the run's document is made of, when
    the write changes it), then every row of the write (`rows.write_together`).
    """
    lease = _complete_lease(lease)
    held = held or HeldWrites()
    outcome_events = [outcome.event] if outcome is not None else []
    all_events = [*held.events, *outcome_events, *events, *(step_event(w) for w in steps)]
    outcomes = [o for o in (held.outcome, outcome) if o is not None]
    try:
        with transaction.atomic():
            fence, source = _fence_for_write(
                lease,
                events=len(all_events),
                document=bool(new_tool_calls or outcomes or held.tool_calls),
            )
            writes = [_outcome_statement(done, source) for done in outcomes]
            writes += insert_statements(_checkpoint_rows(lease, [*held.steps, *steps]))
            created = [
                *_new_tool_calls(lease, held.steps, held.tool_calls),
                *_new_tool_calls(lease, steps, new_tool_calls),
            ]
            writes += insert_statements(created)
            writes += insert_statements(_event_rows(lease.run_id, fence.last_seq, all_events))
            if source is not None:
                source.calls_added(created)
                writes.append(source.statement())
            write_together(writes, "SELECT 1", [], connection.alias)
            fence.tool_calls = created
            _publish_fenced(lease, fence.last_seq)
    except RunCancelled as stop:
        for done in outcomes:
            if not stop.deleted:
                _record_outcome_after_cancel(lease, done)
        raise
    return fence


def _new_tool_calls(
    lease: Lease, steps: Sequence[StepWrite], new_tool_calls: Sequence[JSONObject]
) -> list[ToolCall]:
    """The calls a decision proposed, at its (last) step unless a call names its own (a held
    call, `HeldWrites`), unsaved."""
    step = steps[-1].step if steps else 0
    return [
        ToolCall(run_id=lease.run_id, **{"step": step, **_started(tc), **tc})
        for tc in new_tool_calls
    ]


def _create_tool_calls(
    lease: Lease, steps: Sequence[StepWrite], new_tool_calls: Sequence[JSONObject]
) -> list[ToolCall]:
    """The calls a decision proposed, at its (last) step; the run's document follows them."""
    if not new_tool_calls:
        return []
    created = _new_tool_calls(lease, steps, new_tool_calls)
    insert(created)
    search_refresh(run_ids=[lease.run_id])
    return created


def _tool_call_update(
    tool_call: ToolCall, update: dict[str, object], source: DocumentSource | None
) -> tuple[str, list[object]]:
    """The UPDATE of one call's columns (the ORM compiled it on every call), for
    `rows.write_together`; the call in hand and the document's source follow it."""
    for key, value in update.items():
        setattr(tool_call, key, value)
    if source is not None and "result" in update:
        source.call_changed(tool_call.tool_call_id, result=update["result"])
    return update_statement(ToolCall, update, "id = %s", [_uuid_param(tool_call.id)])


def _outcome_statement(
    done: ToolOutcome, source: DocumentSource | None
) -> tuple[str, list[object]]:
    """The UPDATE recording a call's outcome, for `rows.write_together`."""
    return _tool_call_update(done.tool_call, _tool_call_changes(done.status, done.result), source)


def _record_outcome(done: ToolOutcome) -> None:
    """A call's outcome written on its own (the caller refreshes the run's document)."""
    changes = _tool_call_changes(done.status, done.result)
    ToolCall.objects.filter(id=done.tool_call.id).update(**changes)


def _record_outcome_after_cancel(lease: Lease, done: ToolOutcome) -> None:
    """What the tool did must not vanish: recorded as `tool_call_update` records it."""
    changes = _tool_call_changes(done.status, done.result)
    _record_after_cancel(lease, done.tool_call, changes, done.event)


def _started(call: JSONObject) -> dict[str, object]:
    """A call written `running` with its decision (it runs right after) starts now."""
    return {"started_at": _now()} if call.get("status") == ToolCallStatus.RUNNING else {}


def tool_call_update(
    *,
    lease: Lease,
    tool_call: ToolCall,
    status: str,
    result: JSONValue | _Unset = _UNSET,
    event: Event | None = None,
) -> FenceResult:
    """Record a tool call's progress (running / succeeded / failed) under the run's fence.

    A tool that finishes after its run was cancelled (the cancel ended the run while the tool
    was executing) still has its outcome recorded, marked `after_cancel`, before RunCancelled
    stops the worker: what a tool did must not vanish from the record.
    """
    lease = _complete_lease(lease)
    update = _tool_call_changes(status, result)
    if event is None and "result" not in update:
        # A call marked running: its fence and its row, one statement on PostgreSQL.
        return _fence_with(lease, _tool_call_update(tool_call, update, None))
    try:
        with transaction.atomic():
            fence, source = _fence_for_write(
                lease, events=1 if event else 0, document="result" in update
            )
            writes = [_tool_call_update(tool_call, update, source)]
            if event:
                writes += insert_statements(_event_rows(lease.run_id, fence.last_seq, [event]))
            if source is not None:
                writes.append(source.statement())
            write_together(writes, "SELECT 1", [], connection.alias)
            if event:
                _publish_fenced(lease, fence.last_seq)
    except RunCancelled as stop:
        if status in (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED) and not stop.deleted:
            _record_after_cancel(lease, tool_call, update, event)
        raise
    return fence


def tool_calls_not_started(*, lease: Lease, calls: Mapping[str, str]) -> None:
    """Calls written `running` together with their decision, or by the claim of their resumed
    run, whose tools never started: the run was stopped (cancelled, timed out, released) in
    between. Each back to the status `calls` gives it (`proposed`; `approved` or `answered`
    for a decided call a claim marked), as if it had been marked only when its tool started;
    written only while this lease's attempt still holds the run (a worker that lost it writes
    nothing), and only for calls still `running`."""
    by_status: dict[str, list[str]] = {}
    for tool_call_id, status in calls.items():
        by_status.setdefault(status, []).append(tool_call_id)
    for status, ids in sorted(by_status.items()):
        ToolCall.objects.filter(
            run_id=lease.run_id,
            tool_call_id__in=sorted(ids),
            status=ToolCallStatus.RUNNING,
            run__attempt=lease.attempt,
        ).update(status=status, started_at=None)


def _tool_call_changes(status: str, result: JSONValue | _Unset) -> dict[str, object]:
    now = _now()
    update: dict[str, object] = {"status": status}
    if status == ToolCallStatus.RUNNING:
        update["started_at"] = now
    if status in (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED):
        update["finished_at"] = now
    if result is not _UNSET:
        update["result"] = result
    return update


def _write_tool_call(
    lease: Lease,
    tool_call: ToolCall,
    update: dict[str, object],
    event: Event | None,
    seq: int,
    run_status: str = RunStatus.RUNNING,
) -> None:
    ToolCall.objects.filter(id=tool_call.id).update(**update)
    if "result" in update:
        search_refresh(run_ids=[lease.run_id])
    for key, value in update.items():
        setattr(tool_call, key, value)
    if event:
        _insert_events(lease.run_id, seq, [event])
        _publish_fenced(lease, seq, status=run_status)


def _record_after_cancel(
    lease: Lease, tool_call: ToolCall, update: dict[str, object], event: Event | None
) -> None:
    """The outcome of a call that was executing when its run was cancelled under this lease
    (same attempt, run interrupted, call still `running`): written, or nothing if any differ."""
    with transaction.atomic():
        rows = _update_returning(
            Run.objects.filter(
                id=lease.run_id, attempt=lease.attempt, status=RunStatus.INTERRUPTED
            ),
            ["last_seq"],
            last_seq=F("last_seq") + (1 if event else 0),
        )
        if (
            not rows
            or not ToolCall.objects.filter(id=tool_call.id, status=ToolCallStatus.RUNNING).exists()
        ):
            transaction.set_rollback(True)
            return
        if event:
            kind, data, actor = event
            event = (kind, {**data, "after_cancel": True}, actor)
        _write_tool_call(lease, tool_call, update, event, rows[0][0], RunStatus.INTERRUPTED)
    logger.info(
        "tool call %s of cancelled run=%s finished after the cancel: recorded",
        tool_call.tool_call_id,
        lease.run_id,
    )


def run_emit(*, lease: Lease, kind: str, data: JSONObject) -> None:
    """A custom event from inside a tool (`ctx.emit`), streamed as LangGraph `custom`."""
    _check_json_size(data, "data", limit=256_000)
    lease = _complete_lease(lease)
    with transaction.atomic():
        fence = _fence(lease, events=1)
        _insert_events(lease.run_id, fence.last_seq, [(kind, data, "system")])
        _publish_fenced(lease, fence.last_seq)


def _decision_events(plan: SuspendPlan) -> int:
    return len(plan.events) + len(plan.steps) + (len(plan.held.events) if plan.held else 0)


def _write_decision(lease: Lease, plan: SuspendPlan, last_seq: int) -> None:
    """A plan's unwritten decision (steps, proposed calls, events), after the writes held
    before it, before its suspension; their events take the seqs just before the `suspended`
    event's (`last_seq`)."""
    held = plan.held or HeldWrites()
    if not plan.steps and not plan.new_tool_calls and not held:
        return
    _write_steps(lease, [*held.steps, *plan.steps])
    if held.outcome is not None:
        _record_outcome(held.outcome)
        if not held.tool_calls and not plan.new_tool_calls:
            search_refresh(run_ids=[lease.run_id])
    _create_tool_calls(lease, held.steps, held.tool_calls)
    _create_tool_calls(lease, plan.steps, plan.new_tool_calls)
    events = [*held.events, *plan.events, *(step_event(w) for w in plan.steps)]
    _insert_events(lease.run_id, last_seq - 1, events)


# Suspended with its lease cleared, and read back, in one written statement (an ORM update and a
# get were two statements, each compiled on every call). RETURNING: PostgreSQL, SQLite >= 3.35.
_PARK_SQL = f"""
UPDATE runs_run SET status = '{RunStatus.SUSPENDED}', suspended_at = %s, updated_at = %s,
       {", ".join(f"{name} = NULL" for name in LEASE_CLEARED)}
 WHERE id = %s
RETURNING *
"""


def _park(run_id: UUID, now: datetime) -> Run:
    at = DateTimeField().get_db_prep_value(now, connection)
    [run] = instances(Run, _PARK_SQL, [at, at, Run._meta.pk.get_db_prep_value(run_id, connection)])
    return run


def run_suspend(*, plans: Sequence[SuspendPlan], values: JSONObject | None = None) -> str:
    """Park one run (or a supervisor with its sub-agents, innermost first) for a human.

    All plans commit together: a reviewer deciding the sub-agent's call can never find the
    supervisor still running (and so miss the supervisor's delegation call). A cancel
    requested while the run was still running wins: the run is cancelled instead of parked.
    Returns the outer run's new status ("suspended", "interrupted" or "deleted").
    """
    outer = _complete_lease(plans[-1].lease)  # a worker's lease knows its thread
    if len(plans) == 1 and outer.parent_run_id is None:
        return _park_one(outer, plans[0], values)
    with transaction.atomic():
        thread_id = outer.thread_id
        _lock_thread(thread_id)
        outer_fence = _fence(outer, events=1 + _decision_events(plans[-1]))
        _write_decision(outer, plans[-1], outer_fence.last_seq)
        if outer_fence.cancel_action:
            run = Run.objects.select_for_update(no_key=True).get(id=outer.run_id)
            _apply_cancel(run, action=outer_fence.cancel_action, actor=None)
            return "deleted" if outer_fence.cancel_action == CancelAction.ROLLBACK else run.status
        now = _now()
        parked = []
        for plan in plans:
            if plan is plans[-1]:
                fence = outer_fence
            else:
                lease = _complete_lease(plan.lease)
                fence = _fence(lease, events=1 + _decision_events(plan))
                _write_decision(lease, plan, fence.last_seq)
            interrupts = []
            for w in plan.waiting:
                policy = review_policy(plan.lease.agent_id, w.get("tool_name"))
                ToolCall.objects.filter(
                    run_id=plan.lease.run_id, tool_call_id=w["tool_call_id"]
                ).update(
                    status=w["status"],
                    requires_approval=w.get("requires_approval", False),
                    suspend_payload=w.get("suspend_payload"),
                    resume_schema=w.get("resume_schema"),
                    suspended_at=now,
                    **review_deadline_fields(policy, now),
                )
                description = tool_description(plan.lease.agent_id, w.get("tool_name"))
                interrupts.append(interrupt_of({**w, "description": description}))
            run = _park(plan.lease.run_id, now)
            _insert_events(
                plan.lease.run_id,
                fence.last_seq,
                [("suspended", {"interrupts": interrupts}, "system")],
            )
            logger.info(
                "suspend run=%s agent=%s attempt=%s waiting=%s",
                run.id,
                run.agent_id,
                run.attempt,
                [w["tool_call_id"] for w in plan.waiting],
            )
            _publish(run)
            parked.append(run)
        if thread_id is not None:
            latest = values if values is not None else _latest_thread_values(thread_id)
            _refresh_thread(thread_id, values=latest, one_in_flight=True)
        for run in parked:  # after the thread's values: a run webhook's body carries them
            _announce(run, RunStatus.SUSPENDED)
    metrics.SUSPENSIONS.inc(len(plans))
    return RunStatus.SUSPENDED


# Whether a run's suspension is announced (its own webhook, or a rule for its agent), read by the
# suspension's fence as the end's statement reads it (finish._FINISH_SQL_POSTGRES).
_ANNOUNCED = (
    "runs_run.webhook <> '' OR EXISTS (SELECT 1 FROM runs_notificationrule n"
    " WHERE n.agent_id = runs_run.agent_id AND n.active)"
)
_PARK_ONE_SQL = f"""
UPDATE runs_run SET status = '{RunStatus.SUSPENDED}', suspended_at = %s, updated_at = %s,
       {", ".join(f"{name} = NULL" for name in LEASE_CLEARED)}
 WHERE id = %s
"""


def _park_one(lease: Lease, plan: SuspendPlan, values: JSONObject | None) -> str:
    """`run_suspend` of one run (no sub-agent waits with it): the fence, taking the thread's
    lock first and reading whether the suspension is announced and, when the decision proposes
    calls, what the run's document is made of; then the decision's checkpoint, its calls written
    waiting, the events, the run parked, its thread and its document as one statement on
    PostgreSQL (`rows.write_together`; 12 statements one by one)."""
    held = plan.held or HeldWrites()
    with transaction.atomic():
        document = bool(plan.new_tool_calls or held.tool_calls or held.outcome)
        columns = source_columns("runs_run") if document else None
        more = ", ".join(c for c in (_ANNOUNCED, columns) if c)
        fence, read = _fence_returning(
            lease, events=1 + _decision_events(plan), more=more, lock_thread=True
        )
        if fence.cancel_action:
            # A cancel written on the row but not applied (an older version's): it wins.
            _write_decision(lease, plan, fence.last_seq)
            run = Run.objects.select_for_update(no_key=True).get(id=lease.run_id)
            _apply_cancel(run, action=fence.cancel_action, actor=None)
            return "deleted" if fence.cancel_action == CancelAction.ROLLBACK else run.status
        source = None
        if document:
            source = source_of(lease.run_id, read[1:]) if columns else source_read(lease.run_id)
        now = _now()
        created = {
            tc.tool_call_id: tc
            for tc in [
                *_new_tool_calls(lease, held.steps, held.tool_calls),
                *_new_tool_calls(lease, plan.steps, plan.new_tool_calls),
            ]
        }
        waiting_updates = []
        if held.outcome is not None:
            waiting_updates.append(_outcome_statement(held.outcome, source))
        interrupts = []
        for w in plan.waiting:
            policy = review_policy(lease.agent_id, w.get("tool_name"))
            fields = {
                "status": w["status"],
                "requires_approval": w.get("requires_approval", False),
                "suspend_payload": w.get("suspend_payload"),
                "resume_schema": w.get("resume_schema"),
                "suspended_at": now,
                **review_deadline_fields(policy, now),
            }
            new = created.get(w["tool_call_id"])
            if new is not None:  # proposed by this decision: written waiting at once
                for key, value in fields.items():
                    setattr(new, key, value)
            else:
                waiting_updates.append(
                    update_statement(
                        ToolCall,
                        fields,
                        "run_id = %s AND tool_call_id = %s",
                        [_uuid_param(lease.run_id), w["tool_call_id"]],
                    )
                )
            description = tool_description(lease.agent_id, w.get("tool_name"))
            interrupts.append(interrupt_of({**w, "description": description}))
        decided = plan.steps or plan.new_tool_calls
        events = [*plan.events, *(step_event(w) for w in plan.steps)] if decided else []
        events = [*held.events, *events, ("suspended", {"interrupts": interrupts}, "system")]
        at = DateTimeField().get_db_prep_value(now, connection)
        writes = [
            *insert_statements(_checkpoint_rows(lease, [*held.steps, *plan.steps])),
            *insert_statements(list(created.values())),
            *waiting_updates,
            *insert_statements(_event_rows(lease.run_id, fence.last_seq, events)),
            (_PARK_ONE_SQL, [at, at, _uuid_param(lease.run_id)]),
        ]
        if lease.thread_id is not None:
            if values is None:
                last = [*held.steps, *plan.steps]
                values = last[-1].values if last else None
            latest = values if values is not None else _latest_thread_values(lease.thread_id)
            writes.append(
                _refresh_threads_statement(
                    [lease.thread_id], values=latest, ending=[lease.run_id], suspending=True
                )
            )
        if source is not None:
            source.calls_added(created.values())
            writes.append(source.statement())
        # The transaction's last statement, its COMMIT with it, unless deliveries follow.
        write_together(writes, "SELECT 1", [], connection.alias, commit=not read[0])
        logger.info(
            "suspend run=%s agent=%s attempt=%s waiting=%s",
            lease.run_id,
            lease.agent_id,
            lease.attempt,
            [w["tool_call_id"] for w in plan.waiting],
        )
        # The wait/join body (`selectors.run_outcome`): this suspension's calls are all the
        # run's waiting ones, in the order they were created.
        outcome = {"__interrupt__": interrupts}
        _publish_fenced(lease, fence.last_seq, status=RunStatus.SUSPENDED, outcome=outcome)
        if read[0]:  # after the thread's values: a run webhook's body carries them
            _announce(lease.run_id, RunStatus.SUSPENDED)
    metrics.SUSPENSIONS.inc(1)
    return RunStatus.SUSPENDED
