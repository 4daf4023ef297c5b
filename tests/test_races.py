"""Two actors at once, for real: threads with their own PostgreSQL connections."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from runs import services
from runs.exceptions import AlreadyDecided, Conflict, NotFound
from runs.models import AuditEntry, Run, RunEvent, RunStatus, ToolCall, ToolCallStatus

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def race(*actions: Callable[[], Any], rounds: int = 1) -> list[Any]:
    """Run the actions at the same instant in threads; return each result or exception."""
    barrier = threading.Barrier(len(actions))
    results: list[Any] = [None] * len(actions)

    def go(i: int, action: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = action()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i, a)) for i, a in enumerate(actions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def suspended_refund(drain) -> Run:
    run = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "R", "amount": 5}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


@pytest.mark.parametrize("second", ["approve", "decline"])
def test_two_reviewers_deciding_one_call_at_once_record_one_decision(
    drain, reviewer, reviewer2, second
) -> None:
    for _ in range(5):  # several rounds: the interleaving differs each time
        run = suspended_refund(drain)
        tc = ToolCall.objects.get(run=run, tool_name="issue_refund")
        other = (
            (
                lambda: services.tool_call_approve(
                    run=run, actor=reviewer2, tool_call_id=tc.tool_call_id
                )
            )
            if second == "approve"
            else (
                lambda: services.tool_call_decline(
                    run=run, actor=reviewer2, tool_call_id=tc.tool_call_id, reason="no"
                )
            )
        )
        results = race(
            lambda: services.tool_call_approve(
                run=run, actor=reviewer, tool_call_id=tc.tool_call_id
            ),
            other,
        )
        winners = [r for r in results if isinstance(r, Run)]
        losers = [r for r in results if isinstance(r, Exception)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert isinstance(losers[0], Conflict)
        tc.refresh_from_db()
        assert AuditEntry.objects.filter(run_id=run.id, tool_call_id=tc.tool_call_id).count() == 1
        assert RunEvent.objects.filter(run=run, kind="decision").count() == 1
        if isinstance(losers[0], AlreadyDecided):
            assert tc.decided_by in losers[0].detail
        drain()


def test_two_concurrent_cancels_cancel_once(drain, support) -> None:
    for action_b in ("interrupt", "rollback"):
        run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
        results = race(
            lambda: services.run_cancel(run=run, action="interrupt", actor=support),
            lambda r=run, a=action_b: services.run_cancel(run=r, action=a, actor=support),
        )
        errors = [r for r in results if isinstance(r, Exception)]
        assert len(errors) == 1, results
        # the loser finds the run already interrupted (Conflict) or already rolled back (gone)
        assert isinstance(errors[0], Conflict | NotFound), errors
        assert AuditEntry.objects.filter(run_id=run.id).count() == 1
        assert not Run.objects.filter(id=run.id, status__in=["pending", "running"]).exists()


def test_a_cancel_racing_a_suspension_always_ends_cancelled(support) -> None:
    from runs.engine.context import RunControl
    from runs.engine.loop import StepLoop, Suspended

    for _ in range(6):
        run = services.run_create(
            agent_id="refund", thread_id=None, input={"order_id": "C", "amount": 3}, actor="t"
        )
        claimed = services.run_claim(owner="racer", limit=1)[0]
        outcome = StepLoop(
            run=claimed.run, lease=claimed.lease, control=RunControl()
        ).run_until_stop()
        assert isinstance(outcome, Suspended)
        race(
            lambda o=outcome: services.run_suspend(plans=o.plans, values=o.values),
            lambda r=run: services.run_cancel(run=r, action="interrupt", actor=support),
        )
        run.refresh_from_db()
        # Either order: suspended-then-cancelled, or cancel-requested-then-"suspend" applying it.
        assert run.status == RunStatus.INTERRUPTED, run.status
        # The refund never ran. Its proposal is written with the suspension (nothing runs
        # before it), so a cancel that committed first leaves no proposal behind.
        statuses = list(
            ToolCall.objects.filter(run=run, tool_name="issue_refund").values_list(
                "status", flat=True
            )
        )
        assert statuses in (
            [ToolCallStatus.AWAITING_APPROVAL],
            [ToolCallStatus.PROPOSED],
            [],
        ), statuses


def test_a_decision_racing_a_new_run_on_the_thread_loses_nothing(drain, reviewer) -> None:
    """Approve the waiting refund while an echo run is created on the same thread: whichever
    commits first, the refund finishes before the echo run starts, from the refund's state."""
    for _ in range(5):
        thread = services.thread_create()
        refund = services.run_create(
            agent_id="refund", thread_id=thread.id, input={"order_id": "Q", "amount": 2}, actor="t"
        )
        drain()
        assert Run.objects.get(id=refund.id).status == RunStatus.SUSPENDED
        approved, created = race(
            lambda refund=refund: services.tool_call_approve(run=refund, actor=reviewer),
            lambda thread=thread: services.run_create(
                agent_id="echo", thread_id=thread.id, input={"x": 1}, actor="t"
            ),
        )
        assert not isinstance(approved, Exception), approved
        assert not isinstance(created, Exception), created
        drain()
        refund_run, echo_run = Run.objects.get(id=refund.id), Run.objects.get(id=created.id)
        assert refund_run.status == echo_run.status == RunStatus.SUCCESS
        assert echo_run.started_at >= refund_run.finished_at
        refund_last = refund_run.checkpoints.order_by("-step").first()
        assert echo_run.checkpoints.order_by("step").first().parent_id == refund_last.id


