"""Runs list exports, a run's history download, and saved views (the runs list's companions).

Exports take the runs list's own query string (filters, search, sort) and read through the same
selector (`selectors.search.runs_list`), so a file holds exactly what the page lists, in its
order, every page of it. They stream: rows leave as the database hands them over.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import Http404, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from runs import services
from runs.exceptions import NotFound, RunsError, ValidationFailed
from runs.forms import RunFilterForm, SavedViewForm
from runs.list_query import MAX_VIEWS, NAV_VIEWS
from runs.models import Run, SavedView
from runs.selectors import search
from runs.views import HtmxHttpRequest, _csv_cell, _Echo, dashboard_view

EXPORT_COLUMNS = [
    "id",
    "status",
    "agent_id",
    "thread_id",
    "resource_id",
    "parent_run_id",
    "attempt",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
    "duration_seconds",
    "input",
    "output",
    "error",
    "metadata",
]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _run_record(run: Run) -> dict[str, Any]:
    end = run.finished_at
    duration = (end - run.started_at).total_seconds() if run.started_at and end else None
    return {
        "id": str(run.id),
        "status": run.status,
        "agent_id": run.agent_id,
        "thread_id": str(run.thread_id) if run.thread_id else None,
        "resource_id": run.resource_id,
        "parent_run_id": str(run.parent_run_id) if run.parent_run_id else None,
        "attempt": run.attempt,
        "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "updated_at": _iso(run.updated_at),
        "duration_seconds": duration,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "metadata": run.metadata,
    }


def _export_query(request: HtmxHttpRequest) -> search.RunListQuery | HttpResponse:
    """The list's query from the URL; a bad value is refused (a file must not quietly hold
    something else than asked for)."""
    form = RunFilterForm(request.GET)
    if not form.is_valid():
        problems = "; ".join(
            f"{name}: {' '.join(map(str, errs))}" for name, errs in form.errors.items()
        )
        return HttpResponse(f"Bad runs-list parameter ({problems})", status=400)
    return form.list_query()


def _attachment(response: HttpResponse | StreamingHttpResponse, filename: str) -> Any:
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_GET
@dashboard_view
def runs_export_csv(request: HtmxHttpRequest) -> HttpResponse | StreamingHttpResponse:
    query = _export_query(request)
    if isinstance(query, HttpResponse):
        return query
    rows = search.run_export_rows(request.user, query)
    writer = csv.writer(_Echo())

    def lines() -> Iterator[str]:
        yield writer.writerow(EXPORT_COLUMNS)
        for run in rows:
            record = _run_record(run)
            yield writer.writerow(
                [
                    _csv_cell(
                        json.dumps(record[c], default=str)
                        if c in ("input", "output", "error", "metadata") and record[c] is not None
                        else record[c]
                    )
                    for c in EXPORT_COLUMNS
                ]
            )

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    return _attachment(response, "runsite-runs.csv")


@require_GET
@dashboard_view
def runs_export_json(request: HtmxHttpRequest) -> HttpResponse | StreamingHttpResponse:
    query = _export_query(request)
    if isinstance(query, HttpResponse):
        return query
    rows = search.run_export_rows(request.user, query)

    def chunks() -> Iterator[str]:
        # A JSON array written one run at a time: valid JSON at the end, nothing held whole.
        yield "["
        for i, run in enumerate(rows):
            yield ("," if i else "") + "\n" + json.dumps(_run_record(run), default=str)
        yield "\n]\n"

    response = StreamingHttpResponse(chunks(), content_type="application/json")
    return _attachment(response, "runsite-runs.json")


@require_GET
@dashboard_view
def run_history_json(request: HtmxHttpRequest, run_id: UUID) -> StreamingHttpResponse:
    try:
        history = search.run_history(request.user, run_id)
    except NotFound:
        raise Http404("Run not found (it may have been rolled back)") from None
    run = history.run

    def section(name: str, records: Iterator[dict[str, Any]]) -> Iterator[str]:
        yield f',\n"{name}": ['
        for i, record in enumerate(records):
            yield ("," if i else "") + "\n" + json.dumps(record, default=str)
        yield "\n]"

    def chunks() -> Iterator[str]:
        yield '{"run": ' + json.dumps(
            {**_run_record(run), "kwargs": run.kwargs, "last_seq": run.last_seq}, default=str
        )
        yield from section(
            "tool_calls",
            (
                {
                    "tool_call_id": tc.tool_call_id,
                    "step": tc.step,
                    "tool_name": tc.tool_name,
                    "status": tc.status,
                    "args": tc.args,
                    "original_args": tc.original_args,
                    "requires_approval": tc.requires_approval,
                    "suspend_payload": tc.suspend_payload,
                    "resume_schema": tc.resume_schema,
                    "resume_data": tc.resume_data,
                    "result": tc.result,
                    "child_run_id": str(tc.child_run_id) if tc.child_run_id else None,
                    "decided_by": tc.decided_by,
                    "decided_at": _iso(tc.decided_at),
                    "decision_reason": tc.decision_reason,
                    "created_at": _iso(tc.created_at),
                    "started_at": _iso(tc.started_at),
                    "finished_at": _iso(tc.finished_at),
                }
                for tc in history.tool_calls
            ),
        )
        yield from section(
            "checkpoints",
            (
                {
                    "id": str(cp.id),
                    "step": cp.step,
                    "parent_id": str(cp.parent_id) if cp.parent_id else None,
                    "values": cp.values,
                    "pending": cp.pending,
                    "created_at": _iso(cp.created_at),
                }
                for cp in history.checkpoints
            ),
        )
        yield from section(
            "events",
            (
                {
                    "seq": ev.seq,
                    "kind": ev.kind,
                    "data": ev.data,
                    "actor": ev.actor,
                    "created_at": _iso(ev.created_at),
                }
                for ev in history.events
            ),
        )
        yield "\n}\n"

    response = StreamingHttpResponse(chunks(), content_type="application/json")
    return _attachment(response, f"run-{run.id}.json")


# --- saved views ----------------------------------------------------------------------------


def _counted(request: HtmxHttpRequest, views: list[SavedView]) -> list[dict[str, Any]]:
    """Each view with its live count: one COUNT per view (a search's count is capped)."""
    out = []
    for view in views:
        form = RunFilterForm(QueryDict(view.query))
        total, capped = search.runs_list(request.user, form.list_query()).count()
        out.append({"view": view, "total": total, "capped": capped})
    return out


@require_GET
@dashboard_view
def saved_views(request: HtmxHttpRequest) -> HttpResponse:
    return _views_page(request)


def _views_page(request: HtmxHttpRequest, status: int = 200) -> HttpResponse:
    views = search.saved_views_for(request.user)
    context = {
        "views": _counted(request, views),
        "max_views": MAX_VIEWS,
        "nav": "views",
        "oob": False,
    }
    return render(request, "runs/saved_views.html", context, status=status)


@require_GET
@dashboard_view
def saved_views_menu(request: HtmxHttpRequest) -> HttpResponse:
    """The navigation's list of views, loaded when the menu opens."""
    views = search.saved_views_for(request.user, limit=NAV_VIEWS + 1)
    context = {
        "views": _counted(request, views[:NAV_VIEWS]),
        "more": len(views) > NAV_VIEWS,
    }
    return render(request, "runs/_fragments/saved_views_menu.html", context)


def _refused(request: HtmxHttpRequest, text: str, exc: RunsError) -> HttpResponse:
    """The views page with what went wrong, under the status the error calls for."""
    messages.error(request, f"{text}: {exc.detail}")
    return _views_page(request, status=exc.status_code)


@require_POST
@dashboard_view
def saved_view_create(request: HtmxHttpRequest) -> HttpResponse:
    form = SavedViewForm(request.POST, user=request.user)
    if not form.is_valid():
        problems = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())
        return _refused(request, "The view was not saved", ValidationFailed(problems))
    try:
        view = services.saved_view_create(
            owner=request.user,
            name=form.cleaned_data["name"],
            query=form.cleaned_data["query"],
            shared_with_group=form.cleaned_data["shared_with_group"],
        )
    except RunsError as exc:
        return _refused(request, "The view was not saved", exc)
    messages.success(request, f"Saved view “{view.name}”.")
    return redirect(f"{reverse('runs:run_list')}?{view.query}")


@require_POST
@dashboard_view
def saved_view_rename(request: HtmxHttpRequest, view_id: int) -> HttpResponse:
    try:
        view = services.saved_view_rename(
            view_id=view_id, actor=request.user, name=request.POST.get("name", "")
        )
    except RunsError as exc:
        return _refused(request, "Not renamed", exc)
    messages.success(request, f"Renamed to “{view.name}”.")
    return redirect("runs:saved_views")


@require_POST
@dashboard_view
def saved_view_delete(request: HtmxHttpRequest, view_id: int) -> HttpResponse:
    try:
        name = services.saved_view_delete(view_id=view_id, actor=request.user)
    except RunsError as exc:
        return _refused(request, "Not deleted", exc)
    messages.success(request, f"Deleted view “{name}”.")
    return redirect("runs:saved_views")
