"""Reads that carry rules: suspended-run listing, search, visibility by resource, stuck runs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connections
from django.db.models import (
    Exists,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
)
from django.utils import timezone

from runs.exceptions import NotFound, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    PENDING_DECISION_STATUSES,
    Checkpoint,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
)
from runs.rows import row_by
from runs.selectors import reviews
from runs.selectors.results import interrupts_of as interrupts_of
from runs.selectors.results import run_outcome as run_outcome
from runs.selectors.results import run_result as run_result
from runs.selectors.results import run_with_outcome as run_with_outcome
from runs.selectors.results import threads_interrupts as threads_interrupts

# The tenant scope (runs/selectors/scope.py), re-exported: `selectors.visible_runs(user)`.
from runs.selectors.scope import (
    NOTHING,  # noqa: F401 (re-exported)
    UNSCOPED,  # noqa: F401 (re-exported)
    Scope,  # noqa: F401 (re-exported)
    scope_for,
    visible_audit_entries,
    visible_events,
    visible_run,  # noqa: F401 (re-exported)
    visible_runs,
    visible_thread,
    visible_threads,  # noqa: F401 (re-exported)
    visible_tool_calls,
)

MAX_PAGE_SIZE = 1000


@dataclass
class Page:
    items: list[Any]
    total: int


def _check_int(value: Any, field: str, *, minimum: int, code: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise ValueError
        except ValueError:
            raise ValidationFailed(
                f"{field} must be an integer, got {value!r}",
                errors=[{"field": field, "message": "must be an integer"}],
                code=code,
            ) from None
    if value < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValidationFailed(
            f"{field} must be {kind}, got {value}",
            errors=[{"field": field, "message": f"must be {kind}"}],
            code=code,
        )
    return value


def validate_pagination(per_page: Any, page: Any) -> tuple[int | None, int | None]:
    """Mastra's contract: per_page positive, page non-negative (zero-based)."""
    per_page = _check_int(per_page, "per_page", minimum=1, code="invalid_per_page")
    page = _check_int(page, "page", minimum=0, code="invalid_page")
    if per_page is not None and per_page > MAX_PAGE_SIZE:
        raise ValidationFailed(
            f"per_page must be at most {MAX_PAGE_SIZE}, got {per_page}",
            errors=[{"field": "per_page", "message": f"at most {MAX_PAGE_SIZE}"}],
            code="invalid_per_page",
        )
    return per_page, page


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


def _check_dates(from_date: datetime | None, to_date: datetime | None) -> None:
    for name, value in (("from_date", from_date), ("to_date", to_date)):
        if value is None:
            continue
        if value.tzinfo is None:
            value = timezone.make_aware(value, UTC)
        if not EARLIEST <= value <= LATEST:
            raise ValidationFailed(
                f"{name} must be between 1970-01-01 and 9999-01-01, got {value.isoformat()}",
                errors=[{"field": name, "message": "out of range"}],
            )
    if from_date and to_date and from_date > to_date:
        raise ValidationFailed(
            "from_date is after to_date",
            errors=[{"field": "from_date", "message": "must not be after to_date"}],
        )


