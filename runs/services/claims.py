"""Claims on waiting tool calls: "I'm on it" for a while, renewable, or handed to a colleague.

A claim is advisory for reading (everyone sees who holds an item) and binding for deciding: a
reviewer who decides an item someone else holds must say so (`take_over`), and the take-over
is audited. An expired claim is no claim. Every change appends a timeline event, so the run's
sequence number moves and the inbox rows of every open browser are re-rendered live.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q

from runs.contracts import Actor, actor_name
from runs.exceptions import ClaimedByOther, Conflict, NotFound, ValidationFailed
from runs.models import PENDING_DECISION_STATUSES, Run, RunStatus, ToolCall
from runs.services.core import (
    _append_events,
    _audit,
    _check_scope,
    _lock_run,
    _now,
    _publish,
    logger,
)

DEFAULT_CLAIM_MINUTES = 15
MAX_CLAIM_MINUTES = 8 * 60


def _claimed_by_other(tc: ToolCall) -> ClaimedByOther:
    until = tc.claimed_until.isoformat() if tc.claimed_until else None
    return ClaimedByOther(
        f"Tool call {tc.tool_call_id} is claimed by {tc.claimed_by} until {until}",
        claimed_by=tc.claimed_by,
        claimed_until=until,
    )


def _minutes(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (1 <= value <= MAX_CLAIM_MINUTES)
    ):
        raise ValidationFailed.field(
            "minutes",
            f"must be a whole number from 1 to {MAX_CLAIM_MINUTES}",
            detail=f"minutes must be a whole number from 1 to {MAX_CLAIM_MINUTES}, got {value!r}",
        )
    return value


def _reviewer(username: str) -> str:
    """The username of an active user allowed to review (ValidationFailed naming `assignee`)."""
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None or not user.has_perm("runs.review_run"):
        raise ValidationFailed.field(
            "assignee",
            "not a reviewer",
            detail=f"assignee {username!r} is not an active user with the review permission",
        )
    return str(user.get_username())


def _locked_waiting_call(tool_call: ToolCall, verb: str) -> tuple[Run, ToolCall]:
    """Lock the call's run (thread, then run: the decisions' lock order), then re-read the call."""
    run = _lock_run(tool_call.run_id)
    tc = ToolCall.objects.filter(id=tool_call.id).first()
    if tc is None:
        raise NotFound(f"Tool call {tool_call.tool_call_id} not found", code="tool_call_not_found")
    if run.status != RunStatus.SUSPENDED or not tc.is_waiting:
        raise Conflict(
            f"Tool call {tc.tool_call_id} is {tc.status}, not waiting for a human; "
            f"there is nothing to {verb}",
            code="tool_call_not_waiting",
            extra={"status": tc.status},
        )
    return run, tc


def _announce(run: Run, tc: ToolCall, kind: str, actor: Actor, **data: Any) -> None:
    run.last_seq = _append_events(
        run.id,
        [
            (
                kind,
                {"tool_call_id": tc.tool_call_id, "tool_name": tc.tool_name, **data},
                actor_name(actor),
            )
        ],
    )
    _publish(run)


def tool_call_claim(
    *,
    actor: Actor,
    tool_call: ToolCall,
    minutes: int = DEFAULT_CLAIM_MINUTES,
    assignee: str | None = None,
    pinned_resource_id: str | None = None,
) -> ToolCall:
    """Claim a waiting call for `minutes` (renewing one's own claim), or assign it to a reviewer.

    Succeeds when nobody holds the call, the claim ran out, or the actor holds it; otherwise
    ClaimedByOther. Assigning hands the actor's claim (or a free item) to `assignee`.
    """
    minutes = _minutes(minutes)
    me = actor_name(actor)
    holder = _reviewer(assignee) if assignee else me
    _check_scope(tool_call.run, pinned_resource_id, "Run")
    with transaction.atomic():
        run, tc = _locked_waiting_call(tool_call, "claim")
        now = _now()
        until = now + timedelta(minutes=minutes)
        # The race: two reviewers press Claim at once. The run lock already serialises them
        # here; the condition is what makes the loser lose (it sees the winner's claim).
        won = (
            ToolCall.objects.filter(id=tc.id, status__in=PENDING_DECISION_STATUSES)
            .filter(Q(claimed_by="") | Q(claimed_until__lt=now) | Q(claimed_by=me))
            .update(claimed_by=holder, claimed_until=until)
        )
        if won != 1:
            raise _claimed_by_other(tc)
        before = {"claimed_by": tc.claim_holder(now)}
        tc.claimed_by, tc.claimed_until = holder, until
        kind = "assigned" if holder != me else "claimed"
        _audit(
            actor=actor,
            action="claim" if holder == me else "assign",
            run=run,
            tool_call_id=tc.tool_call_id,
            before=before,
            after={"claimed_by": holder, "claimed_until": until.isoformat()},
        )
        _announce(run, tc, kind, actor, claimed_by=holder, claimed_until=until.isoformat())
        logger.info("claim run=%s tool_call=%s %s by=%s", run.id, tc.tool_call_id, holder, me)
        return tc


def tool_call_release(
    *, actor: Actor, tool_call: ToolCall, pinned_resource_id: str | None = None
) -> ToolCall:
    """Give up one's claim. Releasing someone else's live claim is refused (ClaimedByOther);
    releasing an item nobody holds changes nothing and succeeds (idempotent)."""
    me = actor_name(actor)
    _check_scope(tool_call.run, pinned_resource_id, "Run")
    with transaction.atomic():
        run, tc = _locked_waiting_call(tool_call, "release")
        now = _now()
        holder = tc.claim_holder(now)
        if holder and holder != me:
            raise _claimed_by_other(tc)
        if not tc.claimed_by:
            return tc
        ToolCall.objects.filter(id=tc.id).update(claimed_by="", claimed_until=None)
        tc.claimed_by, tc.claimed_until = "", None
        _audit(
            actor=actor,
            action="release",
            run=run,
            tool_call_id=tc.tool_call_id,
            before={"claimed_by": holder},
            after={"claimed_by": ""},
        )
        _announce(run, tc, "released", actor)
        return tc


def check_claim(run: Run, tc: ToolCall, actor: Actor, *, take_over: bool, now: datetime) -> None:
    """Before a decision on `tc` (caller holds the run lock): refuse it when another reviewer
    holds the call, unless the actor takes it over, which is audited."""
    holder = tc.claim_holder(now)
    if not holder or holder == actor_name(actor):
        return
    if not take_over:
        raise _claimed_by_other(tc)
    _audit(
        actor=actor,
        action="take_over",
        run=run,
        tool_call_id=tc.tool_call_id,
        before={
            "claimed_by": holder,
            "claimed_until": tc.claimed_until.isoformat() if tc.claimed_until else None,
        },
        after={"claimed_by": actor_name(actor)},
    )