def test_reject_racing_a_decision_always_refuses(drain, reviewer) -> None:
    """A decision puts the run back in the queue; either way the thread is in flight."""
    for _ in range(5):
        thread = services.thread_create()
        refund = services.run_create(
            agent_id="refund", thread_id=thread.id, input={"order_id": "R", "amount": 2}, actor="t"
        )
        drain()
        approved, created = race(
            lambda refund=refund: services.tool_call_approve(run=refund, actor=reviewer),
            lambda thread=thread: services.run_create(
                agent_id="echo",
                thread_id=thread.id,
                input={},
                actor="t",
                multitask_strategy="reject",
            ),
        )
        assert not isinstance(approved, Exception), approved
        assert isinstance(created, Conflict)
        assert Run.objects.filter(thread_id=thread.id).count() == 1


class _Holding:
    """`write` in a transaction on a thread of its own that stays open half a second after it:
    whatever the write locked stays locked until then. `committing` is set just before the
    commit, so while the locks are still held: a statement that waited for them can only
    finish after it, one that did not wait finishes before it. (An event set after the commit
    would race the waiter, which the commit wakes before this thread runs on.)"""

    def __init__(self, write: Callable[[], Any]) -> None:
        import time

        from django.db import transaction

        self.held, self.committing = threading.Event(), threading.Event()

        def hold() -> None:
            try:
                with transaction.atomic():
                    write()
                    self.held.set()
                    time.sleep(0.5)
                    self.committing.set()
            finally:
                connection.close()

        self.thread = threading.Thread(target=hold)
        self.thread.start()
        assert self.held.wait(10)

    def committed_before(self) -> bool:
        """Whether the caller got past the held locks only once they were being released."""
        waited = self.committing.is_set()
        self.thread.join(10)
        return waited


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_a_cancel_waiting_for_a_step_leaves_the_thread_as_the_step_committed_it(
    action: str,
) -> None:
    """A cancel's one statement (`_cancel_at_once`) reads the thread's state with the snapshot
    it took before it waited for the run's lock. A worker's step that held that lock and then
    committed a checkpoint is invisible to that snapshot, so the cancel must give way to its
    full path, whose reads follow its locks: the thread's values and the cancel's answer are
    the step's (interrupt), or what the thread held before the run (rollback)."""
    import uuid

    from runs.contracts import StepWrite
    from runs.models import Thread

    thread = services.thread_create(metadata={})
    services.thread_update_state(thread=thread, values={"before": True}, actor="t")
    run = services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="t")
    (claimed,) = services.run_claim(owner="w", limit=1)
    step = {"items": [0], "step": 1}
    write = StepWrite(id=uuid.uuid4(), step=1, values=step, pending=[], parent_id=None)
    worker = _Holding(lambda: services.run_save_steps(lease=claimed.lease, steps=[write]))
    answer = services.CancelAnswer()
    services.run_cancel_on_thread(
        thread_id=thread.id, run_id=run.id, action=action, actor="t", answer=answer
    )
    assert worker.committed_before()  # the cancel waited for the step's commit
    expected = {"before": True} if action == "rollback" else step
    assert Thread.objects.get(id=thread.id).values == expected
    assert answer.result == expected


def test_a_cancel_waiting_for_a_run_queued_on_its_thread_leaves_the_thread_busy() -> None:
    """The same for the thread's row: a run queued on the thread (which holds the thread's lock
    until it commits) while the cancel's statement waits for that lock is invisible to the
    statement's snapshot. The thread must end busy with the queued run, not idle."""
    from runs.models import Thread

    thread = services.thread_create(metadata={})
    run = services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="t")
    services.run_claim(owner="w", limit=1)
    other = _Holding(
        lambda: services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")
    )
    services.run_cancel_on_thread(thread_id=thread.id, run_id=run.id, action="interrupt", actor="t")
    assert other.committed_before()
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED
    assert Thread.objects.get(id=thread.id).status == "busy"


