"""The HTMX dashboard: overview, inbox, runs, run, thread, audit log, and their actions.

Each view parses input, calls one selector or service and renders. A plain GET renders the
page; an htmx GET (a region re-fetch after a websocket gap, or the 10 s poll while the socket
is down) renders the page's live regions as out-of-band fragments. Actions answer htmx with
the regions they changed plus a flash, and a browser without JavaScript with a redirect.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterator
from functools import wraps
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseForbidden,
    StreamingHttpResponse,
)
from django.shortcuts import redirect, render, resolve_url
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from runs import selectors, services
from runs.exceptions import (
    AlreadyDecided,
    ClaimedByOther,
    NotFound,
    RunsError,
    ValidationFailed,
)
from runs.forms import (
    PAGE_SIZE,
    AuditFilterForm,
    BulkCancelForm,
    BulkSelectionForm,
    CancelForm,
    DeclineForm,
    InboxChoiceForm,
    InboxFilterForm,
    RunFilterForm,
    SchemaForm,
)
from runs.fragments import (
    CallForms,
    Fragments,
    bound_forms,
    form_id,
    inbox_edit_form,
    inbox_forms,
    tool_schema,
)
from runs.models import RunStatus, ToolCall
from runs.permissions import can_cancel, can_review
from runs.selectors.search import run_id_jump, runs_list
from runs.templatetags.runs_ui import event_data
from runs.views.lists import ListPaginator, sort_links


class HtmxHttpRequest(HttpRequest):
    """What django-htmx's middleware makes of every request (`request.htmx`)."""

    htmx: HtmxDetails


View = Callable[..., HttpResponseBase]


