"""State changes of LangGraph graph runs: checkpoints, pending writes, stream events, suspension,
resume and update_state (runs/graphs/ calls these; every worker write is fenced by the lease).

A graph checkpoint is stored twice in one transaction: the serde's bytes in GraphCheckpoint
(what the graph reads back) and, for the root namespace, a JSON projection of its values in
Runsite's Checkpoint under the same id (what thread values, /wait results, the dashboard and a
rollback's revert read). Both belong to the run that wrote them, so a rollback deletes both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q

from runs import metrics
from runs.contracts import Actor, FenceResult, Lease
from runs.engine.registry import review_policy
from runs.exceptions import Conflict
from runs.models import (
    ACTIVE_STATUSES,
    CancelAction,
    Checkpoint,
    GraphCheckpoint,
    GraphWrite,
    Run,
    RunStatus,
    Thread,
    ToolCall,
    ToolCallStatus,
)
from runs.services.cancel import _apply_cancel
from runs.services.core import (
    _audit,
    _check_json_size,
    _complete_lease,
    _fence,
    _insert_events,
    _lock_thread,
    _now,
    _publish,
    _publish_fenced,
    _refresh_thread,
    logger,
)
from runs.services.decisions import (
    _after_decision,
    _decide,
    _lock_suspended_run_of,
    _validate_resume_data,
    _waiting_calls,
)
from runs.services.notifications import _announce
from runs.services.review_deadlines import review_deadline_fields
from runs.webhooks import validate_url

Event = tuple[str, dict[str, Any], str]


@dataclass
class GraphCheckpointWrite:
    """One LangGraph checkpoint to store (built by runs/graphs/checkpointer.py)."""

    thread_id: UUID
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    type: str
    blob: bytes
    metadata: dict[str, Any]
    step: int  # LangGraph's step (-1 for the input checkpoint)
    values: dict[str, Any] | None  # JSON projection (root namespace only)


@dataclass
class GraphWritesWrite:
    thread_id: UUID
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    rows: list[tuple[int, str, str, bytes]]  # (idx, channel, type, blob)
    upsert: bool  # every write is special (__error__, __interrupt__…): the last one wins


def _fenced(lease: Lease | None, events: Sequence[Event]) -> FenceResult | None:
    if lease is None:
        return None
    fence = _fence(lease, events=len(events))
    _insert_events(lease.run_id, fence.last_seq, events)
    _publish_fenced(lease, fence.last_seq)
    return fence


def _store_checkpoint(w: GraphCheckpointWrite, run_id: UUID | None, parent_known: bool) -> None:
    # put is an upsert (LangGraph may put a checkpoint again): one INSERT … ON CONFLICT.
    GraphCheckpoint.objects.bulk_create(
        [
            GraphCheckpoint(
                thread_id=w.thread_id,
                checkpoint_ns=w.checkpoint_ns,
                checkpoint_id=w.checkpoint_id,
                parent_checkpoint_id=w.parent_checkpoint_id,
                run_id=run_id,
                type=w.type,
                checkpoint=w.blob,
                metadata=w.metadata,
            )
        ],
        update_conflicts=True,
        unique_fields=["thread", "checkpoint_ns", "checkpoint_id"],
        update_fields=["parent_checkpoint_id", "run", "type", "checkpoint", "metadata"],
    )
    if w.checkpoint_ns == "" and w.values is not None:
        parent_id = UUID(w.parent_checkpoint_id) if w.parent_checkpoint_id else None
        if (
            parent_id is not None
            and not parent_known
            and not Checkpoint.objects.filter(id=parent_id).exists()
        ):
            parent_id = None  # the parent was rolled back
        # ignore_conflicts: a checkpoint put twice (a retried step) keeps its first projection.
        Checkpoint.objects.bulk_create(
            [
                Checkpoint(
                    id=UUID(w.checkpoint_id),
                    thread_id=w.thread_id,
                    run_id=run_id,
                    parent_id=parent_id,
                    step=max(0, w.step + 1),
                    values=w.values,
                    pending=[],
                )
            ],
            ignore_conflicts=True,
        )


def graph_checkpoint_put(
    *,
    lease: Lease | None,
    write: GraphCheckpointWrite,
    events: Sequence[Event] = (),
    parent_known: bool = False,
) -> FenceResult | None:
    """Store a checkpoint (and the stream events gathered since the last write).

    With a lease: fenced, so a worker that lost its run writes nothing. Without one (tests,
    update_state): the caller holds the thread. `parent_known`: the caller stored the parent
    itself (under the same lease), so it needs no lookup.
    """
    lease = _complete_lease(lease) if lease is not None else None
    with transaction.atomic():
        fence = _fenced(lease, events)
        _store_checkpoint(write, lease.run_id if lease else None, parent_known)
    return fence


def graph_writes_put(
    *, lease: Lease | None, write: GraphWritesWrite, events: Sequence[Event] = ()
) -> FenceResult | None:
    """Store one task's pending writes: the first value of an ordinary write is kept (a task
    replayed after a crash must not replace its first result), special writes are upserted."""
    lease = _complete_lease(lease) if lease is not None else None
    with transaction.atomic():
        fence = _fenced(lease, events)
        key = {
            "thread_id": write.thread_id,
            "checkpoint_ns": write.checkpoint_ns,
            "checkpoint_id": write.checkpoint_id,
            "task_id": write.task_id,
        }
        run_id = lease.run_id if lease else None
        rows = [
            GraphWrite(
                **key,
                task_path=write.task_path,
                idx=idx,
                channel=channel,
                type=type_,
                value=blob,
                run_id=run_id,
            )
            for idx, channel, type_, blob in write.rows
        ]
        if write.upsert:
            GraphWrite.objects.bulk_create(
                rows,
                update_conflicts=True,
                unique_fields=["thread", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                update_fields=["task_path", "channel", "type", "value", "run"],
            )
        else:
            GraphWrite.objects.bulk_create(rows, ignore_conflicts=True)
    return fence


def graph_run_events(*, lease: Lease, events: Sequence[Event]) -> FenceResult | None:
    """Append stream events of a graph run (custom, messages…) to its timeline."""
    if not events:
        return None
    lease = _complete_lease(lease)
    with transaction.atomic():
        return _fenced(lease, events)


def graph_thread_delete_checkpoints(*, thread_id: UUID) -> None:
    """LangGraph's delete_thread: the graph's checkpoints and writes of a thread."""
    with transaction.atomic():
        GraphWrite.objects.filter(thread_id=thread_id).delete()
        GraphCheckpoint.objects.filter(thread_id=thread_id).delete()
        Checkpoint.objects.filter(thread_id=thread_id).delete()


def graph_runs_delete_checkpoints(*, run_ids: Sequence[str]) -> None:
    """LangGraph's delete_for_runs: what these runs wrote (their checkpoints and writes).

    A checkpoint belongs to a run by its `run` (written under the run's lease) or by its
    metadata's run_id (written by a saver used outside a Runsite run).
    """
    ids = [str(r) for r in run_ids]
    uuids = []
    for r in ids:
        with contextlib.suppress(ValueError):
            uuids.append(UUID(r))
    with transaction.atomic():
        owned = GraphCheckpoint.objects.filter(Q(run_id__in=uuids) | Q(metadata__run_id__in=ids))
        for thread_id, ns, checkpoint_id in owned.values_list(
            "thread_id", "checkpoint_ns", "checkpoint_id"
        ):
            GraphWrite.objects.filter(
                thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
            ).delete()
        owned.delete()
        GraphWrite.objects.filter(run_id__in=uuids).delete()
        Checkpoint.objects.filter(run_id__in=uuids).delete()


def graph_run_suspend(
    *,
    lease: Lease,
    waiting: Sequence[dict[str, Any]],
    values: dict[str, Any] | None,
    events: Sequence[Event] = (),
) -> str:
    """Park a graph run for a human: one waiting tool call per pending interrupt.

    `waiting` items carry tool_call_id (the interrupt id), status, tool_name, args,
    suspend_payload (the interrupt value, untouched) and resume_schema. A cancel requested
    while the run was running wins, as in steps.run_suspend. Returns the run's new status.
    """
    lease = _complete_lease(lease)
    interrupts = [{"id": w["tool_call_id"], "value": w["suspend_payload"]} for w in waiting]
    with transaction.atomic():
        _lock_thread(lease.thread_id)
        fence = _fence(lease, events=len(events) + 1)
        if fence.cancel_action:
            _insert_events(lease.run_id, fence.last_seq - 1, events)
            run = Run.objects.select_for_update(no_key=True).get(id=lease.run_id)
            _apply_cancel(run, action=fence.cancel_action, actor=None)
            return "deleted" if fence.cancel_action == CancelAction.ROLLBACK else run.status
        now = _now()
        for w in waiting:
            # An interrupt id seen before (its answer failed the graph's schema) waits again.
            ToolCall.objects.update_or_create(
                run_id=lease.run_id,
                tool_call_id=w["tool_call_id"],
                defaults={
                    "tool_name": w["tool_name"],
                    "args": w.get("args") or {},
                    "status": w["status"],
                    "requires_approval": w["status"] == ToolCallStatus.AWAITING_APPROVAL,
                    "suspend_payload": w["suspend_payload"],
                    "resume_schema": w.get("resume_schema"),
                    "resume_data": None,
                    "decided_by": "",
                    "decided_at": None,
                    "step": w.get("step", 0),
                    "suspended_at": now,
                    **review_deadline_fields(review_policy(lease.agent_id, None), now),
                },
            )
        Run.objects.filter(id=lease.run_id).update(
            status=RunStatus.SUSPENDED,
            suspended_at=now,
            lease_owner=None,
            lease_expires_at=None,
            deadline_at=None,
            updated_at=now,
        )
        _insert_events(
            lease.run_id,
            fence.last_seq,
            [*events, ("suspended", {"interrupts": interrupts}, "system")],
        )
        run = Run.objects.get(id=lease.run_id)
        logger.info(
            "suspend run=%s agent=%s attempt=%s waiting=%s",
            run.id,
            run.agent_id,
            run.attempt,
            [w["tool_call_id"] for w in waiting],
        )
        _publish(run)
        if values is not None:
            _refresh_thread(lease.thread_id, values=values)
        else:
            _refresh_thread(lease.thread_id)
        _announce(run, RunStatus.SUSPENDED)
    metrics.SUSPENSIONS.inc()
    return RunStatus.SUSPENDED


def graph_thread_resume(*, thread: Thread, resume: Any, actor: Actor, webhook: str = "") -> Run:
    """`command.resume` on a graph thread: answer the interrupts its suspended run waits on.

    A map {interrupt_id: value} answers those interrupts; any other value answers the only
    one. Values are kept as given and handed to the graph as Command(resume=…). A `webhook`
    replaces the run's (checked as in run_create).
    """
    _check_json_size(resume, "command.resume")
    if webhook:
        validate_url(webhook, field="webhook")
    with transaction.atomic():
        run = _lock_suspended_run_of(thread)
        waiting = _waiting_calls(run)
        by_id = {tc.tool_call_id: tc for tc in waiting}
        if isinstance(resume, dict) and resume and set(resume) <= set(by_id):
            plan = [(by_id[k], v) for k, v in resume.items()]
        elif len(waiting) == 1:
            plan = [(waiting[0], resume)]
        else:
            raise Conflict(
                f"Run {run.id} waits on {len(waiting)} interrupts; resume with a map "
                f"{{interrupt_id: value}} (pending: {', '.join(by_id)})",
                code="tool_call_required",
                extra={"pending_tool_call_ids": list(by_id)},
            )
        for tc, value in plan:
            if tc.status == ToolCallStatus.AWAITING_INPUT:
                _validate_resume_data(tc, value)  # against the interrupt's response_schema
            _decide(run, tc, decision="answered", actor=actor, resume_data=value)
        if webhook:
            Run.objects.filter(id=run.id).update(webhook=webhook)
            run.webhook = webhook
        return _after_decision(run, actor)


def graph_thread_state_write(
    *, thread: Thread, actor: Actor, write: Any, values: Any, as_node: str | None
) -> Any:
    """update_state on a graph thread: `write()` runs graph.update_state under the thread lock.

    Refused while a run is in flight on the thread (a suspended one holds it), as for agents.
    """
    with transaction.atomic():
        _lock_thread(thread.id)
        if Run.objects.filter(
            thread_id=thread.id, parent_run__isnull=True, status__in=ACTIVE_STATUSES
        ).exists():
            raise Conflict(f"Thread {thread.id} has in-flight runs", code="thread_busy")
        config, projected = write()
        Thread.objects.filter(id=thread.id).update(values=projected, updated_at=_now())
        _audit(
            actor=actor,
            action="state_update",
            thread_id=thread.id,
            after={"values": values, "as_node": as_node},
        )
    return config
