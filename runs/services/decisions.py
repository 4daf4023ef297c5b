"""Human decisions on suspended runs: approve, decline, answer, resume."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import DateTimeField

from runs import metrics
from runs.contracts import Actor, JSONObject, JSONValue, actor_name
from runs.engine.registry import get_agent
from runs.exceptions import AlreadyDecided, Conflict, NotFound, ValidationFailed
from runs.models import (
    PENDING_DECISION_STATUSES,
    CancelAction,
    Run,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
    ToolCallStatus,
)
from runs.rows import insert, insert_statements, instances, update_statement, write_together
from runs.services import conventions
from runs.services.cancel import _cancel_locked
from runs.services.claims import check_claim
from runs.services.core import (
    QUEUE_CHANNEL,
    _append_events,
    _audit_entry,
    _check_json_size,
    _check_scope,
    _event_rows,
    _lock_newest_suspended_run,
    _lock_run,
    _notified_by_select,
    _notify,
    _now,
    _publish,
    _refresh_thread,
    _sql_in,
    _uuid_param,
    logger,
)
from runs.services.search import search_refresh
from runs.services.threads import _thread_in_scope
from runs.validation import schema_errors

_WAITING_SQL = (
    "SELECT * FROM runs_toolcall WHERE run_id = %s"
    f" AND status IN {_sql_in(PENDING_DECISION_STATUSES)} ORDER BY created_at, id"
)


def _waiting_calls(run: Run) -> list[ToolCall]:
    """The run's calls waiting for a human, locked (caller holds the run's lock): those its
    locking statement read, when it did (`_lock_newest_suspended_run(waiting=True)`)."""
    read: list[ToolCall] | None = run.__dict__.pop("waiting_calls", None)
    if read is not None:
        return read
    lock = " FOR NO KEY UPDATE" if connection.vendor == "postgresql" else ""
    return instances(ToolCall, _WAITING_SQL + lock, [_uuid_param(run.id)], planned=True)


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
    args: JSONObject | None = None,
    comment: str = "",
    pinned_resource_id: str | None = None,
    take_over: bool = False,
) -> Run:
    """Approve a tool call awaiting approval, optionally with edited arguments and a comment
    (stored, audited, and shown to the model when the tool declares share_review_comment)."""
    _check_scope(run, pinned_resource_id, "Run")
    comment = _checked_comment(comment, "comment")
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "approve")
        _ensure_waiting(tc, (ToolCallStatus.AWAITING_APPROVAL,), "approved")
        check_claim(locked, tc, actor, take_over=take_over, now=_now())
        if args is not None:
            _validate_edited_args(locked, tc, args)
        _decide(locked, tc, decision="approved", actor=actor, args=args, comment=comment)
        return _after_decision(locked, actor)


MAX_COMMENT = 10_000


def _checked_comment(comment: object, field: str) -> str:
    """A reviewer's comment, stripped; 422 naming `field` when it is not text or too long."""
    if comment is None:
        return ""
    if not isinstance(comment, str):
        raise ValidationFailed.field(field, "must be a string")
    if len(comment) > MAX_COMMENT:
        raise ValidationFailed.field(
            field,
            "too long",
            detail=f"{field} is too long ({MAX_COMMENT} characters at most)",
        )
    return comment.strip()


def tool_call_decline(
    *,
    run: Run,
    actor: Actor,
    tool_call_id: str | None = None,
    reason: str = "",
    pinned_resource_id: str | None = None,
    take_over: bool = False,
) -> Run:
    """Decline a waiting tool call; the model gets the reason instead of a result.

    A call another reviewer has claimed is refused (ClaimedByOther) unless `take_over`."""
    _check_scope(run, pinned_resource_id, "Run")
    if reason is not None and len(reason) > 10_000:
        raise ValidationFailed.field(
            "reason",
            "too long",
            detail="reason is too long (10000 characters at most)",
        )
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "decline")
        _ensure_waiting(tc, PENDING_DECISION_STATUSES, "declined")
        check_claim(locked, tc, actor, take_over=take_over, now=_now())
        _decide(locked, tc, decision="declined", actor=actor, reason=reason or "")
        return _after_decision(locked, actor)