def dashboard_view(view: View) -> View:
    """Login required; an htmx request from a signed-out browser is sent to the login page."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            if request.htmx:
                current = request.htmx.current_url_abs_path or reverse("runs:overview")
                login = resolve_url(settings.LOGIN_URL)
                return HttpResponseClientRedirect(f"{login}?{urlencode({'next': current})}")
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapped


def _denied(request: HtmxHttpRequest, what: str) -> HttpResponse:
    text = f"You are not allowed to {what}."
    if request.htmx:
        return HttpResponse(Fragments(request.user, request).flash(text, "error"), status=403)
    return HttpResponseForbidden(text)


def _live_url(path: str, request: HtmxHttpRequest | None = None, **params: Any) -> str:
    """The page's websocket URL: its filters (so the socket pushes the rows the page lists)
    and the time it was rendered (so the socket sends what changed since)."""
    merged: dict[str, Any] = dict(request.GET.lists()) if request is not None else {}
    merged.update(params)
    query = urlencode({k: v for k, v in merged.items() if v not in (None, "")}, doseq=True)
    return f"{path}?{query}" if query else path


# --------------------------------------------------------------------------------------------
# Overview
# --------------------------------------------------------------------------------------------


@require_GET
@dashboard_view
def overview(request: HtmxHttpRequest) -> HttpResponse:
    data = selectors.dashboard_overview(user=request.user)
    fragments = Fragments(request.user, request)
    if request.htmx:
        return HttpResponse(fragments.overview_regions(data))
    return render(
        request,
        "runs/overview.html",
        {
            "ov": data,
            "oob": False,
            "inbox_count": data.counts.get(RunStatus.SUSPENDED, 0),
            "live_url": _live_url("/ws/runs/", view="overview"),
            "nav": "overview",
        },
    )


# --------------------------------------------------------------------------------------------
# Inbox
# --------------------------------------------------------------------------------------------


@require_GET
@dashboard_view
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    form = InboxFilterForm(request.GET)
    runs = selectors.inbox(
        form.run_filters(viewer=request.user.get_username()),
        user=request.user,
        oldest_first=form.oldest_first,
    )
    page = Paginator(runs, PAGE_SIZE).get_page(form.page_number)
    context = {
        "form": form,
        "page": page,
        "total": page.paginator.count,
        "inbox_count": None,
        "filter_query": _filter_query(request, drop=("page",)),
        "nav": "inbox",
        "oob": bool(request.htmx),
    }
    if request.htmx:
        return _list_regions(request, "runs/_fragments/inbox_list.html", context)
    return render(
        request,
        "runs/inbox.html",
        {
            **context,
            "reviewer_names": selectors.reviews.reviewer_names(),
            "live_url": _live_url(
                "/ws/runs/", request, view="inbox", at=time.time(), page=page.number
            ),
        },
    )


def _list_regions(request: HtmxHttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """A list re-fetch: the list region, and the inbox count of the navigation."""
    fragments = Fragments(request.user, request)
    count = selectors.inbox(selectors.RunFilters(), user=request.user).count()
    return HttpResponse(fragments.render(template, **context) + fragments.nav_inbox_count(count))


def _filter_query(request: HtmxHttpRequest, drop: tuple[str, ...] = ()) -> str:
    query = request.GET.copy()
    for key in drop:
        query.pop(key, None)
    return query.urlencode()


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


@require_GET
@dashboard_view
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    query = form.list_query()
    if query.q and not request.htmx:
        # A run id, or the start of one that names a single run: straight to it.
        jump = run_id_jump(request.user, query.q)
        if jump is not None:
            return redirect("runs:run_detail", run_id=jump)
    listing = runs_list(request.user, query)
    paginator = ListPaginator(listing, PAGE_SIZE)
    page = paginator.get_page(form.page_number)
    page.object_list = listing.decorate(page.object_list)
    context = {
        "form": form,
        "page": page,
        "total": page.paginator.count,
        "total_capped": paginator.capped,
        "search_q": listing.query.q,
        "sort": listing.query.sort,
        "sort_links": sort_links(request, listing.query.sort),
        "filter_query": _filter_query(request, drop=("page",)),
        "filter_items": [
            (k, v) for k, values in request.GET.lists() for v in values if k != "page"
        ],
        "stuck_minutes": settings.RUNS_STUCK_MINUTES,
        "nav": "runs",
        "oob": bool(request.htmx),
    }
    if request.htmx:
        if "sort" in form.errors:
            # A fragment is never a list in another order than the one asked for.
            return HttpResponse(form.errors["sort"][0], status=400)
        return _list_regions(request, "runs/_fragments/runs_list.html", context)
    return render(
        request,
        "runs/run_list.html",
        {
            **context,
            "saved_view_groups": request.user.groups.order_by("name"),
            "live_url": _live_url(
                "/ws/runs/", request, view="runs", at=time.time(), page=page.number
            ),
        },
    )


@require_POST
@dashboard_view
def runs_bulk_cancel(request: HtmxHttpRequest) -> HttpResponse:
    if not can_cancel(request.user):
        return _denied(request, "cancel runs")
    form = BulkCancelForm(request.POST)
    filters_form = RunFilterForm(request.POST)
    context: dict[str, Any] = {"bulk": form, "filter_items": _filter_items(request.POST)}
    if not form.is_valid():
        return _bulk_panel(request, context, status=422)
    data = form.cleaned_data
    # "Every run matching" means what the list shows: its filters and its search.
    queryset = (
        runs_list(request.user, filters_form.list_query()).queryset.order_by()
        if data["all_matching"]
        else selectors.visible_runs(request.user)
    )
    run_ids = None if data["all_matching"] else data["run_ids"]
    preview = selectors.runs_cancel_preview(
        user=request.user,
        run_ids=run_ids,
        queryset=queryset if data["all_matching"] else None,
        include_suspended=data["include_suspended"],
    )
    context["preview"] = preview
    status = bulk_gate(form, preview["total"], context)
    if status is not None:
        return _bulk_panel(request, context, status=status)
    result = services.runs_cancel_many(
        action=data["action"],
        actor=request.user,
        run_ids=run_ids,
        queryset=queryset,
        reason=data["reason"] or "",
        include_suspended=data["include_suspended"],
    )
    context["result"] = result
    return bulk_done(request, "bulk_panel.html", context, _bulk_summary(data["action"], result))


def bulk_gate(form: BulkSelectionForm, total: int, context: dict[str, Any]) -> int | None:
    """The steps every bulk action goes through: a preview that counts, a typed confirmation
    for many runs, and a second look when the selection grew since. The status to show the
    panel with, or None when the action may go ahead."""
    data = form.cleaned_data
    context["needs_typed"] = form.needs_typed_confirmation(total)
    if data["step"] == "preview" or total == 0:
        return 200
    if not form.confirmation_ok():
        context["confirm_error"] = f"Type {data['expected']} to confirm."
        return 422
    if total > (data["expected"] or 0):
        # The filter matches more runs than the person confirmed: show the new count again.
        context["grew"] = True
        return 409
    return None


def bulk_done(
    request: HtmxHttpRequest, panel: str, context: dict[str, Any], summary: str
) -> HttpResponse:
    """A bulk action went through: the panel with its result and a flash, or (without
    JavaScript) back to the list with a message."""
    if not request.htmx:
        messages.success(request, summary)
        return redirect(f"{reverse('runs:run_list')}?{_filter_query_from(request.POST)}")
    fragments = Fragments(request.user, request)
    return HttpResponse(
        fragments.render(panel, **context, summary=summary) + fragments.flash(summary, "success")
    )


def _filter_items(data: Any) -> list[tuple[str, str]]:
    names = set(RunFilterForm.base_fields) - {"page"}
    return [(k, v) for k in data for v in data.getlist(k) if k in names]


def _filter_query_from(data: Any) -> str:
    return urlencode(_filter_items(data))


def _bulk_panel(
    request: HtmxHttpRequest, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    fragments = Fragments(request.user, request)
    if not request.htmx:
        # Without JavaScript the confirmation is a page of its own.
        return render(
            request,
            "runs/bulk_confirm.html",
            {**context, "oob": False, "nav": "runs"},
            status=status,
        )
    return HttpResponse(fragments.render("bulk_panel.html", **context), status=status)


def _bulk_summary(action: str, result: services.BulkCancelResult) -> str:
    rollback = action == "rollback"
    done = len(result.deleted) if rollback else len(result.interrupted)
    return f"{'Rolled back' if rollback else 'Interrupted'} {done} run{'s' if done != 1 else ''}."


# --------------------------------------------------------------------------------------------
# Run page
# --------------------------------------------------------------------------------------------


def _run_page(request: HtmxHttpRequest, run_id: UUID, **kwargs: Any) -> selectors.RunPage:
    try:
        return selectors.run_page(run_id, user=request.user, **kwargs)
    except NotFound:
        raise Http404("Run not found (it may have been rolled back)") from None


@require_GET
@dashboard_view
def run_detail(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    fragments = Fragments(request.user, request)
    if request.htmx:
        try:
            page = selectors.run_page(run_id, user=request.user)
        except NotFound:
            return HttpResponse(fragments.run_deleted(run_id, 2**31 - 1))
        return HttpResponse(fragments.run_regions(page))
    page = _run_page(request, run_id)
    return render(
        request,
        "runs/run_detail.html",
        {
            **fragments.run_context(page),
            "oob": False,
            "nav": "runs",
            "live_url": _live_url(
                f"/ws/runs/{run_id}/",
                seq=page.run.last_seq,
                step=page.checkpoints[0].step if page.checkpoints else None,
            ),
        },
    )


@require_GET
@dashboard_view
def run_events(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """Older timeline events ("load more"), appended below the ones shown."""
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        before = None
    page = _run_page(request, run_id, events_before=before)
    context = {"run": page.run, "events": page.events, "oob": False}
    if not request.htmx:
        # Without JavaScript "load older" is a link: a page of the older events.
        return render(request, "runs/run_events.html", {**context, "nav": "runs"})
    return render(request, "runs/_fragments/timeline.html#older", context)


@require_GET
@dashboard_view
def run_event_data(request: HtmxHttpRequest, run_id: UUID, seq: int) -> HttpResponse:
    """One timeline event's data, fetched when its row is opened: a busy run's page gains ten
    rows a second, and carrying every row's data (pretty JSON, mostly never opened) made each
    push several times bigger for the browser to parse and keep."""
    run = _get_run(request, run_id)
    try:
        event = selectors.run_event(run, seq)
    except NotFound:
        raise Http404(f"This run has no event {seq}") from None
    back = reverse("runs:run_detail", args=[run.id])
    return _json_value(request, f"Event #{seq} ({event.kind})", back, event_data(event))


def _json_value(request: HtmxHttpRequest, title: str, back: str, value: Any) -> HttpResponse:
    """A big JSON value a region offers on demand: the value (htmx) or a page around it."""
    if request.htmx:
        return render(request, "runs/json_value.html#value", {"value": value})
    context = {"title": title, "back": back, "value": value, "nav": "runs", "oob": False}
    return render(request, "runs/json_value.html", context)


@require_GET
@dashboard_view
def run_state(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """The run's current state (its latest checkpoint's values)."""
    run = _get_run(request, run_id)
    checkpoint = selectors.latest_checkpoint(run_id=run.id)
    value = checkpoint.values if checkpoint is not None else None
    return _json_value(request, "Current state", reverse("runs:run_detail", args=[run.id]), value)


@require_GET
@dashboard_view
def thread_values(request: HtmxHttpRequest, thread_id: UUID) -> HttpResponse:
    thread = _get_thread(request, thread_id)
    back = reverse("runs:thread_detail", args=[thread.id])
    return _json_value(request, "Current values", back, thread.values)


@require_GET
@dashboard_view
def thread_checkpoint_values(
    request: HtmxHttpRequest, thread_id: UUID, checkpoint_id: UUID
) -> HttpResponse:
    thread = _get_thread(request, thread_id)
    try:
        checkpoint = selectors.thread_checkpoint(thread, checkpoint_id)
    except NotFound:
        raise Http404("Checkpoint not found") from None
    back = reverse("runs:thread_detail", args=[thread.id])
    return _json_value(request, f"Checkpoint {checkpoint.id}", back, checkpoint.values)


def _get_thread(request: HtmxHttpRequest, thread_id: UUID) -> Any:
    try:
        return selectors.visible_thread(request.user, thread_id)
    except NotFound:
        raise Http404("Thread not found") from None


def _card_response(
    request: HtmxHttpRequest,
    run_id: UUID,
    *,
    status: int = 200,
    flash: tuple[str, str] | None = None,
    forms: dict[int, CallForms] | None = None,
    origin: str = "run",
) -> HttpResponse:
    """What a decision answers with: the run page's regions or the inbox row, plus a flash."""
    fragments = Fragments(request.user, request)
    try:
        page = selectors.run_page(run_id, user=request.user)
    except NotFound:
        body = fragments.run_deleted(run_id, 2**31 - 1)
        return HttpResponse(
            body + fragments.flash("This run no longer exists.", "error"), status=404
        )
    if origin == "inbox" and status < 400:
        run = selectors.inbox_rows([run_id], user=request.user)
        body = fragments.inbox_row(run[0], decided=True) if run else ""
    else:
        body = fragments.run_regions(page, forms=forms)
    if flash:
        body += fragments.flash(*flash)
    return HttpResponse(body, status=status)


