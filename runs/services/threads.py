"""Threads: create, update metadata, delete, write state by hand."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from django.db import IntegrityError, transaction

from runs.contracts import Actor, JSONObject, JSONValue
from runs.exceptions import Conflict, NotFound, Unsupported, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    CancelAction,
    Checkpoint,
    Run,
    RunStatus,
    Thread,
)
from runs.rows import insert
from runs.services import thread_hints
from runs.services.cancel import _cancel_locked, _notify_cancel_many
from runs.services.core import (
    _audit,
    _check_json_size,
    _check_scope,
    _lock_thread,
    _now,
)
from runs.services.search import search_refresh_thread


def thread_create(
    *,
    metadata: JSONObject | None = None,
    thread_id: UUID | None = None,
    if_exists: str = "raise",
    pinned_resource_id: str | None = None,
    ttl: JSONValue = None,
) -> Thread:
    """Create a thread. `ttl` is LangGraph's: minutes, or {"ttl": minutes, "strategy":
    "delete"}; the reaper deletes the thread once it has been idle that long."""
    metadata = dict(metadata or {})
    ttl_minutes = thread_ttl_minutes(ttl)
    if if_exists not in ("raise", "do_nothing"):
        raise ValidationFailed.field(
            "if_exists",
            "must be 'raise' or 'do_nothing'",
            detail=f"if_exists must be 'raise' or 'do_nothing', not {if_exists!r}",
        )
    _check_json_size(metadata, "metadata")
    resource = metadata.get("resource_id")
    # A pinned API key always wins over what the client sends.
    resource_id = pinned_resource_id if pinned_resource_id is not None else resource
    if resource_id is not None and not isinstance(resource_id, str):
        resource_id = str(resource_id)
    if pinned_resource_id is not None:
        metadata["resource_id"] = pinned_resource_id
    fields = {
        "metadata": metadata,
        "resource_id": resource_id,
        "ttl_minutes": ttl_minutes,
        "expires_at": _now() + timedelta(minutes=ttl_minutes) if ttl_minutes else None,
    }
    if thread_id is None:
        # A new id (UUIDv7) cannot collide: one INSERT, no savepoint to catch a duplicate.
        thread = Thread(**fields)
        insert([thread])
        _remember(thread)
        return thread
    with transaction.atomic():
        existing = Thread.objects.filter(id=thread_id).first()
        if existing is not None:
            in_scope = pinned_resource_id is None or existing.resource_id == pinned_resource_id
            if if_exists == "do_nothing" and in_scope:
                return existing
            raise Conflict(f"Thread with ID {thread_id} already exists", code="thread_exists")
        try:
            with transaction.atomic():
                thread = Thread.objects.create(id=thread_id, **fields)
        except IntegrityError:
            raise Conflict(
                f"Thread with ID {thread_id} already exists", code="thread_exists"
            ) from None
        _remember(thread)
    return thread


def _remember(thread: Thread) -> None:
    """What the thread holds as this process's hint for a run's creation in one statement
    (`thread_hints`): remembered at once, since a hint whose transaction rolls back only costs
    that creation a round trip."""
    thread_hints.remember(thread.id, thread.metadata)


def thread_ttl_minutes(ttl: JSONValue) -> float | None:
    """LangGraph's thread `ttl`: a number of minutes or {"ttl": n, "strategy": "delete"}."""
    if ttl is None:
        return None
    if isinstance(ttl, dict):
        unknown = sorted(set(ttl) - {"ttl", "strategy"})
        if unknown:
            raise ValidationFailed.field(f"ttl.{unknown[0]}", "unknown field")
        strategy = ttl.get("strategy", "delete")
        if strategy == "keep_latest":
            raise Unsupported(
                "ttl.strategy",
                "ttl.strategy 'keep_latest' is not supported by Runsite; use 'delete'",
            )
        if strategy != "delete":
            raise ValidationFailed.field("ttl.strategy", "must be delete or keep_latest")
        minutes, name = ttl.get("ttl"), "ttl.ttl"
    else:
        minutes, name = ttl, "ttl"
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not minutes > 0:
        raise ValidationFailed.field(name, "must be a positive number of minutes")
    if minutes > 60 * 24 * 365 * 100:
        raise ValidationFailed.field(name, "must be at most 100 years")
    return float(minutes)


