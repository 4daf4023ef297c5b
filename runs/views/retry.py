"""Retry from the dashboard: "Retry…" on an ended run's page (input editor, validated by the
service against the agent's schema) and "Retry selected…" on the runs list (preview, count and
typed confirmation, like bulk cancel). Needs the cancel permission (the Support group)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from runs import selectors, services
from runs.exceptions import RunsError, ValidationFailed
from runs.forms import BulkRetryForm, RetryForm, RunFilterForm
from runs.fragments import Fragments
from runs.permissions import can_cancel
from runs.selectors import retry as retry_reads
from runs.selectors.search import runs_list
from runs.views import (
    HtmxHttpRequest,
    _denied,
    _filter_items,
    _get_run,
    bulk_done,
    bulk_gate,
    dashboard_view,
)


@require_POST
@dashboard_view
def run_retry(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    if not can_cancel(request.user):
        return _denied(request, "retry runs")
    run = _get_run(request, run_id)
    form = RetryForm(request.POST)
    if not form.is_valid():
        return _retry_form(request, run, form, "Check the input.")
    data = form.cleaned_data
    # Unchanged input is not an edit (the audit entry only records input that was changed).
    edited: dict[str, Any] = {} if data["input"] == run.input else {"input": data["input"]}
    try:
        new = services.run_retry(
            run=run,
            actor=request.user,
            new_thread=data["new_thread"],
            reason=data["reason"] or "",
            **edited,
        )
    except ValidationFailed as exc:
        for error in exc.errors or [{"message": exc.detail}]:
            form.add_error("input", f"{error.get('field', 'input')}: {error['message']}")
        return _retry_form(request, run, form, exc.detail)
    except RunsError as exc:
        return _retry_form(request, run, form, exc.detail, status=exc.status_code)
    messages.success(request, f"Retry of run {run.id} started as this run.")
    target = reverse("runs:run_detail", args=[new.id])
    if request.htmx:
        return HttpResponseClientRedirect(target)
    return redirect(target)


def _retry_form(
    request: HtmxHttpRequest, run: Any, form: RetryForm, text: str, status: int = 422
) -> HttpResponse:
    """The retry form again, as submitted, with its errors (the page without JavaScript)."""
    context = {"run": run, "retry_form": form, "retry_open": True, "oob": True}
    if not request.htmx:
        return render(
            request,
            "runs/retry_confirm.html",
            {**context, "oob": False, "nav": "runs", "error_text": text},
            status=status,
        )
    fragments = Fragments(request.user, request)
    body = fragments.render("retry_form.html", **context) + fragments.flash(text, "error")
    return HttpResponse(body, status=status)


@require_POST
@dashboard_view
def runs_bulk_retry(request: HtmxHttpRequest) -> HttpResponse:
    if not can_cancel(request.user):
        return _denied(request, "retry runs")
    form = BulkRetryForm(request.POST)
    filters_form = RunFilterForm(request.POST)
    context: dict[str, Any] = {"bulk": form, "filter_items": _filter_items(request.POST)}
    if not form.is_valid():
        return _panel(request, context, status=422)
    data = form.cleaned_data
    # What the list shows (its filters, search and the user's tenant scope), or the ticked ids
    # among the runs this user may see (another tenant's id is skipped, never retried).
    queryset, run_ids = None, None
    if data["all_matching"]:
        queryset = runs_list(request.user, filters_form.list_query()).queryset.order_by()
    else:
        run_ids = list(
            selectors.visible_runs(request.user)
            .filter(id__in=data["run_ids"])
            .values_list("id", flat=True)
        )
    preview = retry_reads.runs_retry_preview(run_ids=run_ids, queryset=queryset)
    context.update(preview=preview, limit=services.RETRY_MANY_LIMIT)
    if preview["total"] > services.RETRY_MANY_LIMIT:
        context.update(too_many=True, needs_typed=form.needs_typed_confirmation(preview["total"]))
        return _panel(request, context, status=422)
    status = bulk_gate(form, preview["total"], context)
    if status is not None:
        return _panel(request, context, status=status)
    try:
        result = services.runs_retry_many(
            actor=request.user,
            run_ids=run_ids,
            queryset=queryset,
            new_thread=data["new_thread"],
            reason=data["reason"] or "",
        )
    except RunsError as exc:
        context["service_error"] = exc.detail
        return _panel(request, context, status=exc.status_code)
    n = len(result.retried)
    summary = f"Retried {n} run{'s' if n != 1 else ''}" + (
        f"; skipped {len(result.skipped)}." if result.skipped else "."
    )
    return bulk_done(request, "bulk_retry_panel.html", {**context, "result": result}, summary)


def _panel(request: HtmxHttpRequest, context: dict[str, Any], status: int = 200) -> HttpResponse:
    if not request.htmx:
        return render(
            request,
            "runs/bulk_retry_confirm.html",
            {**context, "oob": False, "nav": "runs"},
            status=status,
        )
    fragments = Fragments(request.user, request)
    return HttpResponse(fragments.render("bulk_retry_panel.html", **context), status=status)