def with_queue_holders(runs: Iterable[Run]) -> list[Run]:
    """Set `behind_run_id` on each run: for a pending run, the run it waits behind on its thread.

    A thread runs one run at a time and a run waiting for a human holds it too, so a pending
    run waits behind the thread's running or suspended run, else behind the pending run queued
    just before it; None when nothing on the thread is ahead of it (it waits for a worker, or
    for its `after_seconds`). One query for the whole page, never per row, and never inside the
    page's own query (a count or a position over an annotated list would compute it per run).
    """
    runs = list(runs)
    pending = [r for r in runs if r.status == RunStatus.PENDING and r.thread_id is not None]
    for run in runs:
        run.behind_run_id = None
    if not pending:
        return runs
    on_threads: dict[UUID, list[tuple[Any, ...]]] = {}
    for row in (
        Run.objects.filter(
            thread_id__in={r.thread_id for r in pending},
            parent_run__isnull=True,
            status__in=ACTIVE_STATUSES,
        )
        .order_by("created_at", "id")
        .values_list("thread_id", "id", "status", "created_at")
    ):
        on_threads.setdefault(row[0], []).append(row[1:])
    for run in pending:
        assert run.thread_id is not None  # `pending` keeps only runs on a thread
        others = [o for o in on_threads.get(run.thread_id, []) if o[0] != run.id]
        holding = [o for o in others if o[1] in (RunStatus.RUNNING, RunStatus.SUSPENDED)]
        ahead = [
            o
            for o in others
            if o[1] == RunStatus.PENDING and (o[2], o[0]) < (run.created_at, run.id)
        ]
        holder = holding[0] if holding else (ahead[-1] if ahead else None)
        run.behind_run_id = holder[0] if holder else None
    return runs


def waiting_tool_calls_prefetch() -> Prefetch:
    return Prefetch(
        "tool_calls",
        queryset=ToolCall.objects.filter(status__in=PENDING_DECISION_STATUSES).order_by(
            "created_at", "id"
        ),
        to_attr="waiting_tool_calls",
    )


def _agent_runs(
    *,
    agent_id: str,
    thread_id: UUID | None,
    resource_id: str | None,
    from_date: datetime | None,
    to_date: datetime | None,
    pinned_resource_id: str | None,
) -> QuerySet[Run]:
    _check_dates(from_date, to_date)
    qs = Run.objects.filter(agent_id=agent_id)
    if thread_id is not None:
        qs = qs.filter(thread_id=thread_id)
    if resource_id is not None:
        qs = qs.filter(resource_id=resource_id)
    if pinned_resource_id is not None:
        # A pinned key always wins: a different resource_id filter simply matches nothing.
        qs = qs.filter(resource_id=pinned_resource_id)
    if from_date is not None:
        qs = qs.filter(created_at__gte=from_date)
    if to_date is not None:
        qs = qs.filter(created_at__lte=to_date)
    return qs


def _paginate(qs: QuerySet, per_page: int | None, page: int | None) -> Page:
    if per_page is not None and page is not None:
        total = qs.count()
        start = per_page * page
        items = list(qs[start : start + per_page]) if start < total else []
        return Page(items=items, total=total)
    items = list(qs)
    return Page(items=items, total=len(items))


def suspended_runs_for_agent(
    *,
    agent_id: str,
    thread_id: UUID | None = None,
    resource_id: str | None = None,
    from_date: datetime | None = None,
    to_date: datetime | None = None,
    per_page: Any = None,
    page: Any = None,
    pinned_resource_id: str | None = None,
) -> Page:
    """Suspended runs started by `agent_id`, newest suspension first (ties by run id).

    Scope follows Mastra's listSuspendedRuns: a supervisor sees its own outer run (waiting on
    the delegation call), a sub-agent's inner run is listed only for the sub-agent. Pagination
    applies only when both per_page and page are given; `total` counts before pagination.
    Each run carries `waiting_tool_calls`.
    """
    per_page, page = validate_pagination(per_page, page)
    qs = (
        _agent_runs(
            agent_id=agent_id,
            thread_id=thread_id,
            resource_id=resource_id,
            from_date=from_date,
            to_date=to_date,
            pinned_resource_id=pinned_resource_id,
        )
        .filter(status=RunStatus.SUSPENDED)
        .order_by("-suspended_at", "-id")
        .prefetch_related(waiting_tool_calls_prefetch())
    )
    return _paginate(qs, per_page, page)


RUN_STATUS_VALUES = tuple(RunStatus.values)


