"""Reads of the outbox: a run's deliveries, and the stuck runs a rule wants to hear about."""

from __future__ import annotations

from uuid import UUID

from django.db.models import Exists, OuterRef

from runs.models import Delivery, NotificationEvent, NotificationRule, Run
from runs.selectors import stuck_condition


def deliveries_for_run(run_id: UUID, *, limit: int = 50) -> list[Delivery]:
    return list(Delivery.objects.filter(run_id=run_id).order_by("-created_at", "-id")[:limit])


def stuck_runs_to_announce(*, limit: int = 100) -> list[UUID]:
    """Stuck runs (selectors.stuck_condition) of agents with an active `stuck` rule that were
    never announced stuck. Rule events are a JSON list, filtered here in Python: rules are few."""
    agents = {
        r.agent_id
        for r in NotificationRule.objects.filter(active=True).only("agent_id", "events")
        if NotificationEvent.STUCK in (r.events or [])
    }
    if not agents:
        return []
    announced = Delivery.objects.filter(run_id=OuterRef("id"), event=NotificationEvent.STUCK)
    return list(
        Run.objects.filter(stuck_condition(), agent_id__in=agents)
        .exclude(Exists(announced))
        .order_by("created_at")
        .values_list("id", flat=True)[:limit]
    )
