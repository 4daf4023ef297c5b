"""Review deadlines: declared on an agent or a tool, stamped when a call suspends, shown in the
inbox, counted on the overview and in /metrics, and carried out by the reaper (services)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import services
from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls, tool
from runs.models import AuditEntry, Run, RunEvent, RunStatus, ToolCall, ToolCallStatus

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "A-1", "amount": 25.0}


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@tool(requires_approval=True)
def wire(ctx: Any, amount: int) -> dict[str, Any]:
    return {"sent": amount}


@tool(requires_approval=True, review_timeout_seconds=0)
def note(ctx: Any) -> str:
    return "noted"


@tool(requires_approval=True, review_timeout_seconds=5, on_review_timeout="cancel")
def urgent(ctx: Any) -> str:
    return "done"


def _script(name: str, args: dict[str, Any]) -> Callable[[Any], ToolCalls | FinalAnswer]:
    def decide(state: Any) -> ToolCalls | FinalAnswer:
        result = state.last_result(name)
        if result is None:
            return ToolCalls([ProposedCall(name, args)])
        return FinalAnswer(output={"declined": result.declined, "result": result.result})

    return decide


def _agent(agent_id: str, tool_name: str, args: dict[str, Any], **policy: Any) -> Agent:
    return Agent(
        id=agent_id,
        tools=[wire, note, urgent],
        model=ScriptedModel(_script(tool_name, args)),
        **policy,
    )


def suspended(drain: Any, agent_id: str = "refund", input: Any = None) -> Run:
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id=agent_id, thread_id=thread.id, input=input or REFUND, actor="test"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def waiting_call(run: Run) -> ToolCall:
    return run.tool_calls.get(status__in=[ToolCallStatus.AWAITING_APPROVAL])


def later(minutes: float) -> Any:
    return timezone.now() + timedelta(minutes=minutes)


# --- declaring and stamping -------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy",
    [
        {"on_review_timeout": "reject"},
        {"review_timeout_seconds": -1},
        {"review_timeout_seconds": True},
    ],
)
def test_it_refuses_a_bad_review_policy_when_the_agent_is_defined(policy) -> None:
    with pytest.raises(ValueError, match="review_timeout|on_review_timeout"):
        _agent("bad", "wire", {"amount": 1}, **policy)


def test_it_refuses_a_bad_review_policy_on_a_tool() -> None:
    with pytest.raises(ValueError, match="on_review_timeout"):
        tool(requires_approval=True, on_review_timeout="ignore")(lambda ctx: None)


def test_it_takes_the_tools_policy_over_the_agents() -> None:
    agent = _agent("p", "wire", {}, review_timeout_seconds=600, on_review_timeout="decline")

    assert agent.review_policy("wire").seconds == 600  # the agent's
    assert agent.review_policy("wire").action == "decline"
    assert agent.review_policy("note") is None  # 0 seconds: no deadline for this tool
    assert agent.review_policy("urgent").seconds == 5
    assert agent.review_policy("urgent").action == "cancel"


def test_it_stamps_the_deadline_when_a_call_suspends(drain) -> None:
    run = suspended(drain)

    tc = waiting_call(run)
    assert tc.review_deadline_at == tc.suspended_at + timedelta(minutes=30)
    assert tc.review_timeout_action == "decline"
    assert "30 minutes" in tc.review_timeout_reason


def test_it_stamps_no_deadline_for_an_agent_without_one(drain) -> None:
    run = suspended(drain, "weather", {})

    assert run.tool_calls.get(status=ToolCallStatus.AWAITING_INPUT).review_deadline_at is None


# --- the reaper -------------------------------------------------------------------------------


def test_it_declines_an_overdue_call_and_the_run_continues_with_the_decline(drain) -> None:
    run = suspended(drain)

    assert services.reviews_expire(now=later(29)) == {"declined": 0, "cancelled": 0, "marked": 0}
    counts = services.reviews_expire(now=later(31))

    assert counts["declined"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    tc = ToolCall.objects.get(id=waiting_call_id(run))
    assert (tc.status, tc.decided_by) == (ToolCallStatus.DECLINED, "system:deadline")
    entry = AuditEntry.objects.get(action="decline", run_id=run.id)
    assert entry.actor == "system:deadline"
    assert "30 minutes" in entry.reason
    assert RunEvent.objects.filter(run=run, kind="review_overdue").exists()
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["refunded"] is False
    assert "30 minutes" in run.output["reason"]


def waiting_call_id(run: Run) -> Any:
    return run.tool_calls.get(tool_name="issue_refund").id


def test_it_cancels_the_run_when_the_policy_says_cancel(drain, register_agent) -> None:
    register_agent(_agent("rush", "urgent", {}))
    run = suspended(drain, "rush", {})

    counts = services.reviews_expire(now=later(1))

    assert counts["cancelled"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    entry = AuditEntry.objects.get(action="cancel_interrupt", run_id=run.id)
    assert entry.actor == "system:deadline"


def test_it_only_marks_a_call_without_an_action_and_announces_it_once(
    drain, register_agent, django_capture_on_commit_callbacks
) -> None:
    register_agent(_agent("slowpay", "wire", {"amount": 3}, review_timeout_seconds=60))
    run = suspended(drain, "slowpay", {})
    heard: list[dict[str, Any]] = []

    def listener(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    services.review_deadline_passed.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            first = services.reviews_expire(now=later(2))
            second = services.reviews_expire(now=later(3))
    finally:
        services.review_deadline_passed.disconnect(listener)

    assert first["marked"] == 1
    assert second == {"declined": 0, "cancelled": 0, "marked": 0}
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert [h["outcome"] for h in heard] == ["marked"]
    assert heard[0]["run_id"] == run.id


def test_it_acts_once_when_two_reapers_run(drain) -> None:
    run = suspended(drain)

    counts = [services.reviews_expire(now=later(31)) for _ in range(2)]

    assert [c["declined"] for c in counts] == [1, 0]
    assert AuditEntry.objects.filter(action="decline", run_id=run.id).count() == 1


def test_it_leaves_a_call_a_human_decided_first(drain, reviewer) -> None:
    run = suspended(drain)
    services.tool_call_approve(run=run, actor=reviewer)

    counts = services.reviews_expire(now=later(31))

    assert counts["declined"] == 0
    assert ToolCall.objects.get(id=waiting_call_id(run)).decided_by == "rita"


def test_it_declines_a_claimed_call_too(drain, reviewer) -> None:
    run = suspended(drain)
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(run), minutes=480)

    services.reviews_expire(now=later(31))

    assert ToolCall.objects.get(id=waiting_call_id(run)).decided_by == "system:deadline"


# --- what people see ----------------------------------------------------------------------------


def test_it_shows_time_left_and_overdue_in_the_inbox(drain, reviewer) -> None:
    fresh, late = suspended(drain), suspended(drain, input={**REFUND, "order_id": "L-1"})
    ToolCall.objects.filter(run=late).update(
        review_deadline_at=timezone.now() - timedelta(minutes=3, seconds=10)
    )
    client = Client()
    client.force_login(reviewer)

    response = client.get(reverse("runs:inbox"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "29 min left" in html or "30 min left" in html
    assert "overdue by 3 min" in html
    assert 'class="deadline overdue"' in html
    only_overdue = client.get(reverse("runs:inbox"), {"overdue": "on"}).content.decode()
    assert f"inbox-row-{late.id}" in only_overdue
    assert f"inbox-row-{fresh.id}" not in only_overdue


def test_it_counts_overdue_reviews_on_the_overview_and_in_metrics(drain, reviewer) -> None:
    run = suspended(drain)
    suspended(drain, input={**REFUND, "order_id": "B-2"})
    ToolCall.objects.filter(run=run).update(review_deadline_at=timezone.now())
    services.tool_call_claim(actor=reviewer, tool_call=waiting_call(run))
    client = Client()
    client.force_login(reviewer)

    overview = client.get(reverse("runs:overview"))
    metrics = client.get("/metrics")

    assert overview.status_code == 200
    assert 'data-overdue-reviews="1"' in overview.content.decode()
    assert metrics.status_code == 200
    text = metrics.content.decode()
    assert "runsite_reviews_overdue 1.0" in text
    assert "runsite_reviews_claimed 1.0" in text


# --- LangGraph graphs (RUNS_GRAPHS) -----------------------------------------------------------


def _graph(register_agent: Any, **review: Any) -> Any:
    from runs.graphs.loader import load_graphs
    from tests.test_graphs import graphs_config

    config = graphs_config()
    config["graphs"] = {"approval": {"path": config["graphs"]["approval"], **review}}
    return register_agent(load_graphs(config)["approval"])


def test_it_refuses_a_bad_deadline_in_the_graphs_config(register_agent) -> None:
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="approval.*on_review_timeout"):
        _graph(register_agent, review_timeout_seconds=60, on_review_timeout="later")


@pytest.mark.django_db(transaction=True)
def test_a_graph_interrupt_gets_the_deadline_of_its_config_and_is_declined(
    register_agent, drain
) -> None:
    _graph(
        register_agent,
        review_timeout_seconds=60,
        on_review_timeout="decline",
        review_timeout_reason="too slow",
    )
    run = suspended(drain, "approval", {"amount": 42.5, "order_id": "ord-1"})
    tc = ToolCall.objects.get(run=run)
    assert tc.review_deadline_at == tc.suspended_at + timedelta(seconds=60)

    counts = services.reviews_expire(now=later(2))

    assert counts["declined"] == 1
    tc.refresh_from_db()
    assert (tc.status, tc.decided_by, tc.decision_reason) == (
        ToolCallStatus.DECLINED,
        "system:deadline",
        "too slow",
    )
    drain()
    run.refresh_from_db()
    # The graph received the decline as its interrupt's answer, as from a reviewer.
    assert run.status == RunStatus.SUCCESS
    assert run.output["status"] == "rejected"
    assert run.output["decision"]["approved"] is False


def test_a_rule_hears_an_overdue_review_once_by_e_mail(drain, settings) -> None:
    from django.contrib.auth.models import Group, User
    from django.core import mail

    from runs.engine.delivery import deliver_due
    from runs.models import Delivery, NotificationRule

    group = Group.objects.create(name="Refund leads")
    User.objects.create_user(username="lee", email="lee@example.com").groups.add(group)
    NotificationRule.objects.create(
        name="late refunds", agent_id="refund", events=["review_overdue"], email_group=group
    )
    run = suspended(drain)
    assert Delivery.objects.count() == 0  # the rule does not listen for "suspended"

    services.reviews_expire(now=later(31))
    services.reviews_expire(now=later(32))  # a second pass announces nothing more

    [delivery] = Delivery.objects.all()
    assert (delivery.event, delivery.run_id, delivery.channel) == (
        "review_overdue",
        run.id,
        "email",
    )
    deliver_due(owner="test")
    [message] = mail.outbox
    assert message.to == ["lee@example.com"]
    assert "review is overdue" in message.subject
    assert f"/runs/{run.id}/" in message.body
