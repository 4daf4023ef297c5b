"""LangChain's human-in-the-loop formats over HTTP: the Agent Inbox's HumanInterrupt /
HumanResponse and the HITL middleware's action_requests / decisions, mark-as-resolved, the
thread metadata clients search by, and CORS for browser clients."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runs.contracts import assistant_uuid
from runs.models import AuditEntry, Run, RunStatus, ToolCall

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.fixture
def api() -> Client:
    return Client()


def post(api: Client, path: str, body: Any = None, **extra: Any) -> Any:
    return api.post(f"/api{path}", json.dumps(body), content_type="application/json", **extra)


def waiting_refund(api: Client, drain: Any, amount: float = 12.5) -> tuple[str, str]:
    tid = post(api, "/threads", {"metadata": {"team": "billing"}}).json()["thread_id"]
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "A-1", "amount": amount}},
    )
    drain()
    return tid, r.json()["run_id"]


def waiting_weather(api: Client, drain: Any) -> tuple[str, str]:
    tid = post(api, "/threads", {}).json()["thread_id"]
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "weather", "input": {}})
    drain()
    return tid, r.json()["run_id"]


def interrupt_value(api: Client, tid: str) -> dict[str, Any]:
    thread = api.get(f"/api/threads/{tid}").json()
    (interrupts,) = thread["interrupts"].values()
    return interrupts[0]["value"]


def resume(api: Client, tid: str, agent: str, value: Any) -> Any:
    return post(api, f"/threads/{tid}/runs", {"assistant_id": agent, "command": {"resume": value}})


# --- interrupt values ------------------------------------------------------------------------


def test_an_approval_wait_carries_the_middleware_shape(api: Client, drain: Any) -> None:
    tid, _ = waiting_refund(api, drain)
    value = interrupt_value(api, tid)
    args = {"order_id": "A-1", "amount": 12.5}
    assert value["type"] == "approval" and value["tool_name"] == "issue_refund"  # Runsite's own
    assert value["args"] == args
    description = "Refund an amount on an order. Needs a human's approval."
    assert value["action_requests"] == [
        {"name": "issue_refund", "args": args, "arguments": args, "description": description}
    ]
    assert value["review_configs"] == [
        {"action_name": "issue_refund", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    state = api.get(f"/api/threads/{tid}/state").json()
    assert state["interrupts"][0]["value"] == value


def test_an_input_wait_carries_a_human_interrupt(api: Client, drain: Any) -> None:
    tid, _ = waiting_weather(api, drain)
    value = interrupt_value(api, tid)
    assert value["type"] == "input" and value["resume_schema"]["required"] == ["city"]
    assert value["action_request"] == {"action": "ask_city", "args": {"message": "Which city?"}}
    assert value["config"] == {
        "allow_accept": False,
        "allow_edit": False,
        "allow_respond": True,
        "allow_ignore": True,
    }
    assert value["description"] == "Ask the user which city they mean."


# --- the Agent Inbox's HumanResponse list -----------------------------------------------------


def test_accept_approves(api: Client, drain: Any) -> None:
    tid, rid = waiting_refund(api, drain)
    r = resume(api, tid, "refund", [{"type": "accept", "args": None}])
    assert r.status_code == 200 and r.json()["run_id"] == rid
    drain()
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.SUCCESS and run.output["refunded"] is True
    entry = AuditEntry.objects.get(run_id=rid, action="approve")
    assert entry.actor.startswith("api:") and entry.after["via"] == "agent_inbox:accept"


def test_edit_approves_with_the_edited_arguments_read_as_their_types(
    api: Client, drain: Any
) -> None:
    tid, rid = waiting_refund(api, drain)
    edited = {"action": "issue_refund", "args": {"order_id": "A-1", "amount": "10"}}
    r = resume(api, tid, "refund", [{"type": "edit", "args": edited}])
    assert r.status_code == 200
    drain()
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.SUCCESS
    assert (run.output["refunded"], run.output["amount"]) == (True, 10)  # "10" read as a number
    assert (
        ToolCall.objects.get(run_id=rid, tool_name="issue_refund").original_args["amount"] == 12.5
    )


def test_response_declines_an_approval_with_that_reason(api: Client, drain: Any) -> None:
    tid, rid = waiting_refund(api, drain)
    r = resume(api, tid, "refund", [{"type": "response", "args": "Not eligible, sorry"}])
    assert r.status_code == 200
    drain()
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"refunded": False, "reason": "Not eligible, sorry"}


def test_response_answers_an_input_wait_filling_its_one_string_field(
    api: Client, drain: Any
) -> None:
    tid, rid = waiting_weather(api, drain)
    r = resume(api, tid, "weather", [{"type": "response", "args": "Lisbon"}])
    assert r.status_code == 200
    drain()
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.SUCCESS and "Lisbon" in json.dumps(run.output)


@pytest.mark.parametrize("agent", ["refund", "weather"])
def test_ignore_ends_the_run_interrupted_without_running_the_tool(
    api: Client, drain: Any, agent: str
) -> None:
    tid, rid = (waiting_refund if agent == "refund" else waiting_weather)(api, drain)
    r = resume(api, tid, agent, [{"type": "ignore", "args": None}])
    assert r.status_code == 200
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.INTERRUPTED
    assert run.cancel_reason == "ignored in review"
    assert (
        ToolCall.objects.filter(run_id=rid, status="succeeded", tool_name="issue_refund").count()
        == 0
    )
    entry = AuditEntry.objects.get(run_id=rid, action="cancel_interrupt")
    assert entry.reason == "ignored in review" and entry.after["via"] == "agent_inbox:ignore"


@pytest.mark.parametrize(
    ("agent", "value", "field"),
    [
        ("refund", [{"type": "accept"}, {"type": "accept"}], "resume"),
        ("weather", [{"type": "accept", "args": None}], "resume[0].type"),
        ("refund", [{"type": "edit", "args": {"action": "issue_refund"}}], "resume[0].args"),
        ("refund", [{"type": "response", "args": {"no": "text"}}], "resume[0].args"),
        ("refund", {"decisions": [{"type": "maybe"}]}, "resume[0].type"),
        ("refund", {"decisions": "approve"}, "resume.decisions"),
    ],
)
def test_wrong_shapes_answer_422_naming_what_was_expected(
    api: Client, drain: Any, agent: str, value: Any, field: str
) -> None:
    tid, rid = (waiting_refund if agent == "refund" else waiting_weather)(api, drain)
    r = resume(api, tid, agent, value)
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == field
    assert Run.objects.get(id=rid).status == RunStatus.SUSPENDED


# --- the HITL middleware's decisions ------------------------------------------------------------


def test_middleware_decisions_approve_edit_and_reject(api: Client, drain: Any) -> None:
    tid, rid = waiting_refund(api, drain)
    edited = {"name": "issue_refund", "args": {"order_id": "A-1", "amount": 3}}
    assert (
        resume(
            api, tid, "refund", {"decisions": [{"type": "edit", "edited_action": edited}]}
        ).status_code
        == 200
    )
    drain()
    assert Run.objects.get(id=rid).output["amount"] == 3

    tid, rid = waiting_refund(api, drain)
    r = resume(api, tid, "refund", {"decisions": [{"type": "reject", "message": "too late"}]})
    assert r.status_code == 200
    drain()
    assert Run.objects.get(id=rid).output == {"refunded": False, "reason": "too late"}
    assert (
        AuditEntry.objects.get(run_id=rid, action="decline").after["via"]
        == "hitl_middleware:reject"
    )

    tid, rid = waiting_refund(api, drain)
    assert resume(api, tid, "refund", {"decisions": [{"type": "approve"}]}).status_code == 200
    drain()
    assert Run.objects.get(id=rid).output["refunded"] is True


def test_middleware_respond_answers_an_input_wait(api: Client, drain: Any) -> None:
    tid, rid = waiting_weather(api, drain)
    r = resume(api, tid, "weather", {"decisions": [{"type": "respond", "message": "Oslo"}]})
    assert r.status_code == 200
    drain()
    assert "Oslo" in json.dumps(Run.objects.get(id=rid).output)


# --- mark as resolved ---------------------------------------------------------------------------


def test_mark_as_resolved_ends_the_waiting_run(api: Client, drain: Any) -> None:
    tid, rid = waiting_refund(api, drain)
    r = post(api, f"/threads/{tid}/state", {"values": None, "as_node": "__end__"})
    assert r.status_code == 200
    run = Run.objects.get(id=rid)
    assert run.status == RunStatus.INTERRUPTED
    assert run.cancel_reason == "marked as resolved in review"
    thread = api.get(f"/api/threads/{tid}").json()
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    assert AuditEntry.objects.filter(run_id=rid, action="cancel_interrupt").exists()


def test_other_as_node_uses_stay_refused(api: Client, drain: Any) -> None:
    tid, rid = waiting_refund(api, drain)
    r = post(api, f"/threads/{tid}/state", {"values": {"x": 1}, "as_node": "__end__"})
    assert r.status_code == 422 and r.json()["field"] == "as_node"
    r = post(api, f"/threads/{tid}/state", {"values": None, "as_node": "tools"})
    assert r.status_code == 422 and r.json()["field"] == "as_node"
    assert Run.objects.get(id=rid).status == RunStatus.SUSPENDED


# --- thread metadata ----------------------------------------------------------------------------


def test_a_run_stamps_graph_and_assistant_ids_without_overwriting(api: Client, drain: Any) -> None:
    tid, _ = waiting_refund(api, drain)
    mine = post(api, "/threads", {"metadata": {"graph_id": "my-own"}}).json()["thread_id"]
    post(api, f"/threads/{mine}/runs", {"assistant_id": "echo", "input": {}})
    meta = api.get(f"/api/threads/{tid}").json()["metadata"]
    assert meta == {
        "team": "billing",
        "graph_id": "refund",
        "assistant_id": assistant_uuid("refund"),
    }
    found = post(
        api, "/threads/search", {"status": "interrupted", "metadata": {"graph_id": "refund"}}
    )
    assert [t["thread_id"] for t in found.json()] == [tid]
    by_uuid = post(api, "/threads/search", {"metadata": {"assistant_id": assistant_uuid("refund")}})
    assert [t["thread_id"] for t in by_uuid.json()] == [tid]
    kept = api.get(f"/api/threads/{mine}").json()["metadata"]
    assert kept["graph_id"] == "my-own" and kept["assistant_id"] == assistant_uuid("echo")


# --- CORS ---------------------------------------------------------------------------------------


def test_cors_answers_allowed_origins_on_the_api_only(api: Client, settings: Any) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["http://localhost:3000"]
    pre = api.options(
        "/api/threads/search",
        HTTP_ORIGIN="http://localhost:3000",
        HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
        HTTP_ACCESS_CONTROL_REQUEST_HEADERS="content-type,x-api-key",
    )
    assert pre.status_code == 200
    assert pre["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-api-key" in pre["access-control-allow-headers"]
    r = post(api, "/threads", {}, HTTP_ORIGIN="http://localhost:3000")
    assert r["access-control-allow-origin"] == "http://localhost:3000"
    assert "access-control-allow-origin" not in post(
        api, "/threads", {}, HTTP_ORIGIN="http://evil.test"
    )
    page = api.get("/accounts/login/", HTTP_ORIGIN="http://localhost:3000")
    assert page.status_code == 200
    assert "access-control-allow-origin" not in page
