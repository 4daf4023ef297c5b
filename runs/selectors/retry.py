"""Reads for retry: which ended runs a filter selects, what a bulk retry would touch, and the
links between a run and its retries. Built on `runs_filtered`, the runs list's base queryset,
so whatever scoping applies to the list applies here."""

from __future__ import annotations

from uuid import UUID

from django.db.models import Count, QuerySet

from runs.models import TERMINAL_STATUSES, Run
from runs.selectors import UNSCOPED, RunFilters, runs_filtered


def runs_for_retry(
    *, status: str | None = None, agent_id: str | None = None, scope: str | None = None
) -> QuerySet[Run]:
    """Ended top-level runs with `status` (default: any ended), of `agent_id`, in `scope` (the
    resource a caller is pinned to: API keys and commands, not dashboard users)."""
    statuses = [status] if status else [str(s) for s in TERMINAL_STATUSES]
    qs = runs_filtered(RunFilters(status=statuses, agent_id=agent_id or None), user=UNSCOPED)
    if scope is not None:
        qs = qs.filter(resource_id=scope)
    return qs


def runs_retry_preview(
    *, run_ids: list[UUID] | None = None, queryset: QuerySet[Run] | None = None
) -> dict[str, int]:
    """What runs_retry_many would retry: ended top-level runs by status, plus "total" and
    "not_ended" (selected runs still in flight, which a retry skips)."""
    qs = queryset if queryset is not None else Run.objects.filter(id__in=list(run_ids or []))
    qs = qs.filter(parent_run__isnull=True)
    counts: dict[str, int] = dict.fromkeys(TERMINAL_STATUSES, 0)
    not_ended = 0
    for row in qs.values("status").annotate(n=Count("id")).order_by():
        if row["status"] in counts:
            counts[row["status"]] = row["n"]
        else:
            not_ended += row["n"]
    return {**counts, "total": sum(counts.values()), "not_ended": not_ended}


def run_retries(run: Run, limit: int = 20) -> list[Run]:
    """The runs that retried `run`, newest first (the run page's "retried as" links)."""
    return list(
        Run.objects.filter(retry_of=run)
        .only("id", "status", "thread_id", "created_at", "agent_id")
        .order_by("-created_at", "-id")[:limit]
    )
