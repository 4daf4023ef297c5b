"""When the step loop writes (runs/engine/loop.py): before anything acts on a decision, and
folded into the next write where nothing happens in between."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.exceptions import RunCancelled
from runs.models import Checkpoint, Run, RunStatus, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """The step loop's calls of the fenced-write services, in order."""
    seen: list[tuple[str, Any]] = []
    for name in ("run_save_steps", "tool_call_update", "run_suspend", "run_finish"):
        real = getattr(services, name)

        def spy(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            seen.append((_name, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(services, name, spy)
    return seen


def test_a_refund_run_reaches_its_suspension_in_three_writes_after_its_claim(drain, writes) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="t"
    )
    assert drain() == 1
    assert [name for name, _ in writes] == ["run_save_steps", "run_save_steps", "run_suspend"]
    decision, outcome, suspension = (kwargs for _, kwargs in writes)
    # 1. The decision to look the order up, the call already marked running (it runs next).
    [lookup] = decision["new_tool_calls"]
    assert (lookup["tool_name"], lookup["status"]) == ("lookup_order", ToolCallStatus.RUNNING)
    # 2. Its outcome, with the step that feeds it to the model.
    assert outcome["outcome"].tool_call.tool_name == "lookup_order"
    assert [w.step for w in outcome["steps"]] == [2]
    # 3. The decision to refund (it waits for a reviewer) with the suspension.
    [plan] = suspension["plans"]
    assert [w.step for w in plan.steps] == [3]
    assert [c["tool_name"] for c in plan.new_tool_calls] == ["issue_refund"]

    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.SUSPENDED
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run=run)}
    looked_up = calls["lookup_order"]
    assert looked_up.status == ToolCallStatus.SUCCEEDED and looked_up.result
    assert looked_up.started_at is not None and looked_up.started_at <= looked_up.finished_at
    assert calls["issue_refund"].status == ToolCallStatus.AWAITING_APPROVAL
    assert list(
        Checkpoint.objects.filter(run=run).order_by("step").values_list("step", flat=True)
    ) == [
        0,
        1,
        2,
        3,
    ]
    seqs = list(run.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, run.last_seq + 1))  # the timeline has no gap
    kinds = list(run.events.order_by("seq").values_list("kind", flat=True))
    assert kinds.index("tool_result") < kinds.index("suspended") == len(kinds) - 1


def test_a_suspension_takes_its_thread_lock_in_its_fence(drain, monkeypatch) -> None:
    statements: list[list[str]] = []
    real = services.run_suspend

    def spy(*args: Any, **kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as captured:
            result = real(*args, **kwargs)
        statements.append([q["sql"] for q in captured.captured_queries])
        return result

    monkeypatch.setattr(services, "run_suspend", spy)
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A3", "amount": 5}, actor="t"
    )
    drain()
    [suspension] = statements
    if connection.vendor == "postgresql":
        # BEGIN, the fence (the thread's lock taken first, then the run's), the write, COMMIT.
        assert len(suspension) == 4, suspension
        fence = suspension[1]
        assert fence.index("FROM runs_thread") < fence.index("UPDATE runs_run")
        assert "FOR NO KEY UPDATE" in fence
    else:  # the thread's read (SQLite's transaction holds the only writer's lock), the fence
        lock = next(i for i, sql in enumerate(suspension) if "FROM runs_thread" in sql)
        fence = next(i for i, sql in enumerate(suspension) if "SET last_seq" in sql)
        assert lock < fence
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.SUSPENDED
    assert run.thread.status == "interrupted"


def test_the_approved_refund_runs_and_finishes(drain, writes, reviewer) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A2", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    writes.clear()
    drain()
    # The approved call is marked running (it was decided before), its outcome goes with the
    # next step, and the model's final answer with the run's end.
    assert [name for name, _ in writes] == ["tool_call_update", "run_save_steps", "run_finish"]
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.SUCCESS
    refund = ToolCall.objects.get(run=run, tool_name="issue_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and refund.result["refunded"] is True
    seqs = list(run.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, run.last_seq + 1))


def test_an_approved_call_is_marked_running_in_one_statement(drain, reviewer, monkeypatch) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A4", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    marks: list[list[str]] = []
    real = services.tool_call_update

    def spy(*args: Any, **kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as captured:
            result = real(*args, **kwargs)
        if kwargs["status"] == ToolCallStatus.RUNNING:
            marks.append([q["sql"] for q in captured.captured_queries])
        return result

    monkeypatch.setattr(services, "tool_call_update", spy)
    drain()
    [mark] = marks
    if connection.vendor == "postgresql":  # the fence and the call's row; it commits alone
        [statement] = mark
        assert statement.index("UPDATE runs_run") < statement.index('UPDATE "runs_toolcall"')
    refund = ToolCall.objects.get(run_id=run.id, tool_name="issue_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and refund.started_at is not None
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS


def test_a_call_is_not_marked_running_once_its_run_was_cancelled(drain, reviewer) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A5", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    [claimed] = services.run_claim(owner="w", limit=1)
    services.run_cancel(run=claimed.run, action="interrupt", actor="t")
    refund = ToolCall.objects.get(run_id=run.id, tool_name="issue_refund")
    before = (refund.status, refund.started_at)
    with pytest.raises(RunCancelled):
        services.tool_call_update(
            lease=claimed.lease, tool_call=refund, status=ToolCallStatus.RUNNING
        )
    refund.refresh_from_db()
    assert (refund.status, refund.started_at) == before
    assert Run.objects.get(id=run.id).last_seq == claimed.run.last_seq + 1  # the cancel's event


def test_a_cancel_between_a_decision_and_its_tool_leaves_the_call_not_started(
    drain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup call is written `running` with the decision that proposes it; a cancel that
    lands after that write and before the tool starts stops the run at the check before the
    tool: the call goes back to `proposed` (it never ran), not `running` for ever."""
    real = services.run_save_steps
    cancelled: list[Any] = []

    def save_then_cancel(*args: Any, **kwargs: Any) -> Any:
        fence = real(*args, **kwargs)
        if fence.tool_calls and not cancelled:
            run = Run.objects.get(id=kwargs["lease"].run_id)
            services.run_cancel(run=run, action="interrupt", actor="t", reason="stop")
            cancelled.append(run.id)
            # What the cancel's NOTIFY tells the worker, arriving right after the write.
            return dataclasses.replace(fence, cancel_action="interrupt")
        return fence

    monkeypatch.setattr(services, "run_save_steps", save_then_cancel)
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert cancelled == [run.id]
    assert run.status == RunStatus.INTERRUPTED
    call = ToolCall.objects.get(run=run)
    assert (call.tool_name, call.status, call.started_at, call.result) == (
        "lookup_order",
        ToolCallStatus.PROPOSED,
        None,
        None,
    )
    assert not run.events.filter(kind="tool_result").exists()