def parse_statuses(status: Any, field: str = "status") -> list[str] | None:
    """Accept one status, a comma list or a list; reject unknown values with the allowed ones."""
    if status in (None, "", []):
        return None
    values = status if isinstance(status, list | tuple) else str(status).split(",")
    values = [str(v).strip() for v in values if str(v).strip()]
    bad = [v for v in values if v not in RUN_STATUS_VALUES]
    if bad:
        raise ValidationFailed(
            f"unknown {field} {', '.join(map(repr, bad))}; use {', '.join(RUN_STATUS_VALUES)}",
            errors=[{"field": field, "message": f"must be one of {', '.join(RUN_STATUS_VALUES)}"}],
        )
    return values


def runs_for_agent(
    *,
    agent_id: str,
    status: Any = None,
    thread_id: UUID | None = None,
    resource_id: str | None = None,
    from_date: datetime | None = None,
    to_date: datetime | None = None,
    per_page: Any = None,
    page: Any = None,
    pinned_resource_id: str | None = None,
) -> Page:
    per_page, page = validate_pagination(per_page, page)
    statuses = parse_statuses(status)
    qs = _agent_runs(
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        from_date=from_date,
        to_date=to_date,
        pinned_resource_id=pinned_resource_id,
    )
    if statuses:
        qs = qs.filter(status__in=statuses)
    qs = qs.order_by("-updated_at", "-id").prefetch_related(waiting_tool_calls_prefetch())
    return _paginate(qs, per_page, page)


def run_get(
    run_id: UUID, *, pinned_resource_id: str | None = None, thread_id: UUID | None = None
) -> Run:
    equal: dict[str, Any] = {"id": run_id}
    if thread_id is not None:
        equal["thread_id"] = thread_id
    if pinned_resource_id is not None:
        equal["resource_id"] = pinned_resource_id
    run = row_by(Run, **equal)
    if run is None:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    return run


def run_for_agent(run_id: UUID, *, agent_id: str, pinned_resource_id: str | None = None) -> Run:
    """A run of this agent; one of another agent is reported as not found (no leak)."""
    run = run_get(run_id, pinned_resource_id=pinned_resource_id)
    if run.agent_id != agent_id:
        raise NotFound(f"Run {run_id} not found for agent {agent_id}", code="run_not_found")
    return run


def thread_get(thread_id: UUID, *, pinned_resource_id: str | None = None) -> Thread:
    equal: dict[str, Any] = {"id": thread_id}
    if pinned_resource_id is not None:
        equal["resource_id"] = pinned_resource_id
    thread = row_by(Thread, **equal)
    if thread is None:
        raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
    return thread


def run_events(run: Run, *, after: int = 0, limit: int = 100) -> list[RunEvent]:
    limit = max(1, min(int(limit), 1000))
    return list(run.events.filter(seq__gt=after).order_by("seq")[:limit])


def run_event(run: Run, seq: int) -> RunEvent:
    """One event of a run the caller may already see (visible_run)."""
    event = run.events.filter(seq=seq).first()
    if event is None:
        raise NotFound(f"Run {run.id} has no event {seq}", code="event_not_found")
    return event


def latest_checkpoint(
    *, thread_id: UUID | None = None, run_id: UUID | None = None
) -> Checkpoint | None:
    qs = Checkpoint.objects.all()
    if thread_id is not None:
        qs = qs.filter(thread_id=thread_id)
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    return qs.order_by("-created_at", "-id").first()


def thread_history(
    thread: Thread, *, limit: int = 10, before: UUID | None = None
) -> list[Checkpoint]:
    qs = Checkpoint.objects.filter(thread_id=thread.id)
    if before is not None:
        anchor = Checkpoint.objects.filter(thread_id=thread.id, id=before).first()
        if anchor is None:
            return []
        qs = qs.filter(
            Q(created_at__lt=anchor.created_at) | Q(created_at=anchor.created_at, id__lt=anchor.id)
        )
    return list(qs.order_by("-created_at", "-id")[: max(1, min(limit, 1000))])