def _decision_error(
    request: HtmxHttpRequest,
    run_id: UUID,
    exc: RunsError,
    origin: str,
) -> HttpResponse:
    if isinstance(exc, ClaimedByOther):
        from runs.views.reviews import take_over_confirm  # imports this module

        return take_over_confirm(request, run_id, exc, origin)
    already = _already_decided(request, run_id)
    text = already or exc.detail
    level = "warning" if already or isinstance(exc, AlreadyDecided) else "error"
    if not request.htmx:
        messages.error(request, text)
        return redirect("runs:run_detail", run_id=run_id)
    if origin == "inbox":
        # Re-render the row as it is now (decided by someone else, or gone).
        fragments = Fragments(request.user, request)
        rows = selectors.inbox_rows([run_id], user=request.user)
        body = fragments.inbox_row(rows[0]) if rows else fragments.row_delete(f"inbox-row-{run_id}")
        return HttpResponse(body + fragments.flash(text, level), status=exc.status_code)
    return _card_response(request, run_id, status=exc.status_code, flash=(text, level))


def _already_decided(request: HtmxHttpRequest, run_id: UUID) -> str:
    """ "Already declined by rita": what the person who lost a race to decide should read.

    The service may refuse for the run's state (it moved on once the call was decided); the
    call itself says who decided it.
    """
    try:
        tc = selectors.tool_call_get(
            run_id, request.POST.get("tool_call_id", ""), user=request.user
        )
    except NotFound:
        return ""
    if not tc.decided_by:
        return ""
    return f"Already {tc.decision} by {tc.decided_by}."


