"""Review deadlines: stamped on a call when it suspends, carried out by the reaper once passed.

An agent (or one of its tools) declares how long a review may take and what happens after:
"decline" (the run continues with the decline and its stated reason), "cancel" (the run is
interrupted), or nothing but the overdue mark. The action goes through the same services a
human uses, as the actor `system:deadline`, so it is audited and published like any decision.

Hook for notifications: `review_deadline_passed` (a Django signal) is sent once per call, after
the commit that handled its deadline, with `tool_call_id`, `run_id`, `agent_id`, `action` and
`outcome` ("declined", "cancelled", or "marked" when the call has no action).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import django.dispatch
from django.db import transaction
from django.db.models import Q

from runs import metrics
from runs.engine.agent import ReviewPolicy
from runs.exceptions import RunsError
from runs.models import (
    PENDING_DECISION_STATUSES,
    CancelAction,
    NotificationEvent,
    ReviewTimeoutAction,
    Run,
    RunStatus,
    ToolCall,
)
from runs.services.cancel import run_cancel
from runs.services.core import _append_events, _lock_run, _lock_timeout, _now, _publish, logger
from runs.services.decisions import tool_call_decline
from runs.services.notifications import _announce

DEADLINE_ACTOR = "system:deadline"
DEFAULT_TIMEOUT_REASON = "Nobody reviewed this tool call before its review deadline."

review_deadline_passed = django.dispatch.Signal()


def review_deadline_fields(policy: ReviewPolicy | None, suspended_at: datetime) -> dict[str, Any]:
    """The ToolCall columns a waiting call gets from its review policy (cleared without one)."""
    if policy is None:
        return {
            "review_deadline_at": None,
            "review_timeout_action": "",
            "review_timeout_reason": "",
            "review_expired_at": None,
        }
    return {
        "review_deadline_at": suspended_at + timedelta(seconds=policy.seconds),
        "review_timeout_action": policy.action or "",
        "review_timeout_reason": policy.reason,
        "review_expired_at": None,
    }


def overdue_condition(now: datetime) -> Q:
    return Q(
        status__in=PENDING_DECISION_STATUSES,
        review_deadline_at__isnull=False,
        review_deadline_at__lte=now,
    )


def reviews_expire(*, now: datetime | None = None, limit: int = 100) -> dict[str, int]:
    """Carry out the action of every waiting call whose review deadline has passed.

    Safe on every worker at once: each call is handled in its own transaction that locks the
    run (thread, then run, as a decision does) and then marks the call with one conditional
    UPDATE (`review_expired_at IS NULL`, still waiting, deadline passed); only the reaper whose
    update matched acts. A human who decided first wins: the call no longer matches.
    """
    now = now or _now()
    counts = {"declined": 0, "cancelled": 0, "marked": 0}
    due = (
        ToolCall.objects.filter(overdue_condition(now), review_expired_at__isnull=True)
        .filter(run__status=RunStatus.SUSPENDED)
        .order_by("review_deadline_at", "id")
        .values_list("id", "run_id")[:limit]
    )
    for tc_id, run_id in list(due):
        try:
            outcome = _expire_one(tc_id, run_id, now)
        except RunsError as exc:
            # The run moved on between the scan and the lock (decided, cancelled, rolled back).
            logger.info("review deadline: skipped tool call %s (%s)", tc_id, exc.detail)
            outcome = None
        if outcome is not None:
            counts[outcome] += 1
            metrics.REVIEW_DEADLINES.labels(outcome).inc()
    return counts


def _expire_one(tc_id: Any, run_id: Any, now: datetime) -> str | None:
    with transaction.atomic():
        _lock_timeout()
        run = _lock_run(run_id)
        won = (
            ToolCall.objects.filter(
                overdue_condition(now), id=tc_id, review_expired_at__isnull=True
            ).update(review_expired_at=now)
            == 1
        )
        if not won or run.status != RunStatus.SUSPENDED:
            return None  # another reaper handled it, or a human decided first
        tc = ToolCall.objects.get(id=tc_id)
        reason = tc.review_timeout_reason or DEFAULT_TIMEOUT_REASON
        action = tc.review_timeout_action
        outcome = {"decline": "declined", "cancel": "cancelled"}.get(action, "marked")
        # On the timeline first, then the action (which publishes the run; "marked" publishes
        # here): the new seq re-renders the inbox row and the overview live.
        data = {"tool_call_id": tc.tool_call_id, "tool_name": tc.tool_name, "action": action}
        run.last_seq = _append_events(run.id, [("review_overdue", data, DEADLINE_ACTOR)])
        # Rules that listen for overdue reviews hear it in this transaction (the outbox).
        _announce(run, NotificationEvent.REVIEW_OVERDUE)
        if action == ReviewTimeoutAction.DECLINE:
            # The same decline a reviewer makes; a claim does not hold the deadline back.
            tool_call_decline(
                run=run,
                actor=DEADLINE_ACTOR,
                tool_call_id=tc.tool_call_id,
                reason=reason,
                take_over=True,
            )
        elif action == ReviewTimeoutAction.CANCEL:
            run_cancel(
                run=_top_level(run),
                action=CancelAction.INTERRUPT,
                actor=DEADLINE_ACTOR,
                reason=reason,
            )
        else:
            _publish(run)
        logger.info("review deadline: run=%s tool_call=%s %s", run.id, tc.tool_call_id, outcome)
        transaction.on_commit(
            lambda: review_deadline_passed.send(
                sender=ToolCall,
                tool_call_id=tc.tool_call_id,
                run_id=run.id,
                agent_id=run.agent_id,
                action=action,
                outcome=outcome,
            )
        )
        return outcome


def _top_level(run: Run) -> Run:
    """Cancel applies to a supervisor's run: a sub-agent run is cancelled through it."""
    while run.parent_run_id is not None:
        run = _lock_run(run.parent_run_id)
    return run
