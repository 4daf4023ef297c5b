"""Claims from the dashboard: claim (or renew), assign, release; and the take-over confirmation.

A claim answers htmx with the inbox row (or, from the run page, the run's regions) plus a
flash; every other open inbox hears of it over the websocket (the claim moves the run's seq).
A decision on an item another reviewer holds is answered with a confirmation that re-posts the
same form with `take_over=1` (`take_over_confirm`), so no decision form needs a field of its own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from runs import selectors, services
from runs.exceptions import ClaimedByOther, RunsError
from runs.fragments import Fragments
from runs.permissions import can_review
from runs.views import (
    HtmxHttpRequest,
    _card_response,
    _denied,
    _missing,
    _origin,
    _tool_call,
    dashboard_view,
)

# Form fields a confirmation must not copy: its own, and the CSRF token (sent again).
_NOT_COPIED = {"take_over", "csrfmiddlewaretoken"}


def _minutes(request: HtmxHttpRequest) -> Any:
    raw = request.POST.get("minutes", "").strip()
    if not raw:
        return services.DEFAULT_CLAIM_MINUTES
    try:
        return int(raw)
    except ValueError:
        return raw  # the service refuses it, naming the field


def _answer(
    request: HtmxHttpRequest,
    run_id: UUID,
    text: str,
    origin: str,
    *,
    error: RunsError | None = None,
) -> HttpResponse:
    """What a claim or a release answers: the call's inbox row or card as it is now and a
    flash (the service's refusal, when `error`); without JavaScript, back with a message."""
    if not request.htmx:
        (messages.error if error else messages.success)(request, text)
        return redirect("runs:inbox") if origin == "inbox" else redirect("runs:run_detail", run_id)
    if origin != "inbox" and error is None:
        return _card_response(request, run_id, flash=(text, "success"))
    fragments = Fragments(request.user, request)
    rows = selectors.inbox_rows([run_id], user=request.user) if origin == "inbox" else []
    body = fragments.inbox_row(rows[0]) if rows else ""
    if error is None:
        return HttpResponse(body + fragments.flash(text, "success"))
    return HttpResponse(body + fragments.flash(text, "warning"), status=error.status_code)


def _claim_error(
    request: HtmxHttpRequest, run_id: UUID, exc: RunsError, origin: str
) -> HttpResponse:
    return _answer(request, run_id, exc.detail, origin, error=exc)


@require_POST
@dashboard_view
def tool_call_claim(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """Claim a waiting call for `minutes` (renew one's claim), or assign it (`assignee`)."""
    if not can_review(request.user):
        return _denied(request, "claim tool calls")
    origin = _origin(request)
    tc = _tool_call(request, run_id)
    if tc is None:
        return _missing(request, run_id, origin)
    assignee = request.POST.get("assignee", "").strip() or None
    try:
        claimed = services.tool_call_claim(
            actor=request.user, tool_call=tc, minutes=_minutes(request), assignee=assignee
        )
    except RunsError as exc:
        return _claim_error(request, run_id, exc, origin)
    if assignee and claimed.claimed_by != request.user.get_username():
        text = f"Assigned to {claimed.claimed_by}."
    else:
        text = "Claimed: it is yours for the next few minutes."
    return _answer(request, run_id, text, origin)


@require_POST
@dashboard_view
def tool_call_release(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    if not can_review(request.user):
        return _denied(request, "release tool calls")
    origin = _origin(request)
    tc = _tool_call(request, run_id)
    if tc is None:
        return _missing(request, run_id, origin)
    try:
        services.tool_call_release(actor=request.user, tool_call=tc)
    except RunsError as exc:
        return _claim_error(request, run_id, exc, origin)
    return _answer(request, run_id, "Released.", origin)


def take_over_confirm(
    request: HtmxHttpRequest, run_id: UUID, exc: ClaimedByOther, origin: str
) -> HttpResponse:
    """409: someone else holds the call. Offer the same decision again, as a take-over."""
    fields = [(k, v) for k, values in request.POST.lists() if k not in _NOT_COPIED for v in values]
    context = {
        "holder": exc.claimed_by,
        "until": datetime.fromisoformat(exc.claimed_until) if exc.claimed_until else None,
        "action": request.path,
        "fields": fields,
        "run_id": run_id,
    }
    if not request.htmx:
        return render(
            request, "runs/take_over_confirm.html", {**context, "nav": "inbox"}, status=409
        )
    fragments = Fragments(request.user, request)
    return HttpResponse(fragments.render("take_over_confirm.html", **context), status=409)