def _done(request: HtmxHttpRequest, run_id: UUID, text: str, origin: str) -> HttpResponse:
    if not request.htmx:
        messages.success(request, text)
        if origin == "inbox":
            return redirect("runs:inbox")
        return redirect("runs:run_detail", run_id=run_id)
    return _card_response(request, run_id, flash=(text, "success"), origin=origin)


def _tool_call(request: HtmxHttpRequest, run_id: UUID) -> ToolCall | None:
    try:
        return selectors.tool_call_get(
            run_id, request.POST.get("tool_call_id", ""), user=request.user
        )
    except NotFound:
        return None


def _missing(request: HtmxHttpRequest, run_id: UUID, origin: str) -> HttpResponse:
    exc = NotFound("This tool call no longer exists (the run may have been rolled back).")
    return _decision_error(request, run_id, exc, origin)


DecisionView = Callable[[HtmxHttpRequest, UUID, ToolCall, str], HttpResponse]


def decision_view(what: str) -> Callable[[DecisionView], View]:
    """A POST deciding one tool call: review permission, then the call named by the form's
    `tool_call_id`; the view gets it and where the decision came from (run page or inbox)."""

    def decorate(view: DecisionView) -> View:
        @require_POST
        @dashboard_view
        @wraps(view)
        def wrapped(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
            if not can_review(request.user):
                return _denied(request, what)
            origin = _origin(request)
            tc = _tool_call(request, run_id)
            if tc is None:
                return _missing(request, run_id, origin)
            return view(request, run_id, tc, origin)

        return wrapped

    return decorate


@decision_view("approve tool calls")
def tool_call_approve(
    request: HtmxHttpRequest, run_id: UUID, tc: ToolCall, origin: str
) -> HttpResponse:
    """Approve, or (when the edit form is posted, `mode` set) edit the arguments and approve;
    either with the reviewer's optional `comment`."""
    edit_form = None
    args = None
    comment = request.POST.get("comment", "")
    if request.POST.get("mode"):
        edit_form = SchemaForm(
            request.POST, schema=tool_schema(tc.run, tc), initial_value=tc.args, auto_id=form_id(tc)
        )
        if not edit_form.is_valid():
            return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, edit=edit_form))
        args = edit_form.data_value()
    try:
        services.tool_call_approve(
            run=tc.run,
            actor=request.user,
            tool_call_id=tc.tool_call_id,
            args=args,
            comment=comment,
            take_over=_take_over(request),
        )
    except ValidationFailed as exc:
        if edit_form is None or _names_field(exc, "comment"):
            return _decision_error(request, run_id, exc, origin)
        edit_form.add_service_errors(exc, "args")
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, edit=edit_form))
    except RunsError as exc:
        return _decision_error(request, run_id, exc, origin)
    text = "Approved with edited arguments." if args is not None else "Approved."
    return _done(request, run_id, text, origin)