def thread_update(*, thread: Thread, metadata: JSONObject, ttl: JSONValue = None) -> Thread:
    """Merge `metadata` into the thread's metadata (keys set to None are kept as None); a
    `ttl` replaces the thread's time to live, counted from now."""
    if not isinstance(metadata, dict):
        raise ValidationFailed.field(
            "metadata", "not an object", detail="metadata must be an object"
        )
    ttl_minutes = thread_ttl_minutes(ttl)
    with transaction.atomic():
        _lock_thread(thread.id)
        thread.refresh_from_db()
        merged = {**thread.metadata, **metadata}
        _check_json_size(merged, "metadata")
        if thread.resource_id is not None:
            merged["resource_id"] = thread.metadata.get("resource_id", thread.resource_id)
        thread.metadata = merged
        fields = ["metadata", "updated_at"]
        if ttl_minutes is not None:
            thread.ttl_minutes = ttl_minutes
            thread.expires_at = _now() + timedelta(minutes=ttl_minutes)
            fields += ["ttl_minutes", "expires_at"]
        thread.save(update_fields=fields)
        search_refresh_thread(thread_id=thread.id)
        _remember(thread)
    return thread


def thread_delete(*, thread: Thread, actor: Actor) -> None:
    with transaction.atomic():
        _lock_thread(thread.id)
        active = list(
            Run.objects.filter(thread_id=thread.id, status__in=ACTIVE_STATUSES).values_list(
                "id", "lease_owner"
            )
        )
        if active:
            # Running work would be orphaned; their workers' fenced writes fail and they stop.
            _notify_cancel_many(active, CancelAction.ROLLBACK)  # deleted with the thread
        _audit(
            actor=actor,
            action="thread_delete",
            thread_id=thread.id,
            reason=f"deleted thread with {len(active)} active run(s)",
            before={"active_runs": [str(run_id) for run_id, _ in active]},
        )
        Thread.objects.filter(id=thread.id).delete()


def thread_update_state(*, thread: Thread, values: JSONValue, actor: Actor) -> Checkpoint:
    """Write a checkpoint by hand (LangGraph `POST /threads/{id}/state`)."""
    if values is not None and not isinstance(values, dict):
        raise ValidationFailed.field(
            "values",
            "must be an object or null",
            detail="values must be an object or null",
        )
    _check_json_size(values, "values")
    with transaction.atomic():
        _lock_thread(thread.id)
        # A run waiting for a human holds the thread: its snapshot would overwrite this edit.
        if Run.objects.filter(
            thread_id=thread.id, parent_run__isnull=True, status__in=ACTIVE_STATUSES
        ).exists():
            # LangGraph's wording, so clients that match on it keep working.
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


RESOLVED_REASON = "marked as resolved in review"


def thread_resolve_suspended(*, thread: Thread, actor: Actor) -> Checkpoint | None:
    """LangGraph `update_state(values=None, as_node="__end__")` on a thread waiting for a human:
    the Agent Inbox's "mark as resolved". The suspended run ends `interrupted` without running
    the tools it waits on (audited); the thread keeps its latest checkpoint, which is returned.
    Returns None when nothing on the thread waits for a human.
    """
    with transaction.atomic():
        _lock_thread(thread.id)
        run = (
            Run.objects.select_for_update(no_key=True)
            .filter(thread_id=thread.id, parent_run__isnull=True, status=RunStatus.SUSPENDED)
            .first()
        )
        if run is None:
            return None
        _cancel_locked(
            run,
            action=CancelAction.INTERRUPT,
            actor=actor,
            reason=RESOLVED_REASON,
            via="update_state:__end__",
        )
        return Checkpoint.objects.filter(thread_id=thread.id).order_by("-created_at", "-id").first()


def _thread_in_scope(thread_id: UUID, pinned_resource_id: str | None) -> Thread:
    thread = Thread.objects.filter(id=thread_id).first()
    if thread is None:
        raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
    _check_scope(thread, pinned_resource_id, "Thread")
    return thread