def _two_waiting_calls(drain, register_agent) -> Run:
    """A run on a thread suspended on two approvals of one step."""
    from runs.agents.refund import issue_refund
    from runs.engine import Agent, FinalAnswer, ScriptedModel, ToolCalls
    from runs.engine.model import ProposedCall

    def script(state: Any) -> Any:
        if not state.results:
            return ToolCalls(
                [
                    ProposedCall("issue_refund", {"order_id": "T-1", "amount": 1}),
                    ProposedCall("issue_refund", {"order_id": "T-2", "amount": 2}),
                ]
            )
        return FinalAnswer(output={"done": len(state.results)})

    register_agent(Agent(id="twin_race", tools=[issue_refund], model=ScriptedModel(script)))
    thread = services.thread_create(metadata={})
    run = services.run_create(agent_id="twin_race", thread_id=thread.id, input=None, actor="t")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED and run.tool_calls.count() == 2
    return run


def test_a_resume_waiting_for_another_decision_decides_only_what_still_waits(
    drain, register_agent, reviewer
) -> None:
    """A resume locks the run and reads its waiting calls in one statement, whose snapshot is
    older than its locks: a reviewer's decision on one of two calls, committed while the resume
    waited, must leave the resume with the one call still waiting (a bare value decides it),
    not with both (it would ask for a map of both)."""
    run = _two_waiting_calls(drain, register_agent)
    first, second = run.tool_calls.order_by("created_at", "id")
    other = _Holding(
        lambda: services.tool_call_approve(
            run=Run.objects.get(id=run.id), actor=reviewer, tool_call_id=first.tool_call_id
        )
    )
    services.thread_resume(thread_id=run.thread_id, resume={"approved": True}, actor="t")
    assert other.committed_before()
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.decided_by == reviewer.username and second.decided_by == "t"
    assert {first.status, second.status} == {ToolCallStatus.APPROVED}
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


def test_a_resume_reads_the_calls_a_transaction_added_while_it_waited(
    drain, register_agent
) -> None:
    """The same for calls the statement's snapshot cannot see at all: added (with the run's row
    changed, as every writer of a run's calls changes it) by a transaction that held the run's
    lock while the resume waited. The resume must see three calls waiting, and ask for a map."""
    run = _two_waiting_calls(drain, register_agent)
    first = run.tool_calls.order_by("created_at", "id").first()
    assert first is not None

    def add_a_call() -> None:
        from runs.services.core import _lock_run

        _lock_run(run.id)
        ToolCall.objects.create(
            run_id=run.id,
            tool_call_id="call_added",
            step=first.step,
            tool_name="issue_refund",
            args={"order_id": "T-3", "amount": 3},
            requires_approval=True,
            status=ToolCallStatus.AWAITING_APPROVAL,
        )
        Run.objects.filter(id=run.id).update(last_seq=run.last_seq + 1)

    other = _Holding(add_a_call)
    with pytest.raises(Conflict) as refused:
        services.thread_resume(thread_id=run.thread_id, resume={"approved": True}, actor="t")
    assert other.committed_before()
    assert refused.value.code == "tool_call_required"
    assert len(refused.value.extra["pending_tool_call_ids"]) == 3


def test_a_bulk_cancel_waiting_for_a_run_reads_what_the_lock_holder_committed(support) -> None:
    """A bulk cancel locks its runs in one statement (`_lock_selected_runs`) whose snapshot is
    older than a lock it waited for. A transaction that held a run's lock and started a
    sub-agent run under it committed both: the snapshot does not see the child, so the bulk
    cancel must read the run again under its lock, and interrupt the child with its parent."""
    from django.utils import timezone

    run = services.run_create(
        agent_id="slow", thread_id=services.thread_create().id, input={"steps": 5}, actor="t"
    )
    services.run_claim(owner="w", limit=1)

    def start_child() -> None:
        Run.objects.filter(id=run.id).update(updated_at=timezone.now())  # the run's lock
        Run.objects.create(agent_id="echo", parent_run=run, status=RunStatus.RUNNING)

    holder = _Holding(start_child)
    result = services.runs_cancel_many(action="interrupt", actor=support, status="running")
    assert holder.committed_before()  # the bulk cancel waited for the lock
    assert result.interrupted == [run.id]
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED
    assert Run.objects.get(parent_run=run).status == RunStatus.INTERRUPTED


def test_a_reject_waiting_for_a_run_queued_on_its_thread_is_refused() -> None:
    """A creation's one statement (`runs._create_at_once`) decides whether its thread is busy
    with the snapshot it took before it waited for the thread's lock. A run queued on the thread
    by a transaction that held that lock, committed while the statement waited, is invisible to
    that snapshot: the reject must see it all the same and refuse, leaving one run."""
    from runs.models import Thread

    thread = services.thread_create(metadata={})
    other = _Holding(
        lambda: services.run_create(agent_id="slow", thread_id=thread.id, input={}, actor="t")
    )
    with pytest.raises(Conflict):
        services.run_create(
            agent_id="echo",
            thread_id=thread.id,
            input={},
            actor="t",
            multitask_strategy="reject",
        )
    assert other.committed_before()
    assert Run.objects.filter(thread_id=thread.id).count() == 1
    assert Thread.objects.get(id=thread.id).status == "busy"
