"""When the step loop writes (runs/engine/loop.py): before anything acts on a decision, and
folded into the next write where nothing happens in between."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.agents.refund import issue_refund, lookup_order, refund_script
from runs.engine import Agent, FinalAnswer, ScriptedModel, ToolCalls, loop, tool
from runs.engine.context import NonRetryableError
from runs.engine.model import ProposedCall
from runs.exceptions import RunCancelled
from runs.models import Checkpoint, Run, RunStatus, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.django_db(transaction=True)]


def _refund_agent(agent_id: str, *, read_only_lookup: bool = True, **model: Any) -> Agent:
    """The built-in refund agent under another id; its lookup with effects when asked, its
    model in process unless `in_process=False`."""
    lookup = dataclasses.replace(lookup_order, read_only=read_only_lookup)

    class Script(ScriptedModel):
        in_process = model.get("in_process", True)

    return Agent(id=agent_id, tools=[lookup, issue_refund], model=Script(refund_script))


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


def test_a_refund_run_reaches_its_suspension_in_one_write_after_its_claim(drain, writes) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="t"
    )
    assert drain() == 1
    # lookup_order is read-only and the refund agent's model decides in process: the decision
    # to look the order up, the lookup's result and the decision to refund are held for the
    # suspension's write.
    assert [name for name, _ in writes] == ["run_suspend"]
    [plan] = writes[0][1]["plans"]
    assert plan.held is not None
    assert [w.step for w in plan.held.steps] == [0, 1, 2]
    [lookup] = plan.held.tool_calls
    assert (lookup["tool_name"], lookup["status"], lookup["step"]) == (
        "lookup_order",
        ToolCallStatus.SUCCEEDED,
        1,
    )
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
    # In the order three writes gave them (decision; outcome and its step; decision and
    # suspension), the input's step with the first write's.
    events = [(e.kind, e.data.get("step")) for e in run.events.order_by("seq")]
    events = events[events.index(("update", None)) :]  # after the run's creation and claim
    assert events == [
        ("update", None),
        ("tool_call", None),
        ("step", 0),
        ("step", 1),
        ("tool_result", None),
        ("update", None),
        ("step", 2),
        ("update", None),
        ("tool_call", None),
        ("step", 3),
        ("suspended", None),
    ]


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
    # The approved call is marked running (it was decided before): by the claim on
    # PostgreSQL, by a write of its own elsewhere; its outcome, the step that feeds it to the
    # model and the model's final answer (in process) go with the end.
    marks = [] if connection.vendor == "postgresql" else ["tool_call_update"]
    assert [name for name, _ in writes] == [*marks, "run_finish"]
    held = writes[-1][1]["held"]
    assert held.outcome.tool_call.tool_name == "issue_refund"
    assert [w.step for w in held.steps] == [4]
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.SUCCESS
    refund = ToolCall.objects.get(run=run, tool_name="issue_refund")
    assert refund.status == ToolCallStatus.SUCCEEDED and refund.result["refunded"] is True
    assert refund.started_at is not None and refund.finished_at >= refund.started_at
    seqs = list(run.events.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, run.last_seq + 1))


def test_a_resumed_run_is_claimed_with_its_checkpoint_and_calls(drain, reviewer) -> None:
    """On PostgreSQL the claim of a run started before hands over what it continues from, as
    the ORM reads it (every column, converted alike), so its worker reads neither again."""
    if connection.vendor != "postgresql":
        pytest.skip("the claim reads them on PostgreSQL only")
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A3", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    [claimed] = services.run_claim(owner="w", limit=1)
    checkpoint, calls = claimed.run.resumed_from
    latest = Checkpoint.objects.filter(run_id=run.id).order_by("-step").first()
    assert latest is not None and checkpoint is not None
    fields = [f.attname for f in Checkpoint._meta.concrete_fields]
    assert [getattr(checkpoint, f) for f in fields] == [getattr(latest, f) for f in fields]
    stored = {tc.tool_call_id: tc for tc in ToolCall.objects.filter(run_id=run.id)}
    assert len(calls) == len(stored) == 2
    fields = [f.attname for f in ToolCall._meta.concrete_fields]
    for tc in calls:
        assert [getattr(tc, f) for f in fields] == [
            getattr(stored[tc.tool_call_id], f) for f in fields
        ]
        assert not tc._state.adding
    # A fresh run is handed the thread's state instead, and nothing of its own.
    services.run_release(lease=claimed.lease)
    fresh = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A7", "amount": 5}, actor="t"
    )
    claims = services.run_claim(owner="w", limit=5)
    [first] = [c for c in claims if c.run.id == fresh.id]
    assert first.run.fresh and "resumed_from" not in first.run.__dict__


def test_a_resumed_run_reads_nothing_more_before_its_tool(drain, reviewer, monkeypatch) -> None:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A6", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    with CaptureQueriesContext(connection) as captured:
        drain()
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS
    reads = [
        q["sql"]
        for q in captured.captured_queries
        if "FROM runs_checkpoint WHERE run_id" in q["sql"]
        or "FROM runs_toolcall WHERE run_id" in q["sql"]
    ]
    # PostgreSQL: the claim brought both; SQLite reads them after its claim.
    assert len(reads) == (0 if connection.vendor == "postgresql" else 2)


def test_an_approved_call_is_marked_running_by_its_claim_or_in_one_statement(
    drain, reviewer, monkeypatch
) -> None:
    """The resumed run's next call, approved, is its worker's first act: on PostgreSQL its
    `running` mark goes with the claim (no write of its own before the tool), and the claim
    commits durably then (its tool has effects); elsewhere one write before the tool."""
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A4", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    marks: list[list[str]] = []
    claims: list[tuple[dict[str, str], dict[str, str]]] = []
    real_update, real_claim = services.tool_call_update, services.run_claim

    def spy_update(*args: Any, **kwargs: Any) -> Any:
        with CaptureQueriesContext(connection) as captured:
            result = real_update(*args, **kwargs)
        if kwargs["status"] == ToolCallStatus.RUNNING:
            marks.append([q["sql"] for q in captured.captured_queries])
        return result

    def spy_claim(*args: Any, **kwargs: Any) -> Any:
        claimed = real_claim(*args, **kwargs)
        for c in claimed:
            stored = ToolCall.objects.filter(run_id=c.run.id).values_list("tool_call_id", "status")
            claims.append((c.run.__dict__.get("marked_calls", {}), dict(stored)))
        return claimed

    monkeypatch.setattr(services, "tool_call_update", spy_update)
    monkeypatch.setattr(services, "run_claim", spy_claim)
    drain()
    refund = ToolCall.objects.get(run_id=run.id, tool_name="issue_refund")
    [(marked, stored)] = claims
    if connection.vendor == "postgresql":
        assert marks == []
        assert marked == {refund.tool_call_id: ToolCallStatus.APPROVED}
        assert stored[refund.tool_call_id] == ToolCallStatus.RUNNING  # committed with the claim
    else:  # the fence and the call's row, then the tool
        assert marked == {} and stored[refund.tool_call_id] == ToolCallStatus.APPROVED
        [mark] = marks
        assert any('UPDATE "runs_toolcall"' in sql for sql in mark)
    assert refund.status == ToolCallStatus.SUCCEEDED and refund.started_at is not None
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS


@pytest.mark.postgres
def test_a_claim_that_marks_a_call_commits_durably(drain, reviewer) -> None:
    """A claim commits without waiting for the WAL's flush (a lost claim leaves its run
    pending), except one that marks a call `running`: that call's tool, with effects, runs
    next, and its record must survive a crash of the database."""
    from runs.services import queue

    assert "synchronous_commit" in queue._CLAIM_SQL_POSTGRES

    def commit_mode_of_claim() -> str:
        with connection.cursor() as cursor:
            cursor.execute("BEGIN")
            try:
                sql = queue._claim_sql_postgres(1)
                params = {"now": services.core._now(), "owner": "w", "expires": None}
                params["deadline"] = None
                cursor.execute(sql, params)
                row = cursor.fetchone()
                cursor.execute("SHOW synchronous_commit")
                return row is not None and cursor.fetchone()[0]
            finally:
                cursor.execute("ROLLBACK")

    fresh = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A8", "amount": 5}, actor="t"
    )
    assert commit_mode_of_claim() == "off"
    drain()  # suspended
    services.tool_call_approve(run=Run.objects.get(id=fresh.id), actor=reviewer)
    assert commit_mode_of_claim() == "on"


def test_a_cancel_after_the_claim_that_marked_a_call_gives_it_back_its_decision(
    drain, reviewer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that lands after the claim marked the approved call `running` and before the
    tool starts stops the run at the check before the tool: the call is `approved` again (its
    decision kept, its tool never ran), not `running` for ever."""
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "A9", "amount": 5}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    results_before = Run.objects.get(id=run.id).events.filter(kind="tool_result").count()
    real_load = loop.StepLoop._load
    cancelled: list[str] = []

    def load_then_cancel(self: loop.StepLoop) -> Any:
        loaded = real_load(self)
        services.run_cancel(run=Run.objects.get(id=self.run.id), action="interrupt", actor="t")
        self.control.request_cancel("interrupt")  # what the cancel's notice tells the worker
        cancelled.append(str(self.run.id))
        return loaded

    monkeypatch.setattr(loop.StepLoop, "_load", load_then_cancel)
    drain()
    assert cancelled == [str(run.id)]
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED
    refund = ToolCall.objects.get(run_id=run.id, tool_name="issue_refund")
    assert (refund.status, refund.started_at, refund.result) == (
        ToolCallStatus.APPROVED,
        None,
        None,
    )
    events = Run.objects.get(id=run.id).events
    assert events.filter(kind="tool_result").count() == results_before  # the lookup's only


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
    drain, register_agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of a tool with effects is written `running` with the decision that proposes it;
    a cancel that lands after that write and before the tool starts stops the run at the check
    before the tool: the call goes back to `proposed` (it never ran), not `running` for ever."""
    register_agent(_refund_agent("refund_effects", read_only_lookup=False))
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
        agent_id="refund_effects", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="t"
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


def test_a_model_that_is_not_in_process_is_asked_after_the_outcome_is_written(
    drain, writes, register_agent
) -> None:
    """A read-only call's decision is written with its result, but a model that calls out
    (an LLM) gets nothing held while it decides: what it was given is committed first."""
    register_agent(_refund_agent("refund_remote", in_process=False))
    run = services.run_create(
        agent_id="refund_remote", thread_id=None, input={"order_id": "B1", "amount": 5}, actor="t"
    )
    drain()
    assert [name for name, _ in writes] == ["run_save_steps", "run_suspend"]
    saved = writes[0][1]
    assert [w.step for w in saved["held"].steps] == [0, 1] and [w.step for w in saved["steps"]] == [
        2
    ]
    [lookup] = saved["held"].tool_calls
    assert (lookup["tool_name"], lookup["status"]) == ("lookup_order", ToolCallStatus.SUCCEEDED)
    assert writes[1][1]["plans"][0].held is None
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED


def test_a_slow_read_only_tool_shows_as_running_while_it_runs(drain, register_agent) -> None:
    seen: list[tuple[str, Any]] = []

    @tool(read_only=True, description="A lookup that takes its time.")
    def slow_lookup(ctx: Any) -> dict[str, bool]:
        # Past the grace, the held decision is written from the timer's thread (well within
        # two seconds of a grace of READ_ONLY_GRACE_SECONDS, however busy the machine).
        assert loop.READ_ONLY_GRACE_SECONDS < 0.5
        until = time.monotonic() + 2
        while time.monotonic() < until:
            call = ToolCall.objects.filter(run_id=ctx.run_id, tool_call_id=ctx.tool_call_id).first()
            if call is not None:
                seen.append((call.status, call.started_at))
                break
            time.sleep(0.01)
        return {"found": True}

    def script(state: Any) -> ToolCalls | FinalAnswer:
        if state.last_result("slow_lookup") is None:
            return ToolCalls([ProposedCall("slow_lookup", {})])
        return FinalAnswer(output=state.last_result("slow_lookup").result)

    register_agent(Agent(id="slow_lookup", tools=[slow_lookup], model=ScriptedModel(script)))
    run = services.run_create(agent_id="slow_lookup", thread_id=None, input={}, actor="t")
    drain()
    [(status, started_at)] = seen
    assert status == ToolCallStatus.RUNNING and started_at is not None
    run = Run.objects.get(id=run.id)
    assert (run.status, run.output) == (RunStatus.SUCCESS, {"found": True})
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCallStatus.SUCCEEDED and call.started_at == started_at
    kinds = [e.kind for e in run.events.order_by("seq")]
    assert kinds.count("tool_call") == 1 and kinds.count("tool_result") == 1
    assert list(run.events.order_by("seq").values_list("seq", flat=True)) == list(
        range(1, run.last_seq + 1)
    )


def _charging_agent(agent_id: str, after: Any) -> Agent:
    """Charges a card (a tool with effects), then asks its in-process model, which does
    `after(state)`."""

    @tool(description="Charge the card.")
    def charge(ctx: Any) -> dict[str, str]:
        return {"charged": "10.00"}

    def script(state: Any) -> ToolCalls | FinalAnswer:
        if state.last_result("charge") is None:
            return ToolCalls([ProposedCall("charge", {})])
        return after(state)

    return Agent(id=agent_id, tools=[charge], model=ScriptedModel(script))


def _charged(drain: Any, register_agent: Any, agent_id: str, after: Any) -> Run:
    """A charging agent's run executed; its charge on record. Returns the run as it ended."""
    register_agent(_charging_agent(agent_id, after))
    run = services.run_create(agent_id=agent_id, thread_id=None, input={}, actor="t")
    drain()
    call = ToolCall.objects.get(run_id=run.id)
    assert (call.status, call.result) == (ToolCallStatus.SUCCEEDED, {"charged": "10.00"})
    return Run.objects.get(id=run.id)