def tool_call_answer(
    *,
    run: Run,
    actor: Actor,
    resume_data: JSONValue,
    tool_call_id: str | None = None,
    pinned_resource_id: str | None = None,
    take_over: bool = False,
) -> Run:
    """Give a tool that called ctx.suspend() the data it asked for (checked against its schema)."""
    _check_scope(run, pinned_resource_id, "Run")
    with transaction.atomic():
        locked = _lock_run(run.id)
        tc = _pick_tool_call(locked, tool_call_id, "answer")
        _ensure_waiting(tc, (ToolCallStatus.AWAITING_INPUT,), "answered")
        check_claim(locked, tc, actor, take_over=take_over, now=_now())
        _validate_resume_data(tc, resume_data)
        _decide(locked, tc, decision="answered", actor=actor, resume_data=resume_data)
        return _after_decision(locked, actor)


def thread_resume(
    *,
    thread_id: UUID,
    resume: JSONValue,
    actor: Actor,
    pinned_resource_id: str | None = None,
) -> Run:
    """LangGraph `command.resume`: decide the waiting tool calls of the thread's suspended run.

    For an approval the value is {"approved": true[, "args": {...}][, "comment": "..."]} or
    {"approved": false,
    "reason": "..."}; for a tool that asked for input it is the resume data. With several
    waiting calls, a map {tool_call_id: value}.

    The thread is not read first: one statement locks it (in `pinned_resource_id`'s scope) and
    its suspended run; only when that finds no run is the thread read, to answer NotFound (no
    such thread in scope) or Conflict (nothing to resume).
    """
    with transaction.atomic():
        run = _lock_newest_suspended_run(
            thread_id, lock_thread=True, pinned_resource_id=pinned_resource_id, waiting=True
        )
        if run is None:
            _thread_in_scope(thread_id, pinned_resource_id)
            raise _nothing_to_resume(thread_id)
        waiting = _waiting_calls(run)
        writes = _deferred(run, waiting)
        # The Agent Inbox's [HumanResponse] list, or LangChain's {"decisions": [...]}.
        in_convention = conventions.parse(waiting, resume, _tool_parameters(run, waiting))
        if in_convention is not None:
            return _carry_out(run, in_convention, actor)
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
                    raise ValidationFailed.field(
                        f"resume.{tc.tool_call_id}",
                        'expected {"approved": bool}',
                        detail=f"Tool call {tc.tool_call_id} needs an approval: resume with "
                        '{"approved": true} or {"approved": false, "reason": "..."}',
                    )
                comment = _checked_comment(
                    value.get("comment"), f"resume.{tc.tool_call_id}.comment"
                )
                if value["approved"]:
                    args = value.get("args")
                    if args is not None:
                        _validate_edited_args(run, tc, args)
                    _decide(
                        run,
                        tc,
                        decision="approved",
                        actor=actor,
                        args=args,
                        comment=comment,
                        writes=writes,
                    )
                elif comment:
                    raise ValidationFailed.field(
                        f"resume.{tc.tool_call_id}.comment",
                        "only with an approval (a decline gives a reason)",
                    )
                else:
                    _decide(
                        run,
                        tc,
                        decision="declined",
                        actor=actor,
                        reason=str(value.get("reason") or ""),
                        writes=writes,
                    )
            else:
                _validate_resume_data(tc, value)
                _decide(run, tc, decision="answered", actor=actor, resume_data=value, writes=writes)
        return _after_decision(run, actor, writes=writes, waiting=waiting)


def _lock_suspended_run_of(thread: Thread) -> Run:
    """Lock the thread, then its suspended top-level run (Conflict when there is none)."""
    run = _lock_newest_suspended_run(thread.id, lock_thread=True)
    if run is None:
        raise _nothing_to_resume(thread.id)
    return run


def _nothing_to_resume(thread_id: UUID) -> Conflict:
    return Conflict(f"Thread {thread_id} has no suspended run to resume", code="nothing_to_resume")


def _tool_parameters(run: Run, waiting: list[ToolCall]) -> dict[str, dict[str, Any] | None]:
    try:
        agent = get_agent(run.agent_id)
    except NotFound:
        return {}
    tools = {tc.tool_name: agent.get_tool(tc.tool_name) for tc in waiting}
    return {name: tool.parameters if tool else None for name, tool in tools.items()}


