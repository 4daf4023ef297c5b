"""The HTMX dashboard through Django's test client: pages, actions, permissions, CSRF, queries."""

from __future__ import annotations

import csv
import io
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from runs import services
from runs.fragments import Fragments
from runs.models import AuditEntry, Run, RunStatus, Thread, ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
ROLES = ["reviewer", "support", "staff", "nobody"]


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The cast's passwords are hashed on creation; PBKDF2 would dominate this module's time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def as_role(request: pytest.FixtureRequest, role: str) -> Client:
    return signed_in(request.getfixturevalue(role))


@pytest.fixture
def thread() -> Thread:
    return services.thread_create(metadata={"resource_id": "acme"})


def suspended(drain: Any, agent_id: str, input: Any, thread: Thread | None = None) -> Run:
    run = services.run_create(
        agent_id=agent_id, thread_id=thread.id if thread else None, input=input, actor="test"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


@pytest.fixture
def refund(drain: Any, thread: Thread) -> Run:
    return suspended(drain, "refund", {"order_id": "A-1", "amount": 25.0}, thread)


@pytest.fixture
def weather(drain: Any) -> Run:
    return suspended(drain, "weather", {})


def waiting_call(run: Run) -> ToolCall:
    return run.tool_calls.get(
        status__in=[ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT]
    )


def run_url(run: Run, action: str = "") -> str:
    if action:
        return reverse(f"runs:{action}", args=[run.id])
    return reverse("runs:run_detail", args=[run.id])


# --- signing in -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url_name", ["runs:overview", "runs:inbox", "runs:run_list", "runs:audit_log", "runs:audit_csv"]
)
def test_it_sends_anonymous_visitors_to_the_login_page(client, url_name) -> None:
    response = client.get(reverse(url_name))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_it_sends_anonymous_visitors_of_a_run_to_the_login_page(client, refund) -> None:
    response = client.get(run_url(refund))
    assert response.status_code == 302
    response = client.post(run_url(refund, "tool_call_approve"), {"tool_call_id": "x"})
    assert response.status_code == 302
    refund.refresh_from_db()
    assert refund.status == RunStatus.SUSPENDED