def thread_waiting_tool_calls(thread: Thread) -> list[ToolCall]:
    """The tool calls a thread's suspended runs wait on (LangGraph's thread interrupts)."""
    return list(
        ToolCall.objects.filter(
            run__thread_id=thread.id,
            run__status=RunStatus.SUSPENDED,
            run__parent_run__isnull=True,
            status__in=PENDING_DECISION_STATUSES,
        ).order_by("created_at", "id")
    )


def _json_contains(qs: QuerySet, field: str, wanted: dict[str, Any] | None) -> QuerySet:
    """JSON containment; SQLite has no `contains` on JSONField, so it compares key by key."""
    from django.db import connection

    if not wanted:
        return qs
    if connection.vendor == "postgresql":
        return qs.filter(**{f"{field}__contains": wanted})
    for key, value in wanted.items():
        qs = qs.filter(**{f"{field}__{key}": value})
    return qs


def threads_search(
    *,
    metadata: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
    status: str | None = None,
    ids: list[UUID] | None = None,
    limit: int = 10,
    offset: int = 0,
    sort_by: str = "created_at",
    sort_order: str = "desc",
    pinned_resource_id: str | None = None,
) -> Page:
    qs = Thread.objects.all()
    qs = _json_contains(qs, "metadata", metadata)
    qs = _json_contains(qs, "values", values)
    if status:
        if status not in ThreadStatus.values:
            raise ValidationFailed(
                f"status must be one of {', '.join(ThreadStatus.values)}",
                errors=[{"field": "status", "message": "unknown thread status"}],
            )
        qs = qs.filter(status=status)
    if ids:
        qs = qs.filter(id__in=ids)
    if pinned_resource_id is not None:
        qs = qs.filter(resource_id=pinned_resource_id)
    sort_fields = {
        "thread_id": "id",
        "status": "status",
        "created_at": "created_at",
        "updated_at": "updated_at",
        "state_updated_at": "updated_at",
    }
    if sort_by not in sort_fields:
        raise ValidationFailed(
            f"sort_by must be one of {', '.join(sort_fields)}",
            errors=[{"field": "sort_by", "message": "unknown sort field"}],
        )
    if sort_order not in ("asc", "desc"):
        raise ValidationFailed(
            "sort_order must be asc or desc",
            errors=[{"field": "sort_order", "message": "must be asc or desc"}],
        )
    prefix = "-" if sort_order == "desc" else ""
    qs = qs.order_by(f"{prefix}{sort_fields[sort_by]}", f"{prefix}id")
    total = qs.count()
    return Page(items=list(qs[offset : offset + limit]), total=total)


def thread_runs(
    thread: Thread, *, limit: int = 10, offset: int = 0, status: str | None = None
) -> list[Run]:
    qs = Run.objects.filter(thread_id=thread.id, parent_run__isnull=True)
    statuses = parse_statuses(status)
    if statuses:
        qs = qs.filter(status__in=statuses)
    return list(qs.order_by("-created_at", "-id")[offset : offset + limit])


# --- Dashboard lists -----------------------------------------------------------------------


@dataclass
class RunFilters:
    status: list[str] | None = None
    agent_id: str | None = None
    thread_id: UUID | None = None
    resource_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None
    stuck: bool = False
    tool_name: str | None = None
    waiting_longer_than: timedelta | None = None
    pending_longer_than: timedelta | None = None
    top_level_only: bool = True
    assigned: str | None = None  # "mine" or "unassigned" (claims, selectors/reviews.py)
    viewer: str = ""  # whose "mine"
    overdue: bool = False  # a waiting call is past its review deadline


def stuck_condition(now: datetime | None = None, minutes: int | None = None) -> Q:
    """Running with an expired lease or silent for N minutes, or pending longer than N minutes."""
    now = now or timezone.now()
    minutes = minutes or settings.RUNS_STUCK_MINUTES
    cutoff = now - timedelta(minutes=minutes)
    return (
        Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
        | Q(status=RunStatus.RUNNING, updated_at__lt=cutoff)
        | Q(status=RunStatus.PENDING, created_at__lt=cutoff, not_before__isnull=True)
        | Q(status=RunStatus.PENDING, not_before__lt=cutoff)
    )