def _carry_out(run: Run, decisions: list[conventions.Decision], actor: Actor) -> Run:
    """Carry out decisions read from a convention (caller holds the thread and run locks)."""
    if any(d.kind == "ignore" for d in decisions):
        # "Ignore" resolves the item without running the tool: the run ends interrupted
        # (audited as a cancel with that reason).
        via = next(d.via for d in decisions if d.kind == "ignore")
        _cancel_locked(
            run,
            action=CancelAction.INTERRUPT,
            actor=actor,
            reason=conventions.IGNORED_REASON,
            via=via,
        )
        return run
    for d in decisions:
        tc = d.tool_call
        if d.kind == "approve":
            if d.args is not None:
                _validate_edited_args(run, tc, d.args)
            _decide(run, tc, decision="approved", actor=actor, args=d.args, via=d.via)
        elif d.kind == "decline":
            _decide(run, tc, decision="declined", actor=actor, reason=d.reason, via=d.via)
        else:
            _validate_resume_data(tc, d.data)
            _decide(run, tc, decision="answered", actor=actor, resume_data=d.data, via=d.via)
    return _after_decision(run, actor)


def _looks_like_value_for(tc: ToolCall, value: JSONObject) -> bool:
    # {"approved": ...} or data matching the tool's schema is a value, not an id map.
    if tc.status == ToolCallStatus.AWAITING_APPROVAL:
        return "approved" in value
    return not schema_errors(tc.resume_schema, value)


def _validate_edited_args(run: Run, tc: ToolCall, args: JSONValue) -> None:
    if not isinstance(args, dict):
        raise ValidationFailed.field("args", "must be an object", detail="args must be an object")
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


