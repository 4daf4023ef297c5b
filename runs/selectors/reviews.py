"""Reads about reviews of waiting tool calls: who holds them (claims) and their deadlines."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Now

from runs.exceptions import Conflict, NotFound
from runs.models import PENDING_DECISION_STATUSES, Run, RunStatus, ToolCall
from runs.selectors.scope import visible_tool_calls

ASSIGNED_CHOICES = ("all", "mine", "unassigned")


def _live_claim() -> Q:
    # Now() is evaluated by the database on every execution: a socket keeps its queryset for
    # its whole life, and a claim that ran out since must stop counting.
    return Q(claimed_until__gt=Now()) & ~Q(claimed_by="")


def assigned_condition(assigned: str | None, viewer: str) -> Q:
    """Runs (of the inbox) with a waiting call held by `viewer` (mine) or held by nobody."""
    if assigned not in ("mine", "unassigned"):
        return Q()
    waiting = ToolCall.objects.filter(run=OuterRef("pk"), status__in=PENDING_DECISION_STATUSES)
    if assigned == "mine":
        return Q(Exists(waiting.filter(_live_claim(), claimed_by=viewer)))
    return Q(Exists(waiting.exclude(_live_claim())))


def overdue_condition() -> Q:
    """Runs with a waiting call past its review deadline."""
    return Q(
        Exists(
            ToolCall.objects.filter(
                run=OuterRef("pk"),
                status__in=PENDING_DECISION_STATUSES,
                review_deadline_at__lte=Now(),
            )
        )
    )


def reviews_overdue_count(*, user: Any) -> int:
    """Waiting tool calls of suspended runs past their review deadline that `user` may see
    (the overview; /metrics passes UNSCOPED)."""
    return (
        visible_tool_calls(user)
        .filter(
            status__in=PENDING_DECISION_STATUSES,
            run__status=RunStatus.SUSPENDED,
            review_deadline_at__lte=Now(),
        )
        .count()
    )


def reviewer_names() -> list[str]:
    """Active users who may review, by username: who an item can be assigned to."""
    users = get_user_model().objects.filter(is_active=True).order_by("username")
    perm = Q(user_permissions__codename="review_run") | Q(
        groups__permissions__codename="review_run"
    )
    return list(
        users.filter(perm | Q(is_superuser=True)).distinct().values_list("username", flat=True)
    )


def waiting_call(run: Run, tool_call_id: str | None) -> ToolCall:
    """The call a claim addresses: the named one, or the run's only waiting call."""
    if tool_call_id is not None:
        tc = ToolCall.objects.select_related("run").filter(run=run, tool_call_id=tool_call_id)
        found = tc.first()
        if found is None:
            raise NotFound(
                f"Tool call {tool_call_id} not found on run {run.id}", code="tool_call_not_found"
            )
        return found
    waiting = list(
        ToolCall.objects.select_related("run")
        .filter(run=run, status__in=PENDING_DECISION_STATUSES)
        .order_by("created_at", "id")
    )
    if len(waiting) != 1:
        ids = [tc.tool_call_id for tc in waiting]
        raise Conflict(
            f"Run {run.id} waits on {len(ids)} tool calls; say which one with tool_call_id"
            + (f" (pending: {', '.join(ids)})" if ids else ""),
            code="tool_call_required",
            extra={"pending_tool_call_ids": ids},
        )
    return waiting[0]