def runs_filtered(filters: RunFilters, *, user: Any) -> QuerySet[Run]:
    """The base of every dashboard run list (runs, inbox, overview, bulk cancel, live pushes):
    the runs `user` may see (`scope_for`) that match `filters`."""
    qs = visible_runs(user)
    if filters.top_level_only:
        qs = qs.filter(parent_run__isnull=True)
    if filters.status:
        qs = qs.filter(status__in=filters.status)
    if filters.agent_id:
        qs = qs.filter(agent_id=filters.agent_id)
    if filters.thread_id:
        qs = qs.filter(thread_id=filters.thread_id)
    if filters.resource_id:
        qs = qs.filter(resource_id=filters.resource_id)
    if filters.created_from:
        qs = qs.filter(created_at__gte=filters.created_from)
    if filters.created_to:
        qs = qs.filter(created_at__lte=filters.created_to)
    if filters.stuck:
        qs = qs.filter(stuck_condition())
    if filters.pending_longer_than:
        qs = qs.filter(
            status=RunStatus.PENDING,
            created_at__lt=timezone.now() - filters.pending_longer_than,
        )
    if filters.tool_name:
        qs = qs.filter(
            Exists(
                ToolCall.objects.filter(
                    run=OuterRef("pk"),
                    tool_name=filters.tool_name,
                    status__in=PENDING_DECISION_STATUSES,
                )
            )
        )
    if filters.waiting_longer_than:
        qs = qs.filter(
            status=RunStatus.SUSPENDED,
            suspended_at__lt=timezone.now() - filters.waiting_longer_than,
        )
    if filters.assigned:
        qs = qs.filter(reviews.assigned_condition(filters.assigned, filters.viewer))
    if filters.overdue:
        qs = qs.filter(reviews.overdue_condition())
    return qs


def inbox(filters: RunFilters, *, user: Any, oldest_first: bool = False) -> QuerySet[Run]:
    """Suspended runs for reviewers (every agent), with their waiting tool calls."""
    qs = runs_filtered(filters, user=user).filter(status=RunStatus.SUSPENDED)
    order = ("suspended_at", "id") if oldest_first else ("-suspended_at", "-id")
    return qs.order_by(*order).prefetch_related(waiting_tool_calls_prefetch())


def status_counts(*, user: Any) -> dict[str, int]:
    from django.db.models import Count

    counts = {s: 0 for s in RunStatus.values}
    for row in (
        visible_runs(user).filter(parent_run__isnull=True).values("status").annotate(n=Count("id"))
    ):
        counts[row["status"]] = row["n"]
    return counts


# --- Dashboard pages (runs/views.py, runs/consumers.py) ------------------------------------

# Timeline kinds worth a line in the overview's activity feed (steps and updates are noise).
ACTIVITY_KINDS = (
    "created",
    "suspended",
    "decision",
    "cancel_requested",
    "cancelled",
    "finished",
    "lease_expired",
    "retry",
    "review_overdue",
)


@dataclass
class HourBucket:
    hour: datetime
    success: int = 0
    failed: int = 0  # error and timeout
    cancelled: int = 0  # interrupted (rolled-back runs no longer exist)

    @property
    def total(self) -> int:
        return self.success + self.failed + self.cancelled


@dataclass
class Overview:
    counts: dict[str, int]
    suspended_longest: list[Run]
    stuck: list[Run]
    stuck_total: int
    activity: list[RunEvent]
    hourly: list[HourBucket]
    reviews_overdue: int = 0


