"""The conversation of a run or a thread as chat turns: the region a page's "Refresh" fetches
(htmx), or a page of its own with every turn (a plain GET, "earlier messages…")."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from runs import selectors
from runs.selectors.review_context import MAX_CHAT_TURNS
from runs.views import HtmxHttpRequest, _get_run, _get_thread, dashboard_view


def _chat(
    request: HtmxHttpRequest, *, scope: str, owner: Any, values: Any, title: str, back: str
) -> HttpResponse:
    context = {"chat_scope": scope, "chat_owner": owner, "chat_values": values}
    if request.htmx:
        return render(
            request, "runs/_fragments/chat.html", {**context, "chat_limit": 0, "oob": False}
        )
    return render(
        request,
        "runs/chat_page.html",
        {
            **context,
            "chat_limit": MAX_CHAT_TURNS,
            "title": title,
            "back": back,
            "nav": "runs",
            "oob": False,
        },
    )


@require_GET
@dashboard_view
def run_chat(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """The run's conversation: its latest checkpoint's messages."""
    run = _get_run(request, run_id)
    checkpoint = selectors.latest_checkpoint(run_id=run.id)
    return _chat(
        request,
        scope="run",
        owner=run,
        values=checkpoint.values if checkpoint is not None else None,
        title=f"Conversation of {run.agent_id} run {str(run.id)[:8]}",
        back=reverse("runs:run_detail", args=[run.id]),
    )


@require_GET
@dashboard_view
def thread_chat(request: HtmxHttpRequest, thread_id: UUID) -> HttpResponse:
    """The thread's conversation: its current values' messages."""
    thread = _get_thread(request, thread_id)
    return _chat(
        request,
        scope="thread",
        owner=thread,
        values=thread.values,
        title=f"Conversation of thread {str(thread.id)[:8]}",
        back=reverse("runs:thread_detail", args=[thread.id]),
    )