def test_a_held_outcome_is_written_when_the_model_then_fails(drain, register_agent) -> None:
    def fail(state: Any) -> Any:
        raise NonRetryableError("the script has no answer")

    run = _charged(drain, register_agent, "charge_then_fail", fail)
    assert run.status == RunStatus.ERROR
    kinds = [e.kind for e in run.events.order_by("seq")]
    assert kinds.index("tool_result") < kinds.index("finished")


def test_a_held_outcome_is_recorded_after_a_cancel_that_ended_the_run(
    drain, register_agent
) -> None:
    def cancel_then_answer(state: Any) -> FinalAnswer:
        # A support agent's cancel, committed while the outcome waits for this decision.
        run = Run.objects.get(agent_id="charge_then_cancel")
        services.run_cancel(run=run, action="interrupt", actor="t", reason="stop")
        return FinalAnswer(output="done")

    run = _charged(drain, register_agent, "charge_then_cancel", cancel_then_answer)
    assert run.status == RunStatus.INTERRUPTED
    [result] = run.events.filter(kind="tool_result")
    assert result.data["after_cancel"] is True


def test_read_only_is_refused_on_a_tool_that_always_needs_approval() -> None:
    with pytest.raises(ValueError, match="read_only has no effect"):

        @tool(read_only=True, requires_approval=True)
        def refund_quietly(ctx: Any) -> None:
            return None