def _names_field(exc: ValidationFailed, name: str) -> bool:
    return any(e.get("field") == name for e in exc.errors)


@decision_view("decline tool calls")
def tool_call_decline(
    request: HtmxHttpRequest, run_id: UUID, tc: ToolCall, origin: str
) -> HttpResponse:
    form = DeclineForm(request.POST, auto_id=form_id(tc))
    if not form.is_valid():
        if origin == "inbox":
            return _inline_error(request, run_id, "Give a reason for declining.", origin)
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, decline=form))
    try:
        services.tool_call_decline(
            run=tc.run,
            actor=request.user,
            tool_call_id=tc.tool_call_id,
            reason=form.cleaned_data["reason"],
            take_over=_take_over(request),
        )
    except RunsError as exc:
        return _decision_error(request, run_id, exc, origin)
    return _done(request, run_id, "Declined.", origin)


@decision_view("answer tool calls")
def tool_call_answer(
    request: HtmxHttpRequest, run_id: UUID, tc: ToolCall, origin: str
) -> HttpResponse:
    """Give a tool that asked for input its data (a form generated from its resume_schema);
    for a graph's Agent Inbox request, one of the choices it allows (`inbox`)."""
    if request.POST.get("inbox"):
        return _inbox_choice(request, run_id, tc, origin)
    form = SchemaForm(request.POST, schema=tc.resume_schema, auto_id=form_id(tc))
    if not form.is_valid():
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, answer=form))
    try:
        services.tool_call_answer(
            run=tc.run,
            actor=request.user,
            tool_call_id=tc.tool_call_id,
            resume_data=form.data_value(),
            take_over=_take_over(request),
        )
    except ValidationFailed as exc:
        form.add_service_errors(exc, "resume_data")
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, answer=form))
    except RunsError as exc:
        return _decision_error(request, run_id, exc, origin)
    return _done(request, run_id, "Answer sent; the run continues.", origin)