def test_it_redirects_an_anonymous_htmx_request_with_hx_redirect(client) -> None:
    response = client.get(
        reverse("runs:inbox"), headers={**HX, "HX-Current-URL": "http://testserver/inbox/?x=1"}
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == "/accounts/login/?next=%2Finbox%2F%3Fx%3D1"


def test_the_login_page_signs_in_and_lands_on_the_overview(client, reviewer) -> None:
    response = client.get(reverse("login"))
    assert response.status_code == 200
    response = client.post(reverse("login"), {"username": "rita", "password": "rita"})
    assert response.status_code == 302
    assert response["Location"] == reverse("runs:overview")


# --- pages for every role -----------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_it_renders_every_page_for_every_signed_in_role(request, role, refund, weather) -> None:
    client = as_role(request, role)
    urls = [
        reverse("runs:overview"),
        reverse("runs:inbox"),
        reverse("runs:run_list"),
        reverse("runs:audit_log"),
        run_url(refund),
        run_url(weather),
        reverse("runs:thread_detail", args=[refund.thread_id]),
        reverse("runs:run_events", args=[refund.id]) + "?before=5",
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
    assert client.get(reverse("runs:audit_csv")).status_code == 200


@pytest.mark.parametrize(
    "role,sees", [("reviewer", True), ("support", False), ("staff", True), ("nobody", False)]
)
def test_it_shows_decision_buttons_only_to_reviewers(request, role, sees, refund, weather) -> None:
    client = as_role(request, role)
    inbox = client.get(reverse("runs:inbox")).content.decode()
    assert ('data-act="approve"' in inbox) is sees
    detail = client.get(run_url(refund)).content.decode()
    assert ('data-act="approve"' in detail) is sees
    assert ("Edit &amp; approve" in detail) is sees
    answer = client.get(run_url(weather)).content.decode()
    assert ("Send answer" in answer) is sees


@pytest.mark.parametrize(
    "role,sees", [("reviewer", False), ("support", True), ("staff", True), ("nobody", False)]
)
def test_it_shows_cancel_controls_only_to_support(request, role, sees, refund) -> None:
    client = as_role(request, role)
    detail = client.get(run_url(refund)).content.decode()
    assert ("Rollback…" in detail) is sees
    assert ("Cancel (interrupt)…" in detail) is sees
    runs = client.get(reverse("runs:run_list")).content.decode()
    assert ('id="bulk-form"' in runs) is sees
    assert ('name="run_ids"' in runs) is sees


@pytest.mark.parametrize(
    "role,sees", [("reviewer", False), ("support", False), ("staff", True), ("nobody", False)]
)
def test_it_links_the_admin_for_staff_only(request, role, sees) -> None:
    page = as_role(request, role).get(reverse("runs:overview")).content.decode()
    assert ('href="/admin/"' in page) is sees


def test_an_unknown_run_or_thread_is_404(reviewer) -> None:
    client = signed_in(reviewer)
    assert client.get("/runs/00000000-0000-0000-0000-000000000000/").status_code == 404
    assert client.get("/threads/00000000-0000-0000-0000-000000000000/").status_code == 404


# --- htmx: region re-fetches ----------------------------------------------------------------


def test_an_htmx_get_returns_the_pages_regions_out_of_band(reviewer, refund) -> None:
    client = signed_in(reviewer)
    expected = {
        reverse("runs:overview"): ['id="ov-counts"', 'id="ov-activity"', 'id="ov-chart"'],
        reverse("runs:inbox"): ['id="inbox-list"'],
        reverse("runs:run_list"): ['id="runs-list"'],
        run_url(refund): ['id="run-header"', 'id="run-tool-calls"', 'id="run-timeline"'],
        reverse("runs:thread_detail", args=[refund.thread_id]): ['id="thread-runs"'],
    }
    for url, ids in expected.items():
        response = client.get(url, headers=HX)
        assert response.status_code == 200
        body = response.content.decode()
        assert "<html" not in body
        for dom_id in ids:
            assert re.search(dom_id + r'[^>]*hx-swap-oob="true"', body), (url, dom_id)


def test_an_htmx_get_of_a_rolled_back_run_says_so(reviewer, support, refund) -> None:
    run_id = refund.id
    services.run_cancel(run=refund, action="rollback", actor=support)
    response = signed_in(reviewer).get(f"/runs/{run_id}/", headers=HX)
    assert response.status_code == 200
    assert "Run rolled back" in response.content.decode()


def test_the_timeline_loads_older_events(reviewer, refund) -> None:
    response = signed_in(reviewer).get(reverse("runs:run_events", args=[refund.id]) + "?before=4")
    assert response.status_code == 200
    body = response.content.decode()
    assert re.findall(r'data-seq="(\d+)"', body) == ["3", "2", "1"]


def test_a_timeline_row_fetches_its_data_when_opened(reviewer, refund) -> None:
    """Rows carry no data (a busy run's push would be mostly JSON nobody opened): opening one
    fetches it."""
    client = signed_in(reviewer)
    page = client.get(f"/runs/{refund.id}/").content.decode()
    timeline = page[page.index('id="run-timeline"') :]
    assert '<pre class="json"' not in timeline
    urls = re.findall(
        r'<details hx-get="(/runs/[^"]+/events/(\d+)/)" hx-trigger="toggle once"', timeline
    )
    assert len(urls) == refund.last_seq
    event = refund.events.filter(kind="tool_call").order_by("seq").last()
    url = reverse("runs:run_event_data", args=[refund.id, event.seq])
    fragment = client.get(url, headers=HX)
    assert fragment.status_code == 200
    body = fragment.content.decode()
    assert body.startswith('<pre class="json">') and "issue_refund" in body
    full = client.get(url)  # without JavaScript: a page around it
    assert full.status_code == 200 and f"Event #{event.seq} (tool_call)" in full.content.decode()
    for seq in (999, 10**20):  # past the run's events, past the column's range
        missing = client.get(reverse("runs:run_event_data", args=[refund.id, seq]), headers=HX)
        assert missing.status_code == 404
    assert Client().get(url).status_code == 302  # signed out: to the login page


# --- the permission matrix of every action --------------------------------------------------

REVIEW_STATUS = {"reviewer": 200, "support": 403, "staff": 200, "nobody": 403}
CANCEL_STATUS = {"reviewer": 403, "support": 200, "staff": 200, "nobody": 403}


@pytest.mark.parametrize("role", ROLES)
def test_approve_needs_the_review_permission(request, role, refund) -> None:
    tc = waiting_call(refund)
    response = as_role(request, role).post(
        run_url(refund, "tool_call_approve"), {"tool_call_id": tc.tool_call_id}, headers=HX
    )
    assert response.status_code == REVIEW_STATUS[role]
    tc.refresh_from_db()
    approved = tc.status == ToolCallStatus.APPROVED
    assert approved is (REVIEW_STATUS[role] == 200)


@pytest.mark.parametrize("role", ROLES)
def test_decline_needs_the_review_permission(request, role, refund) -> None:
    tc = waiting_call(refund)
    response = as_role(request, role).post(
        run_url(refund, "tool_call_decline"),
        {"tool_call_id": tc.tool_call_id, "reason": "no"},
        headers=HX,
    )
    assert response.status_code == REVIEW_STATUS[role]
    tc.refresh_from_db()
    assert (tc.status == ToolCallStatus.DECLINED) is (REVIEW_STATUS[role] == 200)


@pytest.mark.parametrize("role", ROLES)
def test_answer_needs_the_review_permission(request, role, weather) -> None:
    tc = waiting_call(weather)
    response = as_role(request, role).post(
        run_url(weather, "tool_call_answer"),
        {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_city": "Oslo"},
        headers=HX,
    )
    assert response.status_code == REVIEW_STATUS[role]
    tc.refresh_from_db()
    assert (tc.status == ToolCallStatus.ANSWERED) is (REVIEW_STATUS[role] == 200)


@pytest.mark.parametrize("role", ROLES)
def test_cancel_needs_the_cancel_permission(request, role, refund) -> None:
    response = as_role(request, role).post(
        run_url(refund, "run_cancel"), {"action": "interrupt"}, headers=HX
    )
    assert response.status_code == CANCEL_STATUS[role]
    refund.refresh_from_db()
    assert (refund.status == RunStatus.INTERRUPTED) is (CANCEL_STATUS[role] == 200)


@pytest.mark.parametrize("role", ROLES)
def test_bulk_cancel_needs_the_cancel_permission(request, role, refund) -> None:
    response = as_role(request, role).post(
        reverse("runs:runs_bulk_cancel"),
        {
            "action": "interrupt",
            "step": "confirm",
            "expected": 1,
            "run_ids": [str(refund.id)],
            "include_suspended": "on",  # the refund run waits for a human
        },
        headers=HX,
    )
    assert response.status_code == CANCEL_STATUS[role]
    refund.refresh_from_db()
    assert (refund.status == RunStatus.INTERRUPTED) is (CANCEL_STATUS[role] == 200)


def test_a_refused_action_says_why_in_a_flash(support, refund) -> None:
    response = signed_in(support).post(
        run_url(refund, "tool_call_approve"),
        {"tool_call_id": waiting_call(refund).tool_call_id},
        headers=HX,
    )
    assert response.status_code == 403
    assert 'id="flash" hx-swap-oob="true"' in response.content.decode()
    assert "not allowed to approve" in response.content.decode()


# --- CSRF -----------------------------------------------------------------------------------


def test_every_post_needs_the_csrf_token_htmx_sends(reviewer, refund) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)
    data = {"tool_call_id": waiting_call(refund).tool_call_id}
    url = run_url(refund, "tool_call_approve")
    assert client.post(url, data, headers=HX).status_code == 403
    refund.refresh_from_db()
    assert refund.status == RunStatus.SUSPENDED

    page = client.get(run_url(refund)).content.decode()
    token = re.search(r"hx-headers='\{\"x-csrftoken\": \"([^\"]+)\"\}'", page).group(1)
    response = client.post(url, data, headers={**HX, "X-CSRFToken": token})
    assert response.status_code == 200
    refund.refresh_from_db()
    assert refund.status == RunStatus.PENDING


@pytest.mark.parametrize(
    "action,data",
    [
        ("tool_call_decline", {"reason": "x"}),
        ("tool_call_answer", {"f_city": "x"}),
        ("run_cancel", {"action": "interrupt"}),
    ],
)
def test_other_actions_refuse_a_post_without_csrf_token(staff, refund, action, data) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    response = client.post(run_url(refund, action), {"tool_call_id": "x", **data}, headers=HX)
    assert response.status_code == 403
    bulk = client.post(reverse("runs:runs_bulk_cancel"), {"action": "interrupt"}, headers=HX)
    assert bulk.status_code == 403


# --- decisions ------------------------------------------------------------------------------


def test_approve_from_the_inbox_answers_with_the_decided_row(reviewer, refund, drain) -> None:
    tc = waiting_call(refund)
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"),
        {"tool_call_id": tc.tool_call_id, "origin": "inbox"},
        headers=HX,
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert f'id="inbox-row-{refund.id}"' in body
    assert f'data-watch="{refund.id}"' in body  # the row keeps following the run
    assert "Approved." in body
    refund.refresh_from_db()
    assert refund.status == RunStatus.PENDING
    entry = AuditEntry.objects.get(run_id=refund.id, action="approve")
    assert entry.actor == "rita"
    drain()
    refund.refresh_from_db()
    assert refund.status == RunStatus.SUCCESS


def test_approve_without_javascript_redirects_to_the_run(reviewer, refund) -> None:
    tc = waiting_call(refund)
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"), {"tool_call_id": tc.tool_call_id}
    )
    assert response.status_code == 302
    assert response["Location"] == run_url(refund)


def test_edit_and_approve_with_fields_keeps_the_original_arguments(reviewer, refund) -> None:
    tc = waiting_call(refund)
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"),
        {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_order_id": "A-1", "f_amount": "10"},
        headers=HX,
    )
    assert response.status_code == 200
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.APPROVED
    assert tc.args == {"order_id": "A-1", "amount": 10.0}
    assert tc.original_args == {"order_id": "A-1", "amount": 25.0}
    assert AuditEntry.objects.get(action="approve").after["args"]["amount"] == 10.0


def test_edit_and_approve_puts_schema_errors_next_to_the_field(reviewer, refund) -> None:
    tc = waiting_call(refund)
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"),
        {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_order_id": "A-1", "f_amount": "-5"},
        headers=HX,
    )
    assert response.status_code == 422
    body = response.content.decode()
    field = re.search(r'<div class="field has-error">(.*?)</div>', body, re.S).group(1)
    assert 'name="f_amount"' in field
    assert "-5" in field and "minimum" in field.lower()
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL


def test_edit_as_json_rejects_text_that_is_not_json(reviewer, refund) -> None:
    tc = waiting_call(refund)
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"),
        {"tool_call_id": tc.tool_call_id, "mode": "json", "json": "{not json"},
        headers=HX,
    )
    assert response.status_code == 422
    assert "Enter a valid JSON" in response.content.decode()
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"),
        {
            "tool_call_id": tc.tool_call_id,
            "mode": "json",
            "json": '{"order_id": "A-1", "amount": 3}',
        },
        headers=HX,
    )
    assert response.status_code == 200
    tc.refresh_from_db()
    assert tc.args == {"order_id": "A-1", "amount": 3}