def runs_ended_per_hour(
    *, user: Any, hours: int = 24, now: datetime | None = None
) -> list[HourBucket]:
    """Top-level runs that ended in each of the last `hours` hours, oldest hour first."""
    from django.db.models import Count
    from django.db.models.functions import TruncHour

    from runs.models import TERMINAL_STATUSES

    now = now or timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    hours_list = [start + timedelta(hours=i) for i in range(hours)]
    buckets = {hour: HourBucket(hour=hour) for hour in hours_list}
    rows = (
        visible_runs(user)
        .filter(parent_run__isnull=True, finished_at__gte=start, status__in=TERMINAL_STATUSES)
        .annotate(hour=TruncHour("finished_at"))
        .values("hour", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        bucket = buckets.get(row["hour"])
        if bucket is None:
            continue
        if row["status"] == RunStatus.SUCCESS:
            bucket.success += row["n"]
        elif row["status"] == RunStatus.INTERRUPTED:
            bucket.cancelled += row["n"]
        else:
            bucket.failed += row["n"]
    return list(buckets.values())


def activity_feed(*, user: Any, limit: int = 15) -> list[RunEvent]:
    """The latest notable events across the runs `user` sees, newest first, each with its run."""
    return list(
        visible_events(user)
        .filter(kind__in=ACTIVITY_KINDS)
        .select_related("run")
        .order_by("-created_at", "-id")[:limit]
    )


def dashboard_overview(*, user: Any, limit: int = 8) -> Overview:
    """Everything the overview page shows, over the runs `user` sees: counts, oldest waits,
    stuck runs, activity, chart. (/metrics is the operators' global view.)"""
    scope = scope_for(user)
    stuck = runs_filtered(RunFilters(stuck=True), user=scope).order_by("created_at", "id")
    return Overview(
        counts=status_counts(user=scope),
        suspended_longest=list(inbox(RunFilters(), user=scope, oldest_first=True)[:limit]),
        stuck=list(stuck[:limit]),
        stuck_total=stuck.count(),
        activity=activity_feed(user=scope),
        hourly=runs_ended_per_hour(user=scope),
        reviews_overdue=reviews.reviews_overdue_count(user=scope),
    )


def counts(*querysets: QuerySet[Any]) -> list[int]:
    """The number of rows of each queryset, in one statement (one round trip, not one each)."""
    parts: list[str] = []
    params: list[Any] = []
    for n, queryset in enumerate(querysets):
        sql, args = queryset.order_by().values("pk").query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS counted_{n})")
        params.extend(args)
    with connections[querysets[0].db].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        row = cursor.fetchone()
    return [int(n) for n in row]


def inbox_rows(run_ids: list[UUID], *, user: Any) -> list[Run]:
    """Runs as the inbox shows them, decided or not: waiting calls plus every tool call."""
    return list(
        visible_runs(user)
        .filter(id__in=run_ids)
        .prefetch_related(
            waiting_tool_calls_prefetch(),
            Prefetch("tool_calls", queryset=ToolCall.objects.order_by("created_at", "id")),
        )
    )


@dataclass
class RunPage:
    run: Run
    tool_calls: list[ToolCall]  # the latest ones plus every one still waiting, in order
    tool_calls_total: int
    checkpoints: list[Checkpoint]  # the latest ones, newest first, `values` deferred
    checkpoints_total: int
    state: Any  # values of the run's latest checkpoint
    children: list[Run]
    events: list[RunEvent]  # newest first
    delegated_from: ToolCall | None  # the supervisor's call that started this sub-agent run
    revert_to: Checkpoint | None  # the thread state a rollback of this run goes back to


def run_page(
    run_id: UUID,
    *,
    user: Any,
    events_limit: int = 100,
    events_before: int | None = None,
    tool_calls_limit: int = 50,
    checkpoints_limit: int = 20,
) -> RunPage:
    """One run with everything its dashboard page shows, bounded for long runs."""
    # Another tenant's run is "not found", like a missing one. Its sub-agent runs and the
    # supervisor's call share its resource (run_create_child copies it).
    run = visible_runs(user).select_related("thread", "parent_run").filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    with_queue_holders([run])
    events = run.events.order_by("-seq")
    if events_before is not None:
        events = events.filter(seq__lt=events_before)
    revert_to = None
    if run.thread_id is not None and run.parent_run_id is None:
        revert_to = (
            Checkpoint.objects.filter(thread_id=run.thread_id)
            .exclude(run_id=run.id)
            .defer("values")
            .order_by("-created_at", "-id")
            .first()
        )
    calls = run.tool_calls.select_related("child_run")
    latest = list(calls.order_by("-step", "-created_at", "-id")[:tool_calls_limit])
    seen = {tc.id for tc in latest}
    waiting = [tc for tc in calls.filter(status__in=PENDING_DECISION_STATUSES) if tc.id not in seen]
    tool_calls = sorted([*latest, *waiting], key=lambda tc: (tc.step, tc.created_at, tc.id))
    checkpoints = list(run.checkpoints.defer("values").order_by("-step")[:checkpoints_limit])
    return RunPage(
        run=run,
        tool_calls=tool_calls,
        tool_calls_total=len(tool_calls) if len(latest) < tool_calls_limit else calls.count(),
        checkpoints=checkpoints,
        checkpoints_total=(
            len(checkpoints) if len(checkpoints) < checkpoints_limit else run.checkpoints.count()
        ),
        state=(
            run.checkpoints.order_by("-step").values_list("values", flat=True).first()
            if checkpoints
            else None
        ),
        children=list(run.child_runs.order_by("created_at", "id")),
        events=list(events[: max(1, min(events_limit, 1000))]),
        delegated_from=(
            ToolCall.objects.filter(child_run_id=run.id).first() if run.parent_run_id else None
        ),
        revert_to=revert_to,
    )


def tool_call_get(run_id: UUID, tool_call_id: str, *, user: Any) -> ToolCall:
    """One tool call of a run `user` sees, with its run (the API passes UNSCOPED: its key's
    pin has already been applied to the run)."""
    tc = (
        visible_tool_calls(user)
        .select_related("run")
        .filter(run_id=run_id, tool_call_id=tool_call_id)
        .first()
    )
    if tc is None:
        raise NotFound(
            f"Tool call {tool_call_id} not found on run {run_id}", code="tool_call_not_found"
        )
    return tc


@dataclass
class ThreadPage:
    thread: Thread
    runs: list[Run]
    runs_total: int
    checkpoints: list[Checkpoint]


def thread_page(thread_id: UUID, *, user: Any, limit: int = 50) -> ThreadPage:
    """A thread `user` sees with its top-level runs (newest first) and its checkpoint history."""
    thread = visible_thread(user, thread_id)
    runs = visible_runs(user).filter(thread_id=thread.id, parent_run__isnull=True)
    return ThreadPage(
        thread=thread,
        runs=with_queue_holders(
            runs.order_by("-created_at", "-id").prefetch_related(waiting_tool_calls_prefetch())[
                :limit
            ]
        ),
        runs_total=runs.count(),
        checkpoints=thread_history(thread, limit=limit),
    )


def runs_cancel_preview(
    *,
    user: Any,
    run_ids: list[UUID] | None = None,
    queryset: QuerySet[Run] | None = None,
    include_suspended: bool = True,
) -> dict[str, int]:
    """What runs_cancel_many would touch: active top-level runs by status, plus "total".

    `suspended` always counts the selection's runs waiting for a human (so the page can say
    how many there are); "total" includes them only with `include_suspended`.
    """
    from django.db.models import Count

    qs = queryset if queryset is not None else Run.objects.filter(id__in=list(run_ids or []))
    # The count a person confirms is the count of runs they may cancel, whatever was posted.
    qs = qs.filter(scope_for(user).q())
    counts: dict[str, int] = {s: 0 for s in ACTIVE_STATUSES}
    rows = (
        qs.filter(parent_run__isnull=True, status__in=ACTIVE_STATUSES)
        .values("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        counts[row["status"]] = row["n"]
    total = sum(n for s, n in counts.items() if include_suspended or s != RunStatus.SUSPENDED)
    return {**counts, "total": total}


@dataclass
class AuditFilters:
    actor: str | None = None
    action: str | None = None
    run_id: UUID | None = None
    thread_id: UUID | None = None
    agent_id: str | None = None
    resource_id: str | None = None
    created_from: datetime | None = None
    created_to: datetime | None = None


def audit_entries(filters: AuditFilters, *, user: Any) -> QuerySet[Any]:
    """Audit entries of the resources `user` sees matching `filters`, newest first."""
    qs = visible_audit_entries(user)
    if filters.actor:
        qs = qs.filter(actor=filters.actor)
    if filters.action:
        qs = qs.filter(action=filters.action)
    if filters.run_id:
        qs = qs.filter(run_id=filters.run_id)
    if filters.thread_id:
        qs = qs.filter(thread_id=filters.thread_id)
    if filters.agent_id:
        qs = qs.filter(agent_id=filters.agent_id)
    if filters.resource_id:
        qs = qs.filter(resource_id=filters.resource_id)
    if filters.created_from:
        qs = qs.filter(created_at__gte=filters.created_from)
    if filters.created_to:
        qs = qs.filter(created_at__lte=filters.created_to)
    return qs.order_by("-created_at", "-id")


def active_run_ids(run_ids: list[UUID]) -> list[UUID]:
    return list(
        Run.objects.filter(id__in=run_ids, status__in=ACTIVE_STATUSES).values_list("id", flat=True)
    )


# --- JSON API: keys, streams, LangGraph-shaped reads ------------------------------------------


def api_key_for_raw(raw: str) -> Any:
    """The active ApiKey whose hash matches `raw`, or None (revoked and unknown keys alike)."""
    from runs.models import ApiKey

    if not raw:
        return None
    return api_key_for_hash(ApiKey.hash_key(raw))


def api_key_for_hash(key_hash: str) -> Any:
    """The active ApiKey with this hash (`ApiKey.hash_key`), or None."""
    from runs.models import ApiKey

    return row_by(ApiKey, key_hash=key_hash, revoked_at=None)


def run_stream_state(
    run_id: UUID, *, after: int = 0, limit: int = 200
) -> tuple[str | None, int, list[RunEvent]]:
    """(status, attempt, events after `after`) of a run; status None once it was deleted.

    The status is read before the events: a status and the events that led to it commit in one
    transaction, so a stopped status read first guarantees its final events are in the batch.
    """
    row = Run.objects.filter(id=run_id).values_list("status", "attempt").first()
    if row is None:
        return None, 0, []
    if not limit:
        return row[0], row[1], []
    events = list(RunEvent.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[:limit])
    return row[0], row[1], events


def thread_checkpoint(thread: Thread, checkpoint_id: UUID) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(thread_id=thread.id, id=checkpoint_id).first()
    if checkpoint is None:
        raise NotFound(
            f"Checkpoint {checkpoint_id} not found on thread {thread.id}",
            code="checkpoint_not_found",
        )
    return checkpoint


@dataclass
class RunDetail:
    run: Run
    tool_calls: list[ToolCall]
    checkpoint: Checkpoint | None


def run_detail(run_id: UUID, *, pinned_resource_id: str | None = None) -> RunDetail:
    """A run with all its tool calls and its latest checkpoint (the review API's run view)."""
    run = run_get(run_id, pinned_resource_id=pinned_resource_id)
    return RunDetail(
        run=run,
        tool_calls=list(run.tool_calls.order_by("step", "created_at", "id")),
        checkpoint=latest_checkpoint(run_id=run.id),
    )