def _validate_resume_data(tc: ToolCall, data: JSONValue) -> None:
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
    args: JSONObject | None = None,
    reason: str = "",
    comment: str = "",
    resume_data: JSONValue = None,
    carry_down: bool = True,
    carried_from: Run | None = None,
    via: str = "",
    writes: _Writes | None = None,
) -> None:
    """Record one decision on a waiting tool call (caller holds the run lock).

    `via` names the convention the client decided in (e.g. "agent_inbox:edit"), for the audit.

    On a delegation call (`child_run` set) the decision is carried down to the sub-agent's
    waiting calls unless it came up from there (`carry_down=False`).

    `writes` (`_deferred`): the call's row, the event and the audit entry are collected there
    and written by `_after_decision` in one statement, instead of four or five now.
    """
    now = _now()
    before = {"status": tc.status, "args": tc.args}
    tc.decided_by = actor_name(actor)
    tc.decided_at = now
    tc.decision_reason = reason
    tc.decision_comment = comment if decision == "approved" else ""
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
    if writes is not None:
        writes.statements.append(
            update_statement(
                ToolCall,
                {name: getattr(tc, name) for name in _DECIDED_COLUMNS},
                "id = %s",
                [_uuid_param(tc.id)],
            )
        )
        writes.document |= tc.original_args is not None or resume_data is not None
    else:
        tc.save()
        if tc.original_args is not None or resume_data is not None:
            search_refresh(run_ids=[tc.run_id])  # edited arguments or an answer
    transaction.on_commit(lambda: _count_decision(decision, tc.suspended_at, now))
    data: JSONObject = {
        "tool_call_id": tc.tool_call_id,
        "tool_name": tc.tool_name,
        "decision": decision,
    }
    if tc.original_args is not None and decision == "approved":
        data["args"] = tc.args
        data["original_args"] = tc.original_args
    if reason:
        data["reason"] = reason
    if tc.decision_comment:
        data["comment"] = tc.decision_comment
    if decision == "answered":
        data["resume_data"] = resume_data
    if carried_from is not None:
        data["carried_from_run_id"] = str(carried_from.id)
    if via:
        data["via"] = via
    event = ("decision", data, actor_name(actor))
    if writes is not None:
        run.last_seq += 1  # read under the lock; `_after_decision` writes it
        writes.statements += insert_statements(_event_rows(run.id, run.last_seq, [event]))
    else:
        run.last_seq = _append_events(run.id, [event])
    audit = _audit_entry(
        actor=actor,
        action={"approved": "approve", "declined": "decline", "answered": "answer"}[decision],
        run=run,
        tool_call_id=tc.tool_call_id,
        # An approval has no reason; its comment is what the reviewer wrote.
        reason=reason or tc.decision_comment,
        before=before,
        after={
            "status": tc.status,
            "args": tc.args,
            **({"comment": tc.decision_comment} if tc.decision_comment else {}),
            **({"resume_data": resume_data} if decision == "answered" else {}),
            **({"via": via} if via else {}),
        },
    )
    if writes is not None:
        writes.statements += insert_statements([audit])
    else:
        insert([audit])
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
            comment=comment,
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
    args: JSONObject | None,
    reason: str,
    comment: str,
    resume_data: JSONValue,
) -> None:
    """A decision on a supervisor's delegation call decides the sub-agent's waiting calls."""
    if tc.child_run_id is None:  # the caller checks; this narrows the type
        return
    child = Run.objects.select_for_update(no_key=True).filter(id=tc.child_run_id).first()
    if child is None or child.status != RunStatus.SUSPENDED:
        return
    waiting = _waiting_calls(child)
    if args is not None and len(waiting) != 1:
        raise ValidationFailed.field(
            "args",
            "ambiguous for several sub-agent calls",
            detail=f"the sub-agent run {child.id} waits on {len(waiting)} calls; edit arguments on it directly",
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
            comment=comment,
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


def _after_decision(
    run: Run, actor: Actor, *, writes: _Writes | None = None, waiting: Sequence[ToolCall] = ()
) -> Run:
    """After a decision on `run`: continue it when nothing is left waiting (and its parents).

    With `writes` (`_deferred`; `waiting`: the run's calls that were waiting, as decided in
    hand) the decisions and what follows them are written in one statement."""
    if writes is not None:
        return _after_deferred(run, actor, writes, waiting)
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
        _refresh_thread(top.thread_id, one_in_flight=True)
        _notify(QUEUE_CHANNEL)
    run.refresh_from_db()
    return run


# The columns a decision changes on a tool call (`_decide`).
_DECIDED_COLUMNS = (
    "status",
    "decided_by",
    "decided_at",
    "decision_reason",
    "decision_comment",
    "args",
    "original_args",
    "resume_data",
)


@dataclass
class _Writes:
    """The decisions on one run, collected to be written together (`_after_deferred`)."""

    statements: list[tuple[str, list[Any]]] = field(default_factory=list)
    document: bool = False  # an edit or an answer: the run's search document changes


def _deferred(run: Run, waiting: list[ToolCall]) -> _Writes | None:
    """Collect the decisions on `run` to write them together, when nothing but the run and its
    calls takes part (a top-level run; no call delegated to a sub-agent run)."""
    if run.parent_run_id is not None or any(tc.child_run_id is not None for tc in waiting):
        return None
    return _Writes()


_RUN_DECIDED_SQL = "UPDATE runs_run SET status = %s, last_seq = %s, updated_at = %s WHERE id = %s"


def _after_deferred(run: Run, actor: Actor, writes: _Writes, waiting: Sequence[ToolCall]) -> Run:
    """`_after_decision` of decisions collected in `writes`: the calls, events and audit
    entries, the run (pending again once nothing waits, with its `resumed` event), its thread
    (busy: the run is queued) and the workers' wake-up, in one statement on PostgreSQL."""
    now = _now()
    db_now = DateTimeField().get_db_prep_value(now, connection)
    released = not any(tc.status in PENDING_DECISION_STATUSES for tc in waiting)
    told: list[str] = []
    told_params: list[Any] = []
    if released:
        run.status = RunStatus.PENDING
        run.last_seq += 1
        writes.statements += insert_statements(
            _event_rows(run.id, run.last_seq, [("resumed", {}, actor_name(actor))])
        )
    run.updated_at = now
    writes.statements.append(
        (_RUN_DECIDED_SQL, [run.status, run.last_seq, db_now, _uuid_param(run.id)])
    )
    if released:
        if run.thread_id is not None:
            writes.statements.append(
                (
                    "UPDATE runs_thread SET status = %s, updated_at = %s WHERE id = %s",
                    [ThreadStatus.BUSY.value, db_now, _uuid_param(run.thread_id)],
                )
            )
        told, told_params = _notified_by_select(QUEUE_CHANNEL, [""])
    # The transaction's last statement (its COMMIT with it) unless the document is refreshed.
    write_together(
        writes.statements,
        f"SELECT {', '.join(told) or '1'}",
        told_params,
        connection.alias,
        commit=not writes.document,
    )
    if writes.document:
        search_refresh(run_ids=[run.id])  # edited arguments or an answer
    _publish(run)
    return run