INBOX_DONE = {
    "accept": "Accepted.",
    "edit": "Sent with the edited arguments.",
    "respond": "Response sent; the run continues.",
    "ignore": "Ignored; the run continues.",
}


def _inbox_choice(
    request: HtmxHttpRequest, run_id: UUID, tc: ToolCall, origin: str
) -> HttpResponse:
    """Accept, edit, respond to or ignore a graph's Agent Inbox request."""
    form = InboxChoiceForm(request.POST, auto_id=form_id(tc) + "-ir")
    if not form.is_valid():
        if origin == "inbox" or "inbox" in form.errors:
            return _inline_error(request, run_id, "Write a response.", origin)
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, inbox_respond=form))
    choice = form.cleaned_data["inbox"]
    edit_form = None
    args = None
    inbox = inbox_forms(tc.run, tc)
    if choice == "edit" and inbox is not None and inbox.edit is not None:
        edit_form = inbox_edit_form(tc, inbox.request, request.POST)
        if not edit_form.is_valid():
            return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, inbox_edit=edit_form))
        args = edit_form.data_value()
    try:
        services.tool_call_inbox_decide(
            run=tc.run,
            actor=request.user,
            tool_call_id=tc.tool_call_id,
            choice=choice,
            args=args,
            text=form.cleaned_data["text"],
            take_over=_take_over(request),
        )
    except ValidationFailed as exc:
        if edit_form is None:
            return _decision_error(request, run_id, exc, origin)
        edit_form.add_service_errors(exc, "args")
        return _form_errors(request, run_id, tc, bound_forms(tc.run, tc, inbox_edit=edit_form))
    except RunsError as exc:
        return _decision_error(request, run_id, exc, origin)
    return _done(request, run_id, INBOX_DONE[choice], origin)


def _take_over(request: HtmxHttpRequest) -> bool:
    """The reviewer confirmed deciding a call another reviewer holds (runs/views/reviews.py)."""
    return request.POST.get("take_over") == "1"


def _origin(request: HtmxHttpRequest) -> str:
    return "inbox" if request.POST.get("origin") == "inbox" else "run"


def _get_run(request: HtmxHttpRequest, run_id: UUID) -> Any:
    try:
        return selectors.visible_run(request.user, run_id)
    except NotFound:
        raise Http404("Run not found (it may have been rolled back)") from None


def _form_errors(
    request: HtmxHttpRequest, run_id: UUID, tc: ToolCall, forms: CallForms
) -> HttpResponse:
    """422 with the tool call's card showing the submitted form and its errors."""
    fragments = Fragments(request.user, request)
    page = _run_page(request, run_id)
    if not request.htmx:
        context = fragments.run_context(page, {tc.pk: forms})
        return render(
            request, "runs/run_detail.html", {**context, "oob": False, "nav": "runs"}, status=422
        )
    current = next((c for c in page.tool_calls if c.pk == tc.pk), tc)
    body = fragments.tool_call_card(page, current, forms)
    return HttpResponse(
        body + fragments.flash("Check the highlighted fields.", "error"), status=422
    )


def _inline_error(request: HtmxHttpRequest, run_id: UUID, text: str, origin: str) -> HttpResponse:
    if not request.htmx:
        messages.error(request, text)
        if origin == "inbox":
            return redirect("runs:inbox")
        return redirect("runs:run_detail", run_id=run_id)
    return HttpResponse(Fragments(request.user, request).flash(text, "error"), status=422)


