"""The run page's deliveries region reads its rows itself, so the page's view stays as it is."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import template

from runs.models import DUE_DELIVERY_STATUSES
from runs.selectors.notifications import deliveries_for_run

register = template.Library()


@register.simple_tag
def run_deliveries(run_id: UUID) -> dict[str, Any]:
    """The run's deliveries, and whether any is still due (the region refreshes itself then)."""
    rows = deliveries_for_run(run_id)
    return {"rows": rows, "open": any(d.status in DUE_DELIVERY_STATUSES for d in rows)}
