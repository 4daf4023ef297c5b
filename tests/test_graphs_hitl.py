"""Graph interrupts as suspended runs: the inbox, the review API, command.resume, cancel,
rollback and a lost worker (runs in-process with `drain`; the DB work of a graph run happens
on the checkpointer's thread, so these tests commit for real)."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from runs import services
from runs.engine.context import RunControl
from runs.engine.worker import execute_claimed, new_owner_id
from runs.models import (
    Checkpoint,
    GraphCheckpoint,
    GraphWrite,
    Run,
    RunStatus,
    Thread,
    ToolCall,
    ToolCallStatus,
)
from tests.test_graphs import graphs, start  # noqa: F401 - the `graphs` fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("graphs")]


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


def post(path: str, body: Any = None) -> Any:
    return Client().post(f"/api{path}", json.dumps(body or {}), content_type="application/json")


def get(path: str) -> Any:
    return Client().get(f"/api{path}")


def suspended(agent_id: str, input: Any, drain: Any) -> Run:
    run = start(agent_id, input)
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def test_an_interrupt_suspends_the_run_with_a_waiting_tool_call(drain: Any) -> None:
    run = suspended("approval", {"amount": 42.5, "order_id": "ord-1"}, drain)
    tc = ToolCall.objects.get(run=run)
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.tool_name == "issue_refund"
    assert tc.args == {"order_id": "ord-1", "amount": 42.5}
    assert tc.suspend_payload == {
        "tool": "issue_refund",
        "args": {"order_id": "ord-1", "amount": 42.5},
    }
    assert Thread.objects.get(id=run.thread_id).status == "interrupted"

    state = get(f"/threads/{run.thread_id}/state").json()
    assert state["next"] == ["ask"]
    assert state["interrupts"] == [{"id": tc.tool_call_id, "value": tc.suspend_payload}]
    assert state["tasks"][0]["interrupts"][0]["id"] == tc.tool_call_id

    r = get("/agents/approval/suspended-runs")
    assert r.status_code == 200
    listed = r.json()["runs"]
    assert [x["run_id"] for x in listed] == [str(run.id)]

    thread = get(f"/threads/{run.thread_id}").json()
    assert thread["status"] == "interrupted"
    assert thread["interrupts"][str(run.id)] == [
        {"id": tc.tool_call_id, "value": tc.suspend_payload}
    ]


def test_command_resume_continues_the_same_run(drain: Any) -> None:
    run = suspended("approval", {"order_id": "ord-2"}, drain)
    decision = {"approved": True, "by": "test"}
    r = post(
        f"/threads/{run.thread_id}/runs",
        {"assistant_id": "approval", "command": {"resume": decision}},
    )
    assert r.status_code == 200
    assert r.json()["run_id"] == str(run.id)
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["decision"] == decision
    assert run.output["status"] == "approved"
    state = get(f"/threads/{run.thread_id}/state").json()
    assert state["next"] == []
    assert state["values"]["decision"] == decision
    assert Thread.objects.get(id=run.thread_id).status == "idle"


def test_the_review_api_approves_and_declines(drain: Any) -> None:
    run = suspended("approval", {"order_id": "ord-3"}, drain)
    r = post("/agents/approval/approve-tool-call", {"run_id": str(run.id)})
    assert r.status_code == 202
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["decision"] == {"approved": True}

    other = suspended("approval", {"order_id": "ord-4"}, drain)
    r = post("/agents/approval/decline-tool-call", {"run_id": str(other.id), "reason": "no"})
    assert r.status_code == 202
    drain()
    other.refresh_from_db()
    assert other.status == RunStatus.SUCCESS
    assert other.output["decision"] == {"approved": False, "reason": "no"}
    assert other.output["status"] == "rejected"


def test_an_input_interrupt_is_answered_with_data(drain: Any) -> None:
    run = suspended("ask", {}, drain)
    tc = ToolCall.objects.get(run=run)
    assert tc.status == ToolCallStatus.AWAITING_INPUT
    assert tc.tool_name == "ask_name"
    assert tc.suspend_payload == {"question": "What is your name?"}
    r = post("/agents/ask/resume", {"run_id": str(run.id), "resume_data": {"name": "Ada"}})
    assert r.status_code == 202
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["greeting"] == "Hello, Ada!"


def test_several_interrupts_are_resumed_with_a_map(drain: Any) -> None:
    run = suspended("parallel", {"answers": []}, drain)
    calls = {tc.suspend_payload: tc.tool_call_id for tc in ToolCall.objects.filter(run=run)}
    assert set(calls) == {"left?", "right?"}
    r = post(
        f"/threads/{run.thread_id}/runs",
        {"assistant_id": "parallel", "command": {"resume": "both"}},
    )
    assert r.status_code == 409  # which one?
    r = post(
        f"/threads/{run.thread_id}/runs",
        {
            "assistant_id": "parallel",
            "command": {"resume": {calls["left?"]: "L", calls["right?"]: "R"}},
        },
    )
    assert r.status_code == 200
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert sorted(run.output["answers"]) == ["left=L", "right=R"]


def test_an_agent_inbox_request_is_accepted_with_edited_args(drain: Any) -> None:
    run = suspended("inbox", {"to": "x@y.z"}, drain)
    tc = ToolCall.objects.get(run=run)
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.tool_name == "send_email"
    assert tc.suspend_payload[0]["description"] == "Send **this** email?"  # stored untouched
    r = post("/agents/inbox/approve-tool-call", {"run_id": str(run.id), "args": {"to": "boss@y.z"}})
    assert r.status_code == 202
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["response"] == {
        "type": "edit",
        "args": {"action": "send_email", "args": {"to": "boss@y.z"}},
    }


def test_an_agent_inbox_request_declined_with_a_reason_is_a_response(drain: Any) -> None:
    run = suspended("inbox", {}, drain)
    post("/agents/inbox/decline-tool-call", {"run_id": str(run.id), "reason": "not now"})
    drain()
    run.refresh_from_db()
    assert run.output["response"] == {"type": "response", "args": "not now"}


# --- cancel, rollback, lost workers ---------------------------------------------------------------


def _run_in_thread(control: RunControl) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            claimed = services.run_claim(owner=new_owner_id(), limit=1)
            out["status"] = execute_claimed(claimed[0], control)
        finally:
            connection.close()

    t = threading.Thread(target=target)
    t.start()
    return t, out


def _wait_items(run: Run, n: int) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        cp = Checkpoint.objects.filter(run=run).order_by("-step").first()
        if cp is not None and len(cp.values.get("items", [])) >= n:
            return
        time.sleep(0.01)
    raise AssertionError("the graph made no progress")


def test_cancel_interrupt_stops_a_running_graph_and_keeps_its_checkpoints() -> None:
    run = start("slow", {"steps": 50, "delay_ms": 50})
    control = RunControl()
    t, out = _run_in_thread(control)
    _wait_items(run, 2)
    services.run_cancel(run=run, action="interrupt", actor="test")
    control.request_cancel()  # what the NOTIFY does in a worker
    t.join(5)
    assert out["status"] == RunStatus.INTERRUPTED
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    state = get(f"/threads/{run.thread_id}/state").json()
    done = len(state["values"]["items"])
    assert 2 <= done < 50
    # ["step"], or [] when the cancel landed between a task's writes and the next checkpoint
    # (LangGraph's own reading of such a head: the finished task's writes are pending on it).
    assert state["next"] in (["step"], [])
    time.sleep(0.2)
    assert len(get(f"/threads/{run.thread_id}/state").json()["values"]["items"]) == done


def test_cancel_rollback_deletes_the_runs_checkpoints_and_reverts_the_thread(drain: Any) -> None:
    first = start("slow", {"steps": 2, "delay_ms": 1})
    drain()
    before = get(f"/threads/{first.thread_id}/state").json()
    history = get(f"/threads/{first.thread_id}/history?limit=100").json()
    run = services.run_create(
        agent_id="slow",
        actor="test",
        thread_id=first.thread_id,
        input={"steps": 50, "delay_ms": 50},
    )
    control = RunControl()
    t, out = _run_in_thread(control)
    _wait_items(run, 4)
    services.run_cancel(run=run, action="rollback", actor="test")
    control.request_cancel()
    t.join(5)
    assert out["status"] == "deleted"
    assert not Run.objects.filter(id=run.id).exists()
    assert not GraphCheckpoint.objects.filter(run_id=run.id).exists()
    assert not GraphWrite.objects.filter(run_id=run.id).exists()
    after = get(f"/threads/{first.thread_id}/state").json()
    assert after["values"] == before["values"]
    assert after["checkpoint_id"] == before["checkpoint_id"]
    assert len(get(f"/threads/{first.thread_id}/history?limit=100").json()) == len(history)
    assert Thread.objects.get(id=first.thread_id).values == before["values"]


def test_deleting_a_resumed_graph_run_reverts_the_thread(drain: Any) -> None:
    run = suspended("approval", {"order_id": "ord-5"}, drain)
    post(f"/threads/{run.thread_id}/runs", {"assistant_id": "approval", "command": {"resume": 1}})
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    services.run_delete(run=run, actor="test")  # the resumed run and everything it wrote
    assert not GraphCheckpoint.objects.filter(thread_id=run.thread_id).exists()
    assert not GraphWrite.objects.filter(thread_id=run.thread_id).exists()
    state = get(f"/threads/{run.thread_id}/state").json()
    assert state["values"] == {}
    assert state["next"] == []


def test_a_lost_worker_resumes_from_the_last_super_step(drain: Any, caplog: Any) -> None:
    run = start("slow", {"steps": 6, "delay_ms": 30})
    control = RunControl()
    t, out = _run_in_thread(control)
    _wait_items(run, 3)
    control.mark_lost()  # the worker died: its lease is gone, nothing more is written
    t.join(5)
    assert out["status"] == "lost"
    # Said in the worker's log, as when a fenced write finds it out.
    assert f"lease lost run={run.id}" in caplog.text
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    services.runs_reap()
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    kept = len(Checkpoint.objects.filter(run=run).order_by("-step")[0].values["items"])
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["items"] == [0, 1, 2, 3, 4, 5]  # nothing ran twice
    assert run.attempt == 2
    assert kept >= 3


def test_a_step_cancelled_between_its_update_and_its_edge_runs_again_on_resume(
    drain: Any,
) -> None:
    """A cancel (or a lost lease, or a timeout) can land after a node's update was written to
    its task and before its edge's; LangGraph then saves the task's partial writes with its
    CancelledError. Resumed, that task must run again rather than count as done: with only
    its update applied and no edge, the graph would end early (seen in CI: [0, 1, 2, 3])."""
    import asyncio

    from runs.engine.registry import get_agent
    from runs.graphs.checkpointer import RunsiteSaver

    run = start("slow", {"steps": 6, "delay_ms": 30})
    control = RunControl()
    t, out = _run_in_thread(control)
    _wait_items(run, 3)
    control.mark_lost()
    t.join(5)
    assert out["status"] == "lost"
    saver = RunsiteSaver()  # no lease: as the graph's state API writes
    graph = get_agent("slow").graph.copy(update={"checkpointer": saver})
    try:
        head = graph.get_state({"configurable": {"thread_id": str(run.thread_id)}})
        (task,) = head.tasks  # the step the lost worker was in
        done = len(head.values["items"])
        # What LangGraph saves for that task when the cancel lands between the two writes.
        saver.put_writes(
            head.config, [("items", [done]), ("__error__", asyncio.CancelledError())], task.id
        )
        kept = GraphWrite.objects.filter(thread_id=run.thread_id, task_id=task.id)
        assert sorted(kept.values_list("channel", flat=True)) == ["__error__"]
    finally:
        saver.close()
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    services.runs_reap()
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["items"] == [0, 1, 2, 3, 4, 5]


def test_the_demo_graph_waits_in_the_inbox_and_sends_an_edited_reply(
    register_agent: Any, drain: Any
) -> None:
    from runs.graphs.loader import load_graphs
    from runs.management.commands.seed_demo import DEMO_EMAIL

    demo = load_graphs({"graphs": {"email_triage": "runs/graphs/demo.py:graph"}})
    register_agent(demo["email_triage"])
    run = suspended("email_triage", DEMO_EMAIL, drain)
    tc = ToolCall.objects.get(run=run)
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.suspend_payload[0]["config"]["allow_edit"] is True
    edited = {**tc.args, "body": "Refunded. Sorry!"}
    post("/agents/email_triage/approve-tool-call", {"run_id": str(run.id), "args": edited})
    drain()
    run.refresh_from_db()
    assert run.output["outcome"] == "sent"
    assert run.output["draft"] == "Refunded. Sorry!"
