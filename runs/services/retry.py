"""Retry: re-run an ended run (same or edited input) as a new run, on its thread or a new one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from django.db import transaction
from django.db.models import QuerySet

from runs.contracts import Actor, JSONValue, actor_name
from runs.exceptions import Conflict, RunsError, ValidationFailed
from runs.models import TERMINAL_STATUSES, MultitaskStrategy, Run
from runs.services.core import (
    _UNSET,
    _append_events,
    _audit,
    _check_scope,
    _lock_run,
    _publish,
    _Unset,
)
from runs.services.runs import run_create
from runs.services.threads import thread_create

# A bulk retry creates one run per selected run; more than this is refused, not truncated.
RETRY_MANY_LIMIT = 1000

# kwargs that belong to how the original was created, not to what it ran.
_NOT_COPIED_KWARGS = ("on_completion", "command")


@dataclass
class RetryManyResult:
    retried: list[tuple[UUID, UUID]] = field(default_factory=list)  # (original, new run)
    skipped: list[tuple[UUID, str]] = field(default_factory=list)  # (original, why)


def run_retry(
    *,
    run: Run,
    actor: Actor,
    input: JSONValue | _Unset = _UNSET,
    new_thread: bool = False,
    reason: str = "",
    pinned_resource_id: str | None = None,
) -> Run:
    """Create a new run with the input of an ended run (or `input`, checked against the agent's
    input schema by `run_create`). On the same thread the new run queues behind anything in
    flight (a suspended run holds the thread); `new_thread` copies the thread's metadata and
    resource. The new run's `retry_of` and metadata name the original; both are audited.
    """
    _check_scope(run, pinned_resource_id, "Run")
    if run.parent_run_id is not None:
        raise Conflict(
            f"Run {run.id} is a sub-agent run; retry its supervisor run {run.parent_run_id}",
            code="sub_agent_run",
        )
    if run.status not in TERMINAL_STATUSES:
        raise Conflict(
            f"Run {run.id} is {run.status}; only ended runs (success, error, timeout, "
            "interrupted) can be retried",
            code="run_not_ended",
            extra={"status": run.status},
        )
    edited = not isinstance(input, _Unset)
    new_input = input if not isinstance(input, _Unset) else run.input
    kwargs = {k: v for k, v in (run.kwargs or {}).items() if k not in _NOT_COPIED_KWARGS}
    metadata = {
        **{k: v for k, v in (run.metadata or {}).items() if k != "retry_of"},
        "retry_of": str(run.id),
    }
    thread = run.thread
    stateless = thread is None or thread.delete_when_done
    with transaction.atomic():
        thread_id: UUID | None = None
        if stateless:
            # A stateless run's thread is temporary (deleted after the run): so is the retry's.
            kwargs.pop("on_completion", None)
        elif new_thread:
            assert thread is not None
            copy = {k: v for k, v in (thread.metadata or {}).items() if k != "retry_of"}
            thread_id = thread_create(
                metadata={**copy, "retry_of": str(run.id)},
                pinned_resource_id=thread.resource_id,
            ).id
        else:
            thread_id = run.thread_id
        created = run_create(
            agent_id=run.agent_id,
            actor=actor,
            thread_id=thread_id,
            input=new_input,
            metadata=metadata,
            kwargs=kwargs,
            multitask_strategy=MultitaskStrategy.ENQUEUE,
            pinned_resource_id=pinned_resource_id
            if pinned_resource_id is not None
            else (thread.resource_id if stateless and thread is not None else None),
        )
        Run.objects.filter(id=created.id).update(retry_of=run.id)
        created.retry_of_id = run.id
        # The original's timeline says where it went; its page updates live.
        original = _lock_run(run.id)
        original.last_seq = _append_events(
            original.id,
            [("retried", {"run_id": str(created.id), "edited_input": edited}, actor_name(actor))],
        )
        _audit(
            actor=actor,
            action="retry",
            run=original,
            reason=reason,
            before={"status": original.status, **({"input": run.input} if edited else {})},
            after={
                "retried_as": str(created.id),
                "thread_id": str(created.thread_id) if created.thread_id else None,
                "new_thread": created.thread_id != run.thread_id,
                **({"input": new_input} if edited else {}),
            },
        )
        _publish(original)
    return created


def runs_retry_many(
    *,
    actor: Actor,
    run_ids: Sequence[UUID] | None = None,
    queryset: QuerySet[Run] | None = None,
    new_thread: bool = False,
    reason: str = "",
    pinned_resource_id: str | None = None,
    limit: int | None = None,
) -> RetryManyResult:
    """Retry many ended runs, each with its own input, each in its own transaction.

    By ids or by a filtered queryset (the caller's scope already applied); runs that are not
    ended, and sub-agent runs, are skipped, as is a run whose input no longer fits its agent's
    schema: a bulk action must not fail because of one run. More than `limit`: refused.
    """
    limit = RETRY_MANY_LIMIT if limit is None else limit
    if (run_ids is None) == (queryset is None):
        raise ValidationFailed.field("run_ids", "give either run_ids or a filter")
    qs = queryset if queryset is not None else Run.objects.filter(id__in=list(run_ids or []))
    qs = qs.filter(parent_run__isnull=True, status__in=TERMINAL_STATUSES)
    if pinned_resource_id is not None:
        qs = qs.filter(resource_id=pinned_resource_id)
    targets = list(qs.select_related("thread").order_by("created_at", "id")[: limit + 1])
    if len(targets) > limit:
        raise ValidationFailed.field(
            "run_ids" if run_ids is not None else "status",
            f"selects more than {limit} runs",
            detail=f"This would retry more than {limit} runs; narrow the selection",
        )
    result = RetryManyResult()
    found = {r.id for r in targets}
    for rid in run_ids or []:
        if rid not in found:
            result.skipped.append((rid, "not an ended run in scope"))
    for run in targets:
        try:
            new = run_retry(
                run=run,
                actor=actor,
                new_thread=new_thread,
                reason=reason,
                pinned_resource_id=pinned_resource_id,
            )
        except RunsError as exc:
            result.skipped.append((run.id, exc.detail))
        else:
            result.retried.append((run.id, new.id))
    return result
