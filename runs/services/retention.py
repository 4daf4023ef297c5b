"""Retention: delete old ended runs (and threads they leave empty), old audit entries, and
threads by LangGraph's `POST /threads/prune`.

Pruning shares the tables with the queue, so it never waits behind the engine: each batch is
its own short transaction with a lock timeout, takes only rows nobody holds (`SKIP LOCKED`),
and a thread with a pending, running or suspended run is never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from runs.contracts import Actor
from runs.exceptions import Unsupported, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AuditEntry,
    Checkpoint,
    GraphCheckpoint,
    GraphWrite,
    Run,
    RunEvent,
    RunSearch,
    Thread,
    ToolCall,
)
from runs.services.core import _audit, _is_postgres, _now, logger
from runs.services.threads import thread_delete

DEFAULT_BATCH_SIZE = 500
# Long enough for a normal write to finish, short enough that a claim queued behind a prune
# batch never waits long (claims skip the rows we lock anyway).
PRUNE_LOCK_TIMEOUT_MS = 200
PRUNE_STRATEGIES = ("delete", "keep_latest")


@dataclass
class PruneResult:
    runs: int = 0
    threads: int = 0
    batches: int = 0
    dry_run: bool = False
    complete: bool = True  # False: stopped at the time budget, more is left


def _statuses(statuses: Iterable[str] | None) -> list[str]:
    chosen = [str(s) for s in (statuses or TERMINAL_STATUSES)]
    bad = [s for s in chosen if s not in TERMINAL_STATUSES]
    if bad:
        allowed = ", ".join(TERMINAL_STATUSES)
        raise ValidationFailed.field(
            "status",
            f"must be ended statuses ({allowed})",
            detail=f"status {', '.join(map(repr, bad))} cannot be pruned; only {allowed} runs",
        )
    return chosen


def prunable_runs(*, cutoff: datetime, statuses: Iterable[str] | None = None) -> QuerySet[Run]:
    """Top-level ended runs that ended before `cutoff`, on threads with nothing in flight."""
    active_on_thread = Run.objects.filter(
        thread_id=OuterRef("thread_id"), status__in=ACTIVE_STATUSES
    )
    # Every way a run ends sets finished_at (finish, cancel, reaper), so this is the partial
    # index run_ended_idx, walked oldest first.
    return Run.objects.filter(
        finished_at__lt=cutoff,
        parent_run__isnull=True,
        status__in=_statuses(statuses),
    ).filter(~Exists(active_on_thread))


def runs_prune(
    *,
    older_than: timedelta,
    statuses: Sequence[str] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    time_budget: float | None = None,
    actor: Actor = None,
) -> PruneResult:
    """Delete ended runs older than `older_than` with their events, checkpoints, tool calls,
    graph checkpoints and writes, and the threads left empty (not touched within the window).

    Pending, running and suspended runs and their threads are never touched; the audit log is
    kept. Each batch commits on its own; `time_budget` (seconds) bounds one call so the worker
    can run it between claims. One audit entry sums up the call.
    """
    if older_than < timedelta(0):
        raise ValidationFailed.field("older_than", "must not be negative")
    if batch_size < 1:
        raise ValidationFailed.field("batch_size", "must be at least 1")
    chosen = _statuses(statuses)
    cutoff = _now() - older_than
    result = PruneResult(dry_run=dry_run)
    if dry_run:
        result.runs = prunable_runs(cutoff=cutoff, statuses=chosen).count()
        return result
    started = time.monotonic()
    held: set[UUID] = set()  # threads someone else held this pass: skipped from then on
    while True:
        if time_budget is not None and time.monotonic() - started > time_budget:
            result.complete = False
            break
        try:
            runs, threads, more = _prune_batch(
                cutoff=cutoff, statuses=chosen, size=batch_size, held=held
            )
        except OperationalError as exc:
            # Lock timeout: someone is using these rows; the next call takes them.
            logger.info("prune: batch gave way to a lock (%s); stopping this pass", exc)
            result.complete = False
            break
        result.batches += 1
        result.runs += runs
        result.threads += threads
        if not more:
            break
    if held:
        # Runs on threads someone held were left for the next pass.
        result.complete = False
    if result.runs or result.threads:
        _audit(
            actor=actor,
            action="prune",
            reason=f"runs ended before {cutoff.isoformat()}",
            after={
                "runs": result.runs,
                "threads": result.threads,
                "statuses": chosen,
                "older_than_seconds": older_than.total_seconds(),
            },
        )
        logger.info("prune: deleted %d run(s) and %d thread(s)", result.runs, result.threads)
    return result


def _prune_batch(
    *, cutoff: datetime, statuses: list[str], size: int, held: set[UUID]
) -> tuple[int, int, bool]:
    """One batch in one transaction: returns (runs deleted, threads deleted, maybe more).
    Threads it finds held by someone else are added to `held` and left out of later batches."""
    with transaction.atomic():
        if _is_postgres():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{PRUNE_LOCK_TIMEOUT_MS}ms'")
        candidates = list(
            prunable_runs(cutoff=cutoff, statuses=statuses)
            .exclude(thread_id__in=held)
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("finished_at", "id")
            .values_list("id", "thread_id")[:size]
        )
        if not candidates:
            return 0, 0, False
        thread_ids = sorted({t for _, t in candidates if t is not None})
        # FOR UPDATE (not NO KEY): a run being created on the thread waits for this short batch
        # or, if it got there first, we skip the thread. Either way nothing new lands on a
        # thread while we decide whether it is empty.
        locked = set(
            Thread.objects.select_for_update(skip_locked=True)
            .filter(id__in=thread_ids)
            .values_list("id", flat=True)
        )
        # Re-checked under the thread locks: a run created on the thread since the candidate
        # query keeps the thread and its history.
        busy = set(
            Run.objects.filter(thread_id__in=locked, status__in=ACTIVE_STATUSES).values_list(
                "thread_id", flat=True
            )
        )
        held.update(t for t in thread_ids if t not in locked)
        run_ids = [r for r, t in candidates if t is None or (t in locked and t not in busy)]
        threads = {t for _, t in candidates if t in locked and t not in busy}
        kept = set(
            Run.objects.filter(thread_id__in=threads, parent_run__isnull=True)
            .exclude(id__in=run_ids)
            .values_list("thread_id", flat=True)
        )
        emptied = set(
            Thread.objects.filter(id__in=threads - kept, updated_at__lt=cutoff).values_list(
                "id", flat=True
            )
        )
        _keep_thread_state(threads - emptied, run_ids)
        _delete_runs(run_ids)
        _delete_threads(emptied)
        # A full batch means there may be more (held threads are excluded from the next one).
        more = len(candidates) == size
    return len(run_ids), len(emptied), more


def _delete_runs(run_ids: list[UUID]) -> None:
    """Delete runs (and their sub-agent runs) with everything that hangs off them.

    Statement by statement in dependency order rather than Django's cascade, which loads every
    checkpoint and run to follow the SET_NULL relations: one batch is a few index-driven DELETEs.
    """
    ids = list(run_ids)
    frontier = ids
    while frontier:
        frontier = list(Run.objects.filter(parent_run_id__in=frontier).values_list("id", flat=True))
        ids += frontier
    if not ids:
        return
    RunEvent.objects.filter(run_id__in=ids).delete()
    ToolCall.objects.filter(run_id__in=ids).delete()
    ToolCall.objects.filter(child_run_id__in=ids).update(child_run=None)
    doomed = Checkpoint.objects.filter(run_id__in=ids)
    Checkpoint.objects.filter(parent__in=doomed).exclude(run_id__in=ids).update(parent=None)
    # _raw_delete: one DELETE. References from outside the set were cleared just above; those
    # inside it go with it (Django's foreign keys are deferred, checked at commit).
    doomed._raw_delete(doomed.db)
    GraphWrite.objects.filter(run_id__in=ids).delete()
    GraphCheckpoint.objects.filter(run_id__in=ids).delete()
    Run.objects.filter(retry_of_id__in=ids).exclude(id__in=ids).update(retry_of=None)
    RunSearch.objects.filter(run_id__in=ids).delete()
    runs = Run.objects.filter(id__in=ids)
    runs._raw_delete(runs.db)


def _delete_threads(thread_ids: set[UUID]) -> None:
    """Delete threads whose runs are gone, with their hand-written checkpoints and graph state."""
    if not thread_ids:
        return
    ids = list(thread_ids)
    doomed = Checkpoint.objects.filter(thread_id__in=ids)
    Checkpoint.objects.filter(parent__in=doomed).exclude(thread_id__in=ids).update(parent=None)
    doomed._raw_delete(doomed.db)
    GraphWrite.objects.filter(thread_id__in=ids).delete()
    GraphCheckpoint.objects.filter(thread_id__in=ids).delete()
    threads = Thread.objects.filter(id__in=ids)
    threads._raw_delete(threads.db)


def _keep_thread_state(thread_ids: set[UUID], run_ids: list[UUID]) -> None:
    """A thread that stays keeps its state: its latest checkpoint (and, for a graph thread, the
    latest checkpoint of each namespace with its writes) is detached from a run we delete.

    Set-based (three UPDATEs per batch, whatever the number of threads): a thread's runs are
    usually spread over many batches, so most batches touch threads that stay.
    """
    if not thread_ids:
        return
    threads = list(thread_ids)
    newer = Checkpoint.objects.filter(thread_id=OuterRef("thread_id")).filter(
        Q(created_at__gt=OuterRef("created_at"))
        | Q(created_at=OuterRef("created_at"), id__gt=OuterRef("id"))
    )
    Checkpoint.objects.filter(thread_id__in=threads, run_id__in=run_ids).filter(
        ~Exists(newer)
    ).update(run=None, parent=None)
    newer_graph = GraphCheckpoint.objects.filter(
        thread_id=OuterRef("thread_id"),
        checkpoint_ns=OuterRef("checkpoint_ns"),
        checkpoint_id__gt=OuterRef("checkpoint_id"),
    )
    GraphCheckpoint.objects.filter(thread_id__in=threads, run_id__in=run_ids).filter(
        ~Exists(newer_graph)
    ).update(run=None)
    # The latest checkpoint's writes are its pending writes: they belong to the state too.
    GraphWrite.objects.filter(thread_id__in=threads, run_id__in=run_ids).filter(
        ~Exists(newer_graph)
    ).update(run=None)


def retention_apply(*, time_budget: float | None = None) -> PruneResult | None:
    """The workers' periodic prune: RUNS_RETENTION_DAYS for runs, RUNS_AUDIT_RETENTION_DAYS
    for the audit log; None when neither is set (keep forever)."""
    result = None
    if settings.RUNS_RETENTION_DAYS is not None:
        result = runs_prune(
            older_than=timedelta(days=settings.RUNS_RETENTION_DAYS),
            time_budget=time_budget,
            actor="system:retention",
        )
    if settings.RUNS_AUDIT_RETENTION_DAYS is not None:
        audit = audit_prune(
            older_than=timedelta(days=settings.RUNS_AUDIT_RETENTION_DAYS),
            time_budget=time_budget,
        )
        result = result or PruneResult()
        result.batches += audit.batches
    return result


def audit_prune(
    *,
    older_than: timedelta,
    batch_size: int = 5000,
    dry_run: bool = False,
    time_budget: float | None = None,
) -> PruneResult:
    """Delete audit entries older than `older_than` (RUNS_AUDIT_RETENTION_DAYS), in batches."""
    if older_than < timedelta(0):
        raise ValidationFailed.field("older_than", "must not be negative")
    old = AuditEntry.objects.filter(created_at__lt=_now() - older_than)
    result = PruneResult(dry_run=dry_run)
    if dry_run:
        result.runs = old.count()
        return result
    started = time.monotonic()
    while True:
        if time_budget is not None and time.monotonic() - started > time_budget:
            result.complete = False
            break
        ids = list(old.order_by("id").values_list("id", flat=True)[:batch_size])
        if not ids:
            break
        with transaction.atomic():
            AuditEntry.objects.filter(id__in=ids).delete()
        result.batches += 1
        result.runs += len(ids)
    return result


def threads_prune(
    *,
    thread_ids: Sequence[UUID],
    strategy: str = "delete",
    actor: Actor,
    pinned_resource_id: str | None = None,
) -> int:
    """LangGraph `POST /threads/prune`: delete the given threads (strategy "delete"), like
    `DELETE /threads/{id}` each. Unknown ids, and threads outside the caller's resource, are
    not counted. Returns how many were pruned."""
    if strategy not in PRUNE_STRATEGIES:
        raise ValidationFailed.field(
            "strategy",
            "must be delete or keep_latest",
            detail=f"strategy must be 'delete' or 'keep_latest'; got {strategy!r}",
        )
    if strategy == "keep_latest":
        raise Unsupported(
            "strategy",
            "strategy 'keep_latest' is not supported by Runsite; use 'delete'",
        )
    qs = Thread.objects.filter(id__in=list(thread_ids))
    if pinned_resource_id is not None:
        qs = qs.filter(resource_id=pinned_resource_id)
    pruned = 0
    for thread in qs.order_by("id"):
        thread_delete(thread=thread, actor=actor)
        pruned += 1
    return pruned