@require_POST
@dashboard_view
def run_cancel(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    """Cancel one run: interrupt (keep it) or rollback (delete it, thread state reverts)."""
    if not can_cancel(request.user):
        return _denied(request, "cancel runs")
    form = CancelForm(request.POST)
    if not form.is_valid():
        return _inline_error(request, run_id, "Choose interrupt or rollback.", "run")
    run = _get_run(request, run_id)
    action = form.cleaned_data["action"]
    try:
        result = services.run_cancel(
            run=run, action=action, actor=request.user, reason=form.cleaned_data["reason"]
        )
    except RunsError as exc:
        return _decision_error(request, run_id, exc, "run")
    if result is None:
        # Rolled back: the run page has nothing left to show; go to its thread (or the list).
        text = f"Run {run_id} was rolled back."
        messages.success(request, text)
        target = (
            reverse("runs:thread_detail", args=[run.thread_id])
            if run.thread_id and _thread_exists(request, run.thread_id)
            else reverse("runs:run_list")
        )
        if request.htmx:
            return HttpResponseClientRedirect(target)
        return redirect(target)
    text = (
        "Cancel requested: the run stops at its next step."
        if result.status == RunStatus.RUNNING
        else "Run interrupted."
    )
    return _done(request, run_id, text, "run")


def _thread_exists(request: HtmxHttpRequest, thread_id: UUID) -> bool:
    try:
        selectors.visible_thread(request.user, thread_id)
    except NotFound:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Thread page
# --------------------------------------------------------------------------------------------


@require_GET
@dashboard_view
def thread_detail(request: HtmxHttpRequest, thread_id: UUID) -> HttpResponse:
    try:
        page = selectors.thread_page(thread_id, user=request.user)
    except NotFound:
        raise Http404("Thread not found") from None
    fragments = Fragments(request.user, request)
    if request.htmx:
        return HttpResponse(fragments.thread_regions(page))
    return render(
        request,
        "runs/thread_detail.html",
        {
            "tp": page,
            "thread": page.thread,
            "oob": False,
            "nav": "runs",
            "live_url": f"/ws/threads/{thread_id}/",
        },
    )


# --------------------------------------------------------------------------------------------
# Audit log
# --------------------------------------------------------------------------------------------


@require_GET
@dashboard_view
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET)
    entries = selectors.audit_entries(form.audit_filters(), user=request.user)
    page = Paginator(entries, PAGE_SIZE).get_page(form.page_number)
    return render(
        request,
        "runs/audit_log.html",
        {
            "form": form,
            "page": page,
            "total": page.paginator.count,
            "filter_query": _filter_query(request, drop=("page",)),
            "nav": "audit",
            "oob": False,
        },
    )


CSV_COLUMNS = [
    "created_at",
    "actor",
    "action",
    "run_id",
    "thread_id",
    "agent_id",
    "resource_id",
    "tool_call_id",
    "reason",
    "before",
    "after",
]


def _csv_cell(value: Any) -> str:
    text = "" if value is None else value if isinstance(value, str) else str(value)
    # Spreadsheet formula injection: reasons and arguments are typed by people and agents.
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        text = "'" + text
    return text


class _Echo:
    def write(self, value: str) -> str:
        return value


@require_GET
@dashboard_view
def audit_csv(request: HtmxHttpRequest) -> StreamingHttpResponse:
    form = AuditFilterForm(request.GET)
    entries = selectors.audit_entries(form.audit_filters(), user=request.user)
    writer = csv.writer(_Echo())

    def rows() -> Iterator[str]:
        yield writer.writerow(CSV_COLUMNS)
        for entry in entries.iterator(chunk_size=2000):
            yield writer.writerow(
                [
                    _csv_cell(entry.created_at.isoformat()),
                    _csv_cell(entry.actor),
                    _csv_cell(entry.action),
                    _csv_cell(entry.run_id),
                    _csv_cell(entry.thread_id),
                    _csv_cell(entry.agent_id),
                    _csv_cell(entry.resource_id),
                    _csv_cell(entry.tool_call_id),
                    _csv_cell(entry.reason),
                    _csv_cell(
                        json.dumps(entry.before, default=str) if entry.before is not None else ""
                    ),
                    _csv_cell(
                        json.dumps(entry.after, default=str) if entry.after is not None else ""
                    ),
                ]
            )

    response = StreamingHttpResponse(rows(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="runsite-audit.csv"'
    return response
