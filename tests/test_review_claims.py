"""Claims on waiting tool calls: services, the dashboard (inbox filter, claim/release, take-over
confirmation) and the review API (claim/release, `force` on decisions)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import services
from runs.exceptions import ClaimedByOther, Conflict, ValidationFailed
from runs.models import AuditEntry, Run, RunEvent, RunStatus, ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
REFUND = {"order_id": "A-1", "amount": 25.0}


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def suspended(drain: Any, order_id: str = "A-1") -> Run:
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={**REFUND, "order_id": order_id},
        actor="test",
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def waiting_call(run: Run) -> ToolCall:
    return run.tool_calls.get(status=ToolCallStatus.AWAITING_APPROVAL)


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def refund(drain: Any) -> Run:
    return suspended(drain)


# --- services ---------------------------------------------------------------------------------


def test_it_claims_a_waiting_call_for_fifteen_minutes_by_default(refund, reviewer) -> None:
    seq = refund.last_seq
    tc = services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    tc.refresh_from_db()
    assert tc.claimed_by == "rita"
    left = tc.claimed_until - timezone.now()
    assert timedelta(minutes=14) < left <= timedelta(minutes=15)
    refund.refresh_from_db()
    assert refund.last_seq == seq + 1  # the claim is on the timeline: live pages re-render
    assert RunEvent.objects.get(run=refund, seq=seq + 1).kind == "claimed"
    assert AuditEntry.objects.filter(action="claim", actor="rita", run_id=refund.id).exists()


def test_it_refuses_a_claim_on_a_call_someone_else_holds(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    with pytest.raises(ClaimedByOther) as caught:
        services.tool_call_claim(actor=reviewer2, tool_call=waiting_call(refund))

    assert caught.value.claimed_by == "rita"
    assert "rita" in caught.value.detail
    assert waiting_call(refund).claimed_by == "rita"


def test_it_renews_ones_own_claim(refund, reviewer) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund), minutes=1)
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund), minutes=30)

    left = waiting_call(refund).claimed_until - timezone.now()
    assert left > timedelta(minutes=29)


def test_it_lets_anyone_claim_once_a_claim_ran_out(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))
    ToolCall.objects.filter(run=refund).update(claimed_until=timezone.now() - timedelta(seconds=1))

    services.tool_call_claim(actor=reviewer2, tool_call=waiting_call(refund))

    assert waiting_call(refund).claimed_by == "rob"


def test_it_assigns_a_call_to_another_reviewer(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund), assignee="rob")

    assert waiting_call(refund).claimed_by == "rob"
    entry = AuditEntry.objects.get(action="assign")
    assert (entry.actor, entry.after["claimed_by"]) == ("rita", "rob")
    assert RunEvent.objects.filter(run=refund, kind="assigned").exists()


@pytest.mark.parametrize("assignee", ["sam", "nora", "ghost"])
def test_it_refuses_to_assign_to_someone_who_cannot_review(
    refund, reviewer, support, nobody, assignee
) -> None:
    with pytest.raises(ValidationFailed) as caught:
        services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund), assignee=assignee)

    assert caught.value.errors[0]["field"] == "assignee"
    assert waiting_call(refund).claimed_by == ""


@pytest.mark.parametrize("minutes", [0, -5, 481, "15", 1.5, True])
def test_it_refuses_claim_minutes_outside_one_to_480(refund, reviewer, minutes) -> None:
    with pytest.raises(ValidationFailed) as caught:
        services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund), minutes=minutes)

    assert caught.value.errors[0]["field"] == "minutes"
    assert waiting_call(refund).claimed_by == ""


def test_it_releases_ones_claim_and_refuses_to_release_anothers(
    refund, reviewer, reviewer2
) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    with pytest.raises(ClaimedByOther):
        services.tool_call_release(actor=reviewer2, tool_call=waiting_call(refund))
    assert waiting_call(refund).claimed_by == "rita"

    services.tool_call_release(actor=reviewer, tool_call=waiting_call(refund))
    assert waiting_call(refund).claimed_by == ""
    assert RunEvent.objects.filter(run=refund, kind="released").exists()
    # Idempotent: nothing held, nothing to do, no new event.
    seq = Run.objects.get(id=refund.id).last_seq
    services.tool_call_release(actor=reviewer, tool_call=waiting_call(refund))
    assert Run.objects.get(id=refund.id).last_seq == seq


def test_it_refuses_to_claim_a_call_that_was_decided(refund, reviewer) -> None:
    tc = waiting_call(refund)
    services.tool_call_approve(run=refund, actor=reviewer)

    with pytest.raises(Conflict) as caught:
        services.tool_call_claim(actor=reviewer, tool_call=tc)

    assert caught.value.code == "tool_call_not_waiting"


def test_it_refuses_a_decision_on_a_call_another_reviewer_holds(
    refund, reviewer, reviewer2
) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    with pytest.raises(ClaimedByOther):
        services.tool_call_approve(run=refund, actor=reviewer2)

    refund.refresh_from_db()
    assert refund.status == RunStatus.SUSPENDED
    assert waiting_call(refund).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_lets_a_reviewer_take_over_and_audits_it(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    services.tool_call_decline(run=refund, actor=reviewer2, reason="no", take_over=True)

    refund.refresh_from_db()
    assert refund.status == RunStatus.PENDING
    entry = AuditEntry.objects.get(action="take_over")
    assert (entry.actor, entry.before["claimed_by"]) == ("rob", "rita")


def test_it_lets_the_holder_decide_without_taking_over(refund, reviewer) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    services.tool_call_approve(run=refund, actor=reviewer)

    assert not AuditEntry.objects.filter(action="take_over").exists()
    refund.refresh_from_db()
    assert refund.status == RunStatus.PENDING


# --- dashboard --------------------------------------------------------------------------------


def test_it_claims_from_the_inbox_and_shows_the_holder_in_the_row(refund, reviewer) -> None:
    client = signed_in(reviewer)
    tc = waiting_call(refund)

    response = client.post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": tc.tool_call_id, "origin": "inbox"},
        headers=HX,
    )

    assert response.status_code == 200
    assert waiting_call(refund).claimed_by == "rita"
    html = response.content.decode()
    assert f'id="inbox-row-{refund.id}"' in html
    assert 'data-claimed-by="rita"' in html
    assert "rita is on it" in html


def test_it_claims_from_the_run_page_and_shows_the_holder_on_the_card(
    refund, reviewer, reviewer2
) -> None:
    tc = waiting_call(refund)

    response = signed_in(reviewer).post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": tc.tool_call_id},
        headers=HX,
    )

    assert response.status_code == 200
    assert f'id="tc-{tc.pk}"' in response.content.decode()
    page = signed_in(reviewer2).get(reverse("runs:run_detail", args=[refund.id]))
    assert page.status_code == 200
    assert "rita is on it" in page.content.decode()


def test_it_refuses_a_claim_from_a_non_reviewer(refund, support) -> None:
    response = signed_in(support).post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": waiting_call(refund).tool_call_id},
        headers=HX,
    )

    assert response.status_code == 403
    assert waiting_call(refund).claimed_by == ""


def test_it_answers_409_naming_the_holder_when_claiming_a_held_call(
    refund, reviewer, reviewer2
) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    response = signed_in(reviewer2).post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": waiting_call(refund).tool_call_id, "origin": "inbox"},
        headers=HX,
    )

    assert response.status_code == 409
    assert "rita" in response.content.decode()
    assert waiting_call(refund).claimed_by == "rita"


def test_it_assigns_and_releases_from_the_dashboard(refund, reviewer, reviewer2) -> None:
    client = signed_in(reviewer)
    tc_id = waiting_call(refund).tool_call_id

    bad = client.post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": tc_id, "assignee": "nobody-here", "origin": "inbox"},
        headers=HX,
    )
    assert bad.status_code == 422
    assert waiting_call(refund).claimed_by == ""

    assigned = client.post(
        reverse("runs:tool_call_claim", args=[refund.id]),
        {"tool_call_id": tc_id, "assignee": "rob", "origin": "inbox"},
        headers=HX,
    )
    assert assigned.status_code == 200
    assert waiting_call(refund).claimed_by == "rob"

    released = signed_in(reviewer2).post(
        reverse("runs:tool_call_release", args=[refund.id]),
        {"tool_call_id": tc_id, "origin": "inbox"},
        headers=HX,
    )
    assert released.status_code == 200
    assert waiting_call(refund).claimed_by == ""


def test_it_asks_for_confirmation_before_deciding_a_held_call(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))
    client = signed_in(reviewer2)
    url = reverse("runs:tool_call_decline", args=[refund.id])
    form = {"tool_call_id": waiting_call(refund).tool_call_id, "origin": "inbox", "reason": "no"}

    first = client.post(url, form, headers=HX)

    assert first.status_code == 409
    html = first.content.decode()
    assert "rita" in html and 'name="take_over" value="1"' in html
    assert 'name="reason" value="no"' in html  # the confirmation re-posts the same decision
    assert waiting_call(refund).status == ToolCallStatus.AWAITING_APPROVAL

    second = client.post(url, {**form, "take_over": "1"}, headers=HX)

    assert second.status_code == 200
    refund.refresh_from_db()
    assert refund.status == RunStatus.PENDING
    assert AuditEntry.objects.filter(action="take_over", actor="rob").exists()


def test_it_shows_a_take_over_page_without_javascript(refund, reviewer, reviewer2) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))

    response = signed_in(reviewer2).post(
        reverse("runs:tool_call_approve", args=[refund.id]),
        {"tool_call_id": waiting_call(refund).tool_call_id},
    )

    assert response.status_code == 409
    assert "Take over and decide" in response.content.decode()
    assert waiting_call(refund).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_filters_the_inbox_by_who_holds_an_item(drain, reviewer, reviewer2) -> None:
    mine, theirs, free = suspended(drain, "M-1"), suspended(drain, "T-1"), suspended(drain, "F-1")
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(mine))
    services.tool_call_claim(actor=reviewer2, tool_call=waiting_call(theirs))
    client = signed_in(reviewer)

    def listed(assigned: str) -> set[str]:
        response = client.get(reverse("runs:inbox"), {"assigned": assigned})
        assert response.status_code == 200
        html = response.content.decode()
        return {str(r.id) for r in (mine, theirs, free) if f"inbox-row-{r.id}" in html}

    assert listed("mine") == {str(mine.id)}
    assert listed("unassigned") == {str(free.id)}
    assert listed("all") == {str(mine.id), str(theirs.id), str(free.id)}
    # A claim that ran out is no claim: the item is unassigned again.
    ToolCall.objects.filter(run=theirs).update(claimed_until=timezone.now() - timedelta(minutes=1))
    assert listed("unassigned") == {str(free.id), str(theirs.id)}


# --- review API -------------------------------------------------------------------------------


@pytest.fixture
def http(settings: Any) -> Iterator[httpx.Client]:
    settings.RUNS_API_AUTH = False
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    transport = httpx.WSGITransport(app=get_wsgi_application())
    try:
        with httpx.Client(transport=transport, base_url="http://testserver/api") as client:
            yield client
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def test_it_claims_and_releases_over_the_api(http, refund, reviewer) -> None:
    claimed = http.post(
        "/agents/refund/claim-tool-call", json={"run_id": str(refund.id), "minutes": 5}
    )

    assert claimed.status_code == 200, claimed.text
    body = claimed.json()
    assert body["claimed_by"] == "api:anonymous"
    assert body["tool_call_id"] == waiting_call(refund).tool_call_id
    listing = http.get("/agents/refund/suspended-runs").json()
    assert listing["runs"][0]["tool_calls"][0]["claimed_by"] == "api:anonymous"
    assert listing["runs"][0]["tool_calls"][0]["review_deadline_at"] is not None

    released = http.post("/agents/refund/release-tool-call", json={"run_id": str(refund.id)})

    assert released.status_code == 200
    assert released.json()["claimed_by"] == ""
    assert waiting_call(refund).claimed_by == ""


def test_it_assigns_over_the_api_and_refuses_bad_input(http, refund, reviewer) -> None:
    url = "/agents/refund/claim-tool-call"
    run_id = str(refund.id)

    assert (
        http.post(url, json={"run_id": run_id, "minutes": 0}).json()["errors"][0]["field"]
        == "minutes"
    )
    bad = http.post(url, json={"run_id": run_id, "assignee": "ghost"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "assignee"
    assert http.post(url, json={"run_id": run_id, "tool_call_id": "nope"}).status_code == 404
    assert waiting_call(refund).claimed_by == ""

    ok = http.post(url, json={"run_id": run_id, "assignee": "rita"})
    assert ok.status_code == 200
    assert waiting_call(refund).claimed_by == "rita"


def test_it_requires_force_to_decide_a_call_someone_holds_over_the_api(
    http, refund, reviewer
) -> None:
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(refund))
    body = {"run_id": str(refund.id)}

    refused = http.post("/agents/refund/approve-tool-call", json=body)

    assert refused.status_code == 409
    assert refused.json()["code"] == "claimed_by_other"
    assert refused.json()["claimed_by"] == "rita"
    assert Run.objects.get(id=refund.id).status == RunStatus.SUSPENDED

    forced = http.post("/agents/refund/approve-tool-call", json={**body, "force": True})

    assert forced.status_code == 202
    assert Run.objects.get(id=refund.id).status == RunStatus.PENDING
    assert AuditEntry.objects.filter(action="take_over", actor="api:anonymous").exists()


def test_it_requires_force_on_resume_and_decline_too(http, drain, reviewer) -> None:
    first, second = suspended(drain, "R-1"), suspended(drain, "R-2")
    for run in (first, second):
        services.tool_call_claim(actor=reviewer, tool_call=waiting_call(run))

    declined = http.post("/agents/refund/decline-tool-call", json={"run_id": str(first.id)})
    resumed = http.post("/agents/refund/resume", json={"run_id": str(second.id), "approved": True})

    assert (declined.status_code, resumed.status_code) == (409, 409)
    forced = http.post(
        "/agents/refund/resume", json={"run_id": str(second.id), "approved": True, "force": True}
    )
    assert forced.status_code == 202


# --- the race -------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_gives_a_claim_race_exactly_one_winner(drain, reviewer, reviewer2) -> None:
    """Eight threads, each its own PostgreSQL connection, claim the same call at once."""
    run = suspended(drain)
    tc = waiting_call(run)
    users = [reviewer, reviewer2, *(User.objects.create_user(f"r{i}") for i in range(6))]
    for user in users[2:]:
        user.user_permissions.add(*reviewer.groups.get().permissions.all())
    barrier = threading.Barrier(len(users))
    outcomes: list[str] = []

    def claim(user: User) -> None:
        try:
            barrier.wait()
            services.tool_call_claim(actor=user.username, tool_call=tc)
            outcomes.append(f"won:{user.username}")
        except ClaimedByOther:
            outcomes.append("lost")
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    winners = [o for o in outcomes if o.startswith("won:")]
    assert len(outcomes) == len(users)
    assert len(winners) == 1
    assert waiting_call(run).claimed_by == winners[0].removeprefix("won:")
    assert AuditEntry.objects.filter(action="claim").count() == 1


# --- live: inbox sockets ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_claim_reaches_open_inboxes_and_mine_is_per_reviewer(drain, reviewer, reviewer2):
    from channels.db import database_sync_to_async

    from tests.test_live import connect, receive_until

    run = await database_sync_to_async(suspended)(drain, "LIVE-1")
    ritas_mine, ok1 = await connect("/ws/runs/?view=inbox&assigned=mine", reviewer)
    robs_mine, ok2 = await connect("/ws/runs/?view=inbox&assigned=mine", reviewer2)
    robs_all, ok3 = await connect("/ws/runs/?view=inbox", reviewer2)
    assert ok1 and ok2 and ok3
    try:
        tc = await database_sync_to_async(waiting_call)(run)
        await database_sync_to_async(services.tool_call_claim)(actor=reviewer, tool_call=tc)

        row = f'id="inbox-row-{run.id}"'
        ritas = await receive_until(ritas_mine, lambda t: row in t)
        assert 'data-claimed-by="rita"' in ritas  # inserted into Rita's "mine"
        robs = await receive_until(robs_all, lambda t: row in t)
        assert "rita is on it" in robs  # Rob's open inbox shows who has it
        # Rob's "mine" shares no render with Rita's: the row is not his, it is only dropped.
        robs_own = await receive_until(robs_mine, lambda t: f"inbox-row-{run.id}" in t)
        assert f'<div id="inbox-row-{run.id}" hx-swap-oob="delete"' in robs_own
        assert "data-claimed-by" not in robs_own
    finally:
        for socket in (ritas_mine, robs_mine, robs_all):
            await socket.disconnect()
