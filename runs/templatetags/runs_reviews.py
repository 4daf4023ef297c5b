"""Template helpers of review claims and deadlines (templates/runs/_fragments/inbox_claim.html)."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from runs.models import ToolCall

register = template.Library()


@register.filter
def claim_holder(tc: ToolCall) -> str:
    """Who holds the call now ("" when nobody, or the claim ran out)."""
    return tc.claim_holder(timezone.now())


def deadline_text(deadline: datetime, now: datetime) -> str:
    """ "12 min left" / "overdue by 3 min" (static/runs/app.js keeps the text current)."""
    seconds = (deadline - now).total_seconds()
    span = abs(seconds)
    if span < 60:
        amount = f"{int(span)} s"
    elif span < 3600:
        amount = f"{int(span // 60)} min"
    elif span < 86400:
        amount = f"{int(span // 3600)} h"
    else:
        amount = f"{int(span // 86400)} d"
    return f"{amount} left" if seconds > 0 else f"overdue by {amount}"


@register.simple_tag
def review_deadline(tc: ToolCall) -> SafeString:
    if tc.review_deadline_at is None:
        return SafeString("")
    now = timezone.now()
    overdue = tc.review_deadline_at <= now
    exact = timezone.localtime(tc.review_deadline_at).strftime("%Y-%m-%d %H:%M:%S %Z")
    action = {"decline": "then declined", "cancel": "then the run is cancelled"}.get(
        tc.review_timeout_action, "then marked overdue"
    )
    return format_html(
        '<time class="deadline{}" data-deadline datetime="{}" title="Review by {} ({})">{}</time>',
        " overdue" if overdue else "",
        tc.review_deadline_at.isoformat(),
        exact,
        action,
        deadline_text(tc.review_deadline_at, now),
    )
