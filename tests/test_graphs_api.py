"""The LangGraph surface for graphs: stream modes from the graph's own stream, static
breakpoints, time travel, command.update/goto and update_state with as_node (while the same
fields stay refused for Runsite agents)."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import GraphCheckpoint, Run, RunStatus, ToolCall, ToolCallStatus
from tests.test_api_langgraph import sse_events
from tests.test_graphs import graphs  # noqa: F401 - the `graphs` fixture
from tests.test_graphs_hitl import get, post

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("graphs")]


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


def new_thread() -> str:
    return post("/threads", {}).json()["thread_id"]


def create(thread_id: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(f"/threads/{thread_id}/runs", body)
    assert r.status_code == 200, r.json()
    return r.json()


def replay(thread_id: str, run_id: str, modes: str = "") -> list[tuple[str, Any, Any]]:
    from django.test import Client

    path = f"/api/threads/{thread_id}/runs/{run_id}/stream"
    if modes:
        path += f"?stream_mode={modes}"
    return sse_events(Client().get(path, HTTP_LAST_EVENT_ID="-1"))


def test_it_streams_the_graphs_values_updates_and_custom_data(drain: Any) -> None:
    tid = new_thread()
    run = create(
        tid, {"assistant_id": "ask", "input": {}, "stream_mode": ["values", "updates", "custom"]}
    )
    drain()
    events = replay(tid, run["run_id"], "values,updates,custom,debug")
    names = [e[0] for e in events]
    assert names[0] == "metadata" and names[-1] == "end"
    thread = get(f"/threads/{tid}").json()
    assert thread["metadata"]["graph_id"] == "ask"  # what the Agent Inbox searches by
    assert thread["status"] == "interrupted"
    assert ("custom", {"progress": "asking"}) in [e[:2] for e in events]
    updates = [e[1] for e in events if e[0] == "updates"]
    # The interrupt arrives once, from the run's suspension, with the value as the graph gave it.
    interrupt = updates[-1]["__interrupt__"]
    assert [i["value"] for i in interrupt] == [{"question": "What is your name?"}]
    assert events[-1][1]["status"] == "suspended"
    values = [e[1] for e in events if e[0] == "values"]
    assert values[0] == {}  # the input
    only_values = replay(tid, run["run_id"], "values")
    # Only values asked for: the interrupt is a values event, as LangGraph's server sends it.
    assert only_values[-2][1] == {"__interrupt__": interrupt}


def test_it_streams_messages_and_tasks_of_a_tool_calling_graph(drain: Any) -> None:
    tid = new_thread()
    modes = ["messages-tuple", "updates", "tasks", "checkpoints", "values"]
    run = create(
        tid,
        {
            "assistant_id": "tools",
            "input": {"messages": [("user", "refund")]},
            "stream_mode": modes,
        },
    )
    drain()
    tc = ToolCall.objects.get(run_id=run["run_id"])
    assert (tc.tool_name, tc.args) == ("issue_refund", {"order_id": "A-7", "amount": 12.5})
    r = post("/agents/tools/approve-tool-call", {"run_id": run["run_id"]})
    assert r.status_code == 202
    drain()
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.SUCCESS
    events = replay(tid, run["run_id"], ",".join(modes))
    names = {e[0] for e in events}
    assert {"messages", "updates", "tasks", "checkpoints", "values"} <= names
    messages = [e[1] for e in events if e[0] == "messages"]
    text = "".join(m[0]["content"] for m in messages if m[1]["langgraph_node"] == "agent")
    assert "The refund is done." in text.replace("  ", " ")
    final = get(f"/threads/{tid}/state").json()["values"]["messages"]
    assert [m["type"] for m in final] == ["human", "ai", "tool", "ai"]
    assert final[2]["content"] == "refunded 12.5 on A-7"


def test_a_declined_tool_call_is_not_executed(drain: Any) -> None:
    tid = new_thread()
    run = create(tid, {"assistant_id": "tools", "input": {"messages": [("user", "refund")]}})
    drain()
    post("/agents/tools/decline-tool-call", {"run_id": run["run_id"], "reason": "too much"})
    drain()
    final = get(f"/threads/{tid}/state").json()["values"]["messages"]
    assert [m["type"] for m in final] == ["human", "ai", "ai"]
    assert final[-1]["content"] == "Not refunded: too much"


def test_interrupt_before_stops_at_a_breakpoint_that_approval_passes(drain: Any) -> None:
    tid = new_thread()
    run = create(
        tid, {"assistant_id": "approval", "input": {"order_id": "b-1"}, "interrupt_before": ["ask"]}
    )
    drain()
    tc = ToolCall.objects.get(run_id=run["run_id"])
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.suspend_payload == {"type": "breakpoint", "next": ["ask"]}
    state = get(f"/threads/{tid}/state").json()
    assert state["next"] == ["ask"]
    assert state["interrupts"] == []
    post("/agents/approval/approve-tool-call", {"run_id": run["run_id"]})
    drain()
    # Past the breakpoint the node itself interrupts.
    waiting = ToolCall.objects.get(run_id=run["run_id"], status=ToolCallStatus.AWAITING_APPROVAL)
    assert waiting.tool_name == "issue_refund"
    create(tid, {"assistant_id": "approval", "command": {"resume": {"approved": True}}})
    drain()
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.SUCCESS


def test_interrupt_after_stops_after_the_node(drain: Any) -> None:
    tid = new_thread()
    run = create(tid, {"assistant_id": "approval", "input": {}, "interrupt_after": "prepare"})
    drain()
    assert get(f"/threads/{tid}/state").json()["values"] == {"status": "awaiting_approval"}
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.SUSPENDED


def test_a_run_from_an_older_checkpoint_branches_the_thread(drain: Any) -> None:
    tid = new_thread()
    create(tid, {"assistant_id": "slow", "input": {"steps": 3, "delay_ms": 1}})
    drain()
    history = get(f"/threads/{tid}/history?limit=100").json()
    at_one = next(h for h in history if h["values"].get("items") == [0])
    run = create(tid, {"assistant_id": "slow", "checkpoint_id": at_one["checkpoint_id"]})
    drain()
    state = get(f"/threads/{tid}/state").json()
    assert state["values"]["items"] == [0, 1, 2]
    first = (
        GraphCheckpoint.objects.filter(run_id=run["run_id"], checkpoint_ns="")
        .order_by("checkpoint_id")
        .first()
    )
    assert first.parent_checkpoint_id == at_one["checkpoint_id"]
    at = get(f"/threads/{tid}/state/{at_one['checkpoint_id']}").json()
    assert at["values"]["items"] == [0]


def test_command_goto_and_update_start_a_graph_where_asked(drain: Any) -> None:
    tid = new_thread()
    run = create(
        tid,
        {
            "assistant_id": "approval",
            "command": {"update": {"order_id": "jump"}, "goto": "ask"},
        },
    )
    drain()
    tc = ToolCall.objects.get(run_id=run["run_id"])
    assert tc.args["order_id"] == "jump"
    assert get(f"/threads/{tid}/state").json()["next"] == ["ask"]


def test_update_state_as_a_node(drain: Any) -> None:
    tid = new_thread()
    create(tid, {"assistant_id": "slow", "input": {"steps": 2, "delay_ms": 1}})
    drain()
    r = post(f"/threads/{tid}/state", {"values": {"items": [99]}, "as_node": "step"})
    assert r.status_code == 200, r.json()
    state = get(f"/threads/{tid}/state").json()
    assert state["checkpoint_id"] == r.json()["checkpoint_id"]
    assert state["values"]["items"] == [0, 1, 99]
    assert state["metadata"]["source"] == "update"
    r = post(f"/threads/{tid}/state", {"values": {"items": [5]}, "as_node": "nope"})
    assert r.status_code == 422


def test_the_same_fields_stay_refused_for_runsite_agents(db: Any) -> None:
    tid = new_thread()
    for body in (
        {"interrupt_before": ["tools"]},
        {"checkpoint_id": "1ef00000-0000-6000-8000-000000000001"},
        {"command": {"goto": "agent"}},
    ):
        r = post(f"/threads/{tid}/runs", {"assistant_id": "weather", "input": "x", **body})
        assert r.status_code == 422
        assert r.json()["code"] == "unsupported"
    r = post(f"/threads/{tid}/state", {"values": {}, "as_node": "agent"})
    assert r.status_code == 422
    assert r.json()["code"] == "unsupported"


def test_assistants_describe_the_graph() -> None:
    r = get("/assistants/approval/graph")
    assert r.status_code == 200
    assert {n["id"] for n in r.json()["nodes"]} >= {"__start__", "prepare", "ask", "__end__"}
    r = get("/assistants/slow/schemas")
    assert r.status_code == 200
    assert set(r.json()["input_schema"]["properties"]) >= {"steps", "delay_ms", "items"}


def test_declining_a_breakpoint_ends_the_run_where_it_stopped(drain: Any) -> None:
    tid = new_thread()
    run = create(tid, {"assistant_id": "approval", "input": {}, "interrupt_before": ["ask"]})
    drain()
    r = post("/agents/approval/decline-tool-call", {"run_id": run["run_id"], "reason": "stop"})
    assert r.status_code == 202
    drain()
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.SUCCESS
    state = get(f"/threads/{tid}/state").json()
    assert state["next"] == ["ask"]  # still paused there; a new run can continue it
    assert state["values"] == {"status": "awaiting_approval"}