def test_decline_needs_a_reason_and_records_it(reviewer, refund) -> None:
    tc = waiting_call(refund)
    client = signed_in(reviewer)
    url = run_url(refund, "tool_call_decline")
    response = client.post(url, {"tool_call_id": tc.tool_call_id, "reason": ""}, headers=HX)
    assert response.status_code == 422
    assert "This field is required." in response.content.decode()
    response = client.post(url, {"tool_call_id": tc.tool_call_id, "reason": "too much"}, headers=HX)
    assert response.status_code == 200
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.DECLINED
    assert tc.decision_reason == "too much"
    assert AuditEntry.objects.get(action="decline").reason == "too much"


def test_the_answer_form_rejects_a_missing_city_and_accepts_a_valid_one(
    reviewer, weather, drain
) -> None:
    tc = waiting_call(weather)
    client = signed_in(reviewer)
    page = client.get(run_url(weather)).content.decode()
    assert 'name="f_city"' in page  # a form generated from resume_schema
    url = run_url(weather, "tool_call_answer")
    response = client.post(
        url, {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_city": ""}, headers=HX
    )
    assert response.status_code == 422
    field = re.search(r'<div class="field has-error">(.*?)</div>', response.content.decode(), re.S)
    assert 'name="f_city"' in field.group(1)
    assert "This field is required." in field.group(1)
    response = client.post(
        url, {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_city": "Oslo"}, headers=HX
    )
    assert response.status_code == 200
    drain()
    weather.refresh_from_db()
    assert weather.status == RunStatus.SUCCESS
    assert weather.output["city"] == "Oslo"


def test_a_decision_made_meanwhile_is_shown_not_overwritten(reviewer, reviewer2, refund) -> None:
    tc = waiting_call(refund)
    signed_in(reviewer).post(
        run_url(refund, "tool_call_decline"), {"tool_call_id": tc.tool_call_id, "reason": "no"}
    )
    response = signed_in(reviewer2).post(
        run_url(refund, "tool_call_approve"), {"tool_call_id": tc.tool_call_id}, headers=HX
    )
    assert response.status_code == 409
    body = response.content.decode()
    assert "Already declined by rita." in body
    assert "Declined</strong> by <strong>rita" in body
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.DECLINED
    assert tc.decided_by == "rita"


def test_a_decision_on_a_tool_call_that_does_not_exist_is_404(reviewer, refund) -> None:
    response = signed_in(reviewer).post(
        run_url(refund, "tool_call_approve"), {"tool_call_id": "nope"}, headers=HX
    )
    assert response.status_code == 404


def test_deciding_a_supervisor_carries_down_to_its_sub_agent(reviewer, drain) -> None:
    run = suspended(drain, "support", {"order_id": "S-1", "amount": 5.0})
    tc = waiting_call(run)
    detail = signed_in(reviewer).get(run_url(run)).content.decode()
    assert "billing sub-agent run" in detail
    response = signed_in(reviewer).post(
        run_url(run, "tool_call_approve"), {"tool_call_id": tc.tool_call_id}, headers=HX
    )
    assert response.status_code == 200
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS


# --- cancel ---------------------------------------------------------------------------------


def test_interrupt_keeps_the_run(support, refund) -> None:
    response = signed_in(support).post(
        run_url(refund, "run_cancel"), {"action": "interrupt", "reason": "stuck"}, headers=HX
    )
    assert response.status_code == 200
    assert "Run interrupted." in response.content.decode()
    refund.refresh_from_db()
    assert refund.status == RunStatus.INTERRUPTED
    assert AuditEntry.objects.get(action="cancel_interrupt").reason == "stuck"


def test_rollback_deletes_the_run_and_goes_to_its_thread(support, refund) -> None:
    page = signed_in(support).get(run_url(refund)).content.decode()
    assert "Rollback deletes" in page and "checkpoints" in page
    response = signed_in(support).post(
        run_url(refund, "run_cancel"), {"action": "rollback"}, headers=HX
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("runs:thread_detail", args=[refund.thread_id])
    assert not Run.objects.filter(id=refund.id).exists()
    assert AuditEntry.objects.get(action="cancel_rollback").run_id == refund.id


def test_cancel_of_a_finished_run_conflicts(support, refund) -> None:
    services.run_cancel(run=refund, action="interrupt", actor=support)
    response = signed_in(support).post(
        run_url(refund, "run_cancel"), {"action": "rollback"}, headers=HX
    )
    assert response.status_code == 409
    assert "already interrupted" in response.content.decode()
    assert Run.objects.filter(id=refund.id).exists()


# --- bulk cancel ----------------------------------------------------------------------------


def pending_runs(n: int, agent_id: str = "echo") -> list[Run]:
    return [
        services.run_create(agent_id=agent_id, input={"n": i}, after_seconds=3600, actor="t")
        for i in range(n)
    ]


def test_bulk_cancel_previews_the_count_then_cancels(support) -> None:
    runs = pending_runs(3)
    client = signed_in(support)
    data = {"action": "rollback", "run_ids": [str(r.id) for r in runs]}
    preview = client.post(reverse("runs:runs_bulk_cancel"), {**data, "step": "preview"}, headers=HX)
    assert preview.status_code == 200
    body = preview.content.decode()
    assert "data-preview-count>3<" in body
    assert "Rollback deletes" in body
    assert 'name="confirm_text"' not in body  # 20 or fewer: no typed confirmation
    assert Run.objects.filter(id__in=[r.id for r in runs]).count() == 3
    done = client.post(
        reverse("runs:runs_bulk_cancel"), {**data, "step": "confirm", "expected": 3}, headers=HX
    )
    assert done.status_code == 200
    assert "Rolled back 3 runs." in done.content.decode()
    assert not Run.objects.filter(id__in=[r.id for r in runs]).exists()
    assert AuditEntry.objects.filter(action="cancel_rollback").count() == 3


def test_bulk_cancel_of_more_than_20_runs_needs_the_count_typed(support, drain) -> None:
    pending_runs(21)
    other = suspended(drain, "weather", {})
    client = signed_in(support)
    data = {"action": "interrupt", "all_matching": "on", "agent": "echo"}
    preview = client.post(reverse("runs:runs_bulk_cancel"), {**data, "step": "preview"}, headers=HX)
    assert preview.status_code == 200
    assert "Type <strong>21</strong> to confirm" in preview.content.decode()
    confirm = {**data, "step": "confirm", "expected": 21}
    wrong = client.post(
        reverse("runs:runs_bulk_cancel"), {**confirm, "confirm_text": "20"}, headers=HX
    )
    assert wrong.status_code == 422
    assert Run.objects.filter(status=RunStatus.INTERRUPTED).count() == 0
    done = client.post(
        reverse("runs:runs_bulk_cancel"), {**confirm, "confirm_text": "21"}, headers=HX
    )
    assert done.status_code == 200
    assert "Interrupted 21 runs." in done.content.decode()
    assert Run.objects.filter(agent_id="echo", status=RunStatus.INTERRUPTED).count() == 21
    other.refresh_from_db()
    assert other.status == RunStatus.SUSPENDED  # outside the filter


def test_bulk_cancel_asks_again_when_the_filter_matches_more_than_confirmed(support) -> None:
    pending_runs(2)
    response = signed_in(support).post(
        reverse("runs:runs_bulk_cancel"),
        {"action": "interrupt", "all_matching": "on", "step": "confirm", "expected": 1},
        headers=HX,
    )
    assert response.status_code == 409
    assert "matches more runs than you confirmed" in response.content.decode()
    assert Run.objects.filter(status=RunStatus.INTERRUPTED).count() == 0


def test_bulk_cancel_leaves_runs_waiting_for_a_human_out_unless_ticked(support, drain) -> None:
    waiting = [suspended(drain, "weather", {}) for _ in range(2)]
    queued = pending_runs(1)
    client = signed_in(support)
    data = {"action": "interrupt", "run_ids": [str(r.id) for r in [*waiting, *queued]]}
    preview = client.post(reverse("runs:runs_bulk_cancel"), {**data, "step": "preview"}, headers=HX)
    assert preview.status_code == 200
    body = preview.content.decode()
    assert "data-preview-count>1<" in body  # only the pending run
    assert "Also cancel the <strong>2</strong> runs waiting for a human" in body
    done = client.post(
        reverse("runs:runs_bulk_cancel"), {**data, "step": "confirm", "expected": 1}, headers=HX
    )
    assert done.status_code == 200
    assert Run.objects.get(id=queued[0].id).status == RunStatus.INTERRUPTED
    assert all(Run.objects.get(id=r.id).status == RunStatus.SUSPENDED for r in waiting)

    ticked = {**data, "include_suspended": "on"}
    preview = client.post(
        reverse("runs:runs_bulk_cancel"), {**ticked, "step": "preview"}, headers=HX
    )
    assert "data-preview-count>2<" in preview.content.decode()
    done = client.post(
        reverse("runs:runs_bulk_cancel"), {**ticked, "step": "confirm", "expected": 2}, headers=HX
    )
    assert done.status_code == 200
    assert all(Run.objects.get(id=r.id).status == RunStatus.INTERRUPTED for r in waiting)


def test_a_run_queued_behind_a_review_says_so(support, drain, thread) -> None:
    review = suspended(drain, "refund", {"order_id": "Q-1", "amount": 3}, thread)
    queued = services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")
    drain()
    client = signed_in(support)
    page = client.get(reverse("runs:run_detail", args=[queued.id]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "queued behind" in body
    assert reverse("runs:run_detail", args=[review.id]) in body
    listing = client.get(reverse("runs:run_list"))
    row = re.search(rf'<tr id="run-row-{queued.id}".*?</tr>', listing.content.decode(), re.S)
    assert row is not None and "behind" in row.group(0)
    assert str(review.id)[:8] in row.group(0)


def test_bulk_cancel_needs_a_selection(support) -> None:
    response = signed_in(support).post(
        reverse("runs:runs_bulk_cancel"), {"action": "interrupt", "step": "preview"}, headers=HX
    )
    assert response.status_code == 422
    assert "Select at least one run" in response.content.decode()


# --- lists and filters ----------------------------------------------------------------------


def test_the_inbox_filters_by_agent_tool_and_wait(reviewer, refund, weather) -> None:
    client = signed_in(reviewer)
    page = client.get(reverse("runs:inbox") + "?agent=weather").content.decode()
    assert f"inbox-row-{weather.id}" in page and f"inbox-row-{refund.id}" not in page
    page = client.get(reverse("runs:inbox") + "?tool=issue_refund").content.decode()
    assert f"inbox-row-{refund.id}" in page and f"inbox-row-{weather.id}" not in page
    page = client.get(reverse("runs:inbox") + "?waiting=60").content.decode()
    assert "0 waiting runs" in page
    page = client.get(
        reverse("runs:inbox") + f"?thread={refund.thread_id}&order=oldest"
    ).content.decode()
    assert f"inbox-row-{refund.id}" in page and f"inbox-row-{weather.id}" not in page


def test_the_socket_url_carries_the_filters_and_ignores_reserved_names(reviewer, refund) -> None:
    client = signed_in(reviewer)
    for url in ("/inbox/?view=x&at=1&page=2&agent=refund", "/runs/?view=x&page=3&status=suspended"):
        response = client.get(url)
        assert response.status_code == 200
        ws = re.search(r'ws-connect="([^"]+)"', response.content.decode()).group(1)
        assert "view=x" not in ws and "page=1" in ws
    assert "agent=refund" in client.get("/inbox/?agent=refund").content.decode()


def test_a_bad_filter_value_is_reported_and_ignored(reviewer, refund) -> None:
    response = signed_in(reviewer).get(reverse("runs:inbox") + "?thread=not-a-uuid")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Some filters were ignored" in body
    assert f"inbox-row-{refund.id}" in body


def test_the_runs_list_filters_by_status_and_stuck(support, refund) -> None:
    client = signed_in(support)
    page = client.get(
        reverse("runs:run_list") + "?status=suspended&status=pending"
    ).content.decode()
    assert f"run-row-{refund.id}" in page
    page = client.get(reverse("runs:run_list") + "?status=success").content.decode()
    assert f"run-row-{refund.id}" not in page
    old = pending_runs(1)[0]
    Run.objects.filter(id=old.id).update(not_before=None, created_at="2020-01-01T00:00:00Z")
    page = client.get(reverse("runs:run_list") + "?stuck=on").content.decode()
    assert f"run-row-{old.id}" in page and f"run-row-{refund.id}" not in page


def test_the_audit_log_filters_and_exports_csv_safely(reviewer, support, refund, drain) -> None:
    tc = waiting_call(refund)
    services.tool_call_decline(
        run=refund, actor=reviewer, tool_call_id=tc.tool_call_id, reason="=HYPERLINK(1)"
    )
    other = suspended(drain, "weather", {})
    services.run_cancel(run=other, action="interrupt", actor=support, reason="old")
    client = signed_in(support)
    page = client.get(reverse("runs:audit_log") + "?actor=rita").content.decode()
    assert "=HYPERLINK(1)" in page and "cancel_interrupt" not in page.split("<tbody>")[1]
    response = client.get(reverse("runs:audit_csv") + "?action=decline")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:3] == ["created_at", "actor", "action"]
    assert len(rows) == 2
    assert rows[1][1:3] == ["rita", "decline"]
    assert rows[1][8] == "'=HYPERLINK(1)"  # no formula in a spreadsheet


# --- untrusted data -------------------------------------------------------------------------


def test_tool_arguments_are_escaped_on_every_page_and_in_pushed_fragments(
    reviewer, drain, thread
) -> None:
    run = suspended(drain, "refund", {"order_id": XSS, "amount": 1.0}, thread)
    client = signed_in(reviewer)
    pages = [
        client.get(reverse("runs:inbox")).content.decode(),
        client.get(run_url(run)).content.decode(),
        client.get(reverse("runs:overview")).content.decode(),
        client.get(reverse("runs:run_list")).content.decode(),
        client.get(run_url(run), headers=HX).content.decode(),
    ]
    fragments = Fragments(reviewer)
    from runs import selectors

    pages.append(fragments.inbox_row(selectors.inbox_rows([run.id], user=reviewer)[0]))
    pages.append(fragments.run_regions(selectors.run_page(run.id, user=reviewer), timeline_after=0))
    for html in pages:
        assert "<script>alert" not in html
        assert "<img src=x" not in html
        assert "&lt;script&gt;alert(2)" in html or "&lt;img src=x" in html


# --- query counts ---------------------------------------------------------------------------


def count_queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_list_pages_do_not_query_per_row(staff, drain, django_assert_max_num_queries) -> None:
    client = signed_in(staff)
    t = services.thread_create(metadata={"resource_id": "r"})
    first = suspended(drain, "refund", {"order_id": "Q-0", "amount": 1.0}, t)
    services.tool_call_decline(run=first, actor=staff, reason="x")  # one audit entry
    suspended(drain, "refund", {"order_id": "Q-00", "amount": 1.0}, t)
    urls = [
        reverse("runs:overview"),
        reverse("runs:inbox"),
        reverse("runs:run_list"),
        reverse("runs:audit_log"),
        reverse("runs:thread_detail", args=[t.id]),
    ]
    few = {url: count_queries(client, url) for url in urls}
    for i in range(1, 6):
        run = suspended(drain, "refund", {"order_id": f"Q-{i}", "amount": 1.0}, None)
        services.tool_call_decline(run=run, actor=staff, reason="x")
        suspended(drain, "weather", {})
    drain()
    many = {url: count_queries(client, url) for url in urls}
    assert many == few
    for url in urls:
        with django_assert_max_num_queries(12):
            client.get(url)


def test_the_run_page_queries_do_not_grow_with_tool_calls(
    staff, drain, django_assert_max_num_queries
) -> None:
    client = signed_in(staff)
    # Past the page's limits (20 checkpoints, 50 tool calls) the page costs the same.
    short = services.run_create(agent_id="slow", input={"steps": 55, "delay_ms": 0}, actor="t")
    long = services.run_create(agent_id="slow", input={"steps": 70, "delay_ms": 0}, actor="t")
    drain()
    assert count_queries(client, run_url(short)) == count_queries(client, run_url(long))
    with django_assert_max_num_queries(16):
        client.get(run_url(long))


def test_json_is_escaped_folded_and_capped() -> None:
    from runs.templatetags.runs_ui import json_view

    html = str(json_view({"note": "<b>" + "x" * 300, "items": list(range(20))}))
    assert "<b>x" not in html and "&lt;b&gt;x" in html
    assert '<details class="fold"><summary class="s">' in html  # the long string is folded
    assert "[… 20 items]" in html  # so is a big nested list
    assert "[… 20 items]" not in str(json_view(list(range(20))))  # the value itself stays open
    huge = str(json_view({"blob": "<x>" * 60_000}))
    assert "truncated here" in huge and "<x>" not in huge
