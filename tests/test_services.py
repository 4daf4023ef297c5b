"""The lifecycle table of DESIGN.md, one test per row, through runs/services."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from runs import selectors, services
from runs.exceptions import AlreadyDecided, Conflict, NotFound, RunCancelled, ValidationFailed
from runs.ids import uuid7
from runs.models import (
    AuditEntry,
    Checkpoint,
    Run,
    RunEvent,
    RunSearch,
    RunStatus,
    Thread,
    ThreadStatus,
    ToolCall,
    ToolCallStatus,
)

pytestmark = pytest.mark.django_db


def make_thread(**metadata: object) -> Thread:
    return services.thread_create(metadata=metadata or {"resource_id": "acme"})


def refund_run(thread: Thread | None = None, amount: float = 25.0) -> Run:
    return services.run_create(
        agent_id="refund",
        thread_id=thread.id if thread else None,
        input={"order_id": "A-1", "amount": amount},
        actor="test",
    )


def suspended_refund(drain, thread: Thread | None = None, amount: float = 25.0) -> Run:
    run = refund_run(thread, amount)
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def claim_one(owner: str = "w1") -> services.ClaimedRun:
    claimed = services.run_claim(owner=owner, limit=1)
    assert len(claimed) == 1
    return claimed[0]


# --- pending → running ----------------------------------------------------------------------


def test_it_claims_the_oldest_pending_run_and_marks_it_running() -> None:
    thread = make_thread()
    first = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    services.run_create(agent_id="echo", thread_id=make_thread().id, input=2, actor="t")
    claimed = claim_one()
    assert claimed.run.id == first.id
    first.refresh_from_db()
    assert first.status == RunStatus.RUNNING
    assert first.lease_owner == "w1"
    assert first.attempt == 1
    assert first.lease_expires_at > timezone.now()
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.BUSY
    assert list(first.events.order_by("seq").values_list("kind", flat=True)) == [
        "created",
        "started",
    ]


def test_it_runs_one_run_per_thread_at_a_time_in_creation_order() -> None:
    thread = make_thread()
    a = services.run_create(agent_id="echo", thread_id=thread.id, input="a", actor="t")
    b = services.run_create(agent_id="echo", thread_id=thread.id, input="b", actor="t")
    assert [c.run.id for c in services.run_claim(owner="w1", limit=5)] == [a.id]
    assert services.run_claim(owner="w2", limit=5) == []  # b waits for a
    lease = Lease_of(a)
    services.run_finish(lease=lease, status=RunStatus.SUCCESS, output={})
    assert [c.run.id for c in services.run_claim(owner="w2", limit=5)] == [b.id]


def Lease_of(run: Run) -> services.Lease:  # noqa: N802
    run.refresh_from_db()
    return services.Lease(run.id, run.lease_owner, run.attempt)


def test_it_does_not_claim_a_run_before_after_seconds() -> None:
    services.run_create(agent_id="echo", thread_id=None, input=1, after_seconds=60, actor="t")
    assert services.run_claim(owner="w1") == []


@pytest.mark.postgres
def test_an_empty_queue_is_answered_by_one_read_without_the_claims_update() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    thread = make_thread()
    services.run_create(agent_id="echo", thread_id=None, input=1, after_seconds=60, actor="t")
    services.run_create(agent_id="echo", thread_id=thread.id, input=2, actor="t")
    claim_one()
    with CaptureQueriesContext(connection) as queries:
        assert services.run_claim(owner="w2", limit=5) == []  # one not due, none pending
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert queries[0]["sql"].lstrip().startswith("SELECT 1 FROM runs_run")
    # a due run behind a running one on its thread: the read says "maybe", the claim says no
    services.run_create(agent_id="echo", thread_id=thread.id, input=3, actor="t")
    with CaptureQueriesContext(connection) as queries:
        assert services.run_claim(owner="w2", limit=5) == []
    assert len(queries) == 2


@pytest.mark.postgres
def test_a_new_run_is_queued_in_one_statement() -> None:
    """The thread locked, checked against what this process knows of it, then the run, its
    first event, its search document, the thread's status and metadata and the workers'
    wake-up, as one statement (8 at first, then 2; tests/test_create_at_once.py has the
    rest)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def statements(captured: CaptureQueriesContext) -> list[str]:
        # (the test's own transaction turns the service's into a savepoint)
        return [q["sql"] for q in captured if "SAVEPOINT" not in q["sql"]]

    thread = services.thread_create(metadata={"team": "blue"})
    with CaptureQueriesContext(connection) as queries:
        run = services.run_create(agent_id="echo", thread_id=thread.id, input={"q": 1}, actor="t")
    assert len(statements(queries)) == 1, statements(queries)
    assert "pg_notify" in statements(queries)[0]
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.BUSY
    assert thread.metadata["team"] == "blue" and thread.metadata["graph_id"] == "echo"
    assert list(RunEvent.objects.filter(run=run).values_list("seq", "kind", "actor")) == [
        (1, "created", "t")
    ]
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    document = RunSearch.objects.get(run=run).document
    assert "input: q 1" in document and "graph_id echo" in document
    # A second run behind it: queued (enqueue), the thread already stamped.
    with CaptureQueriesContext(connection) as queries:
        services.run_create(agent_id="echo", thread_id=thread.id, input={"q": 2}, actor="t")
    assert len(statements(queries)) == 1
    assert "metadata" not in statements(queries)[0].split("UPDATE runs_thread")[1].split(" FROM")[0]


# --- running → suspended → pending → success (same run id) -----------------------------------


def test_it_suspends_with_a_snapshot_and_continues_the_same_run_after_approval(
    drain, reviewer
) -> None:
    thread = make_thread()
    run = suspended_refund(drain, thread)
    tc = ToolCall.objects.get(run=run, tool_name="issue_refund")
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.requires_approval is True
    assert run.suspended_at is not None and run.lease_owner is None
    snapshot = Checkpoint.objects.filter(run=run).order_by("-step").first()
    assert snapshot.pending == [tc.tool_call_id]
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.INTERRUPTED
    assert thread.values == snapshot.values

    services.tool_call_approve(run=run, actor=reviewer)
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"refunded": True, "order_id": "A-1", "amount": 25.0}
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.IDLE
    assert thread.values["output"] == run.output
    entry = AuditEntry.objects.get(action="approve")
    assert (entry.actor, entry.run_id, entry.tool_call_id) == ("rita", run.id, tc.tool_call_id)
    # the tool result was recorded once; lookup_order was not re-executed after the resume
    assert (
        ToolCall.objects.get(run=run, tool_name="lookup_order").status == ToolCallStatus.SUCCEEDED
    )
    kinds = list(run.events.order_by("seq").values_list("kind", flat=True))
    assert kinds.count("suspended") == 1 and kinds.count("resumed") == 1 and kinds[-1] == "finished"


def test_it_uses_edited_arguments_and_keeps_the_originals(drain, reviewer) -> None:
    run = suspended_refund(drain, amount=480.0)
    services.tool_call_approve(run=run, actor=reviewer, args={"order_id": "A-1", "amount": 48.0})
    drain()
    run.refresh_from_db()
    assert run.output == {"refunded": True, "order_id": "A-1", "amount": 48.0}
    tc = ToolCall.objects.get(run=run, tool_name="issue_refund")
    assert tc.original_args == {"order_id": "A-1", "amount": 480.0}
    assert tc.args == {"order_id": "A-1", "amount": 48.0}
    audit = AuditEntry.objects.get(action="approve")
    assert audit.before["args"]["amount"] == 480.0 and audit.after["args"]["amount"] == 48.0


def test_it_gives_the_model_the_decline_reason(drain, reviewer) -> None:
    run = suspended_refund(drain)
    services.tool_call_decline(run=run, actor=reviewer, reason="duplicate request")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"refunded": False, "reason": "duplicate request"}


def test_it_uses_a_default_text_when_declined_without_reason(drain, reviewer) -> None:
    run = suspended_refund(drain)
    services.tool_call_decline(run=run, actor=reviewer)
    drain()
    run.refresh_from_db()
    assert run.output == {"refunded": False, "reason": services.DEFAULT_DECLINE_TEXT}


def test_it_resumes_a_tool_that_asked_for_input(drain, reviewer) -> None:
    run = services.run_create(agent_id="weather", thread_id=None, input={}, actor="t")
    drain()
    run.refresh_from_db()
    tc = ToolCall.objects.get(run=run)
    assert (tc.status, tc.suspend_payload) == (
        ToolCallStatus.AWAITING_INPUT,
        {"message": "Which city?"},
    )
    assert tc.resume_schema["required"] == ["city"]
    services.tool_call_answer(run=run, actor=reviewer, resume_data={"city": "Oslo"})
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["city"] == "Oslo" and run.output["forecast"]


def test_it_rejects_resume_data_that_does_not_match_the_schema(drain, reviewer) -> None:
    run = services.run_create(agent_id="weather", thread_id=None, input={}, actor="t")
    drain()
    with pytest.raises(ValidationFailed) as err:
        services.tool_call_answer(run=run, actor=reviewer, resume_data={"city": ""})
    assert err.value.errors[0]["field"] == "resume_data.city"
    with pytest.raises(ValidationFailed) as err:
        services.tool_call_answer(run=run, actor=reviewer, resume_data={})
    assert "city" in err.value.detail
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.AWAITING_INPUT
    assert not AuditEntry.objects.exists()


# --- running → success / error / timeout ------------------------------------------------------


def test_it_finishes_success(drain) -> None:
    run = services.run_create(agent_id="echo", thread_id=None, input={"x": 1}, actor="t")
    drain()
    run.refresh_from_db()
    assert (run.status, run.output) == (RunStatus.SUCCESS, {"echo": {"x": 1}})
    assert run.finished_at is not None


@override_settings(RUNS_MAX_ATTEMPTS=1)
def test_it_finishes_error_when_the_agent_raises_on_its_last_attempt(drain) -> None:
    thread = make_thread()
    run = services.run_create(agent_id="flaky", thread_id=thread.id, input={}, actor="t")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR
    assert run.error["error"] == "FlakyFailure"
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.ERROR


def test_it_retries_a_run_that_raised(drain) -> None:
    run = services.run_create(agent_id="flaky", thread_id=None, input={}, actor="t")
    drain()
    run.refresh_from_db()
    assert (run.status, run.attempt, run.output) == (
        RunStatus.SUCCESS,
        2,
        {"ok": True, "attempt": 2},
    )
    assert "retry" in list(run.events.values_list("kind", flat=True))


@override_settings(RUNS_DEFAULT_TIME_LIMIT=0.2)
def test_it_ends_timeout_past_the_time_limit(drain) -> None:
    run = services.run_create(
        agent_id="slow", thread_id=None, input={"steps": 20, "delay_ms": 50}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.TIMEOUT
    assert run.error["error"] == "TimeoutError"


# --- running → worker died ----------------------------------------------------------------------


def expire_lease(run: Run) -> None:
    Run.objects.filter(id=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_it_requeues_a_run_whose_lease_expired() -> None:
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    claim_one()
    expire_lease(run)
    counts = services.runs_reap()
    run.refresh_from_db()
    assert counts["requeued"] == 1
    assert (run.status, run.lease_owner, run.attempt) == (RunStatus.PENDING, None, 1)
    again = claim_one("w2")
    assert again.lease.attempt == 2


def test_it_fails_a_run_after_max_attempts() -> None:
    thread = make_thread()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    for i in range(3):
        claim_one(f"w{i}")
        expire_lease(run)
        services.runs_reap(max_attempts=3)
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR
    assert run.error["error"] == "LeaseExpired"
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.ERROR


def test_a_worker_that_lost_its_lease_cannot_write() -> None:
    import uuid

    from runs.exceptions import LeaseLost

    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    old = claim_one("zombie")
    expire_lease(run)
    services.runs_reap()
    claim_one("fresh")
    with pytest.raises(LeaseLost):
        services.run_save_steps(
            lease=old.lease, steps=[services.StepWrite(uuid.uuid4(), 7, {}, [], None)]
        )
    with pytest.raises(LeaseLost):
        services.run_finish(lease=old.lease, status=RunStatus.SUCCESS, output={"late": True})
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.output is None
    assert not Checkpoint.objects.filter(run=run, step=7).exists()


@pytest.mark.parametrize("announced", ["", "rule", "webhook"])
def test_a_worker_that_lost_its_lease_writes_none_of_what_it_held_with_the_end(
    announced: str,
) -> None:
    """A run's end with held writes (a read-only call and its step, not written yet): on
    PostgreSQL they go in the end's round trip, before its fenced statement; a lost lease makes
    that statement fail and the held writes roll back with it. The same where deliveries (a
    notification rule's, the run's webhook) would follow the end in its transaction: none is
    written either."""
    from runs.exceptions import LeaseLost
    from runs.models import Delivery, NotificationRule

    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    if announced == "rule":
        NotificationRule.objects.create(
            name="ends", agent_id="echo", events=["success"], webhook_url="https://hooks.test/x"
        )
    elif announced == "webhook":
        Run.objects.filter(id=run.id).update(webhook="https://hooks.test/run")
    old = claim_one("zombie")
    expire_lease(run)
    services.runs_reap()
    fresh = claim_one("fresh")
    step = services.StepWrite(uuid7(), 3, {"messages": []}, [], None)
    held = services.HeldWrites(
        steps=[step],
        tool_calls=[
            {
                "id": uuid7(),
                "step": 3,
                "tool_call_id": "call_late",
                "tool_name": "lookup_order",
                "args": {},
                "status": ToolCallStatus.SUCCEEDED,
                "result": {"found": True},
            }
        ],
        events=[("tool_result", {"tool_call_id": "call_late"}, "system")],
    )
    with pytest.raises(LeaseLost):
        services.run_finish(lease=old.lease, status=RunStatus.SUCCESS, output={}, held=held)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.output is None
    assert not ToolCall.objects.filter(run=run).exists()
    assert not Checkpoint.objects.filter(id=step.id).exists()
    assert not run.events.filter(kind="tool_result").exists()
    assert not Delivery.objects.exists()
    # The worker's connection is usable after the failed end.
    assert Run.objects.get(id=run.id).lease_owner == "fresh"
    if announced:  # and the end, by the lease's holder, does announce it
        services.run_finish(lease=fresh.lease, status=RunStatus.SUCCESS, output={})
        assert Delivery.objects.filter(run_id=run.id).count() == 1


# --- cancel: interrupt and rollback of pending, running, suspended --------------------------------


def test_interrupt_of_a_pending_run_keeps_the_record(support) -> None:
    thread = make_thread()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    result = services.run_cancel(run=run, action="interrupt", actor=support, reason="not needed")
    assert result.status == RunStatus.INTERRUPTED
    run.refresh_from_db()
    assert (run.status, run.cancel_action) == (RunStatus.INTERRUPTED, "interrupt")
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.IDLE
    entry = AuditEntry.objects.get(action="cancel_interrupt")
    assert (entry.actor, entry.run_id, entry.reason) == ("sam", run.id, "not needed")


def test_rollback_of_a_pending_run_deletes_it(support) -> None:
    thread = make_thread()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    assert services.run_cancel(run=run, action="rollback", actor=support) is None
    assert not Run.objects.filter(id=run.id).exists()
    assert not RunEvent.objects.filter(run_id=run.id).exists()
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.IDLE
    assert AuditEntry.objects.get(action="cancel_rollback").run_id == run.id


def test_rollback_takes_every_row_of_the_run_in_one_delete(
    drain, support, django_assert_num_queries
) -> None:
    """Events, checkpoints, tool calls, search rows and sub-agent runs go with the run (ON
    DELETE CASCADE); a retry of it or a call that delegated to it only lose the reference."""
    thread = make_thread()
    run = suspended_refund(drain, thread)
    child = Run.objects.create(agent_id="echo", parent_run=run, status=RunStatus.SUCCESS)
    RunEvent.objects.create(run=child, seq=1, kind="created")
    retry = Run.objects.create(agent_id="refund", retry_of=run, status=RunStatus.SUCCESS)
    caller = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    delegating = ToolCall.objects.create(
        run=caller, tool_call_id="c1", tool_name="ask", step=1, child_run=run
    )
    assert RunSearch.objects.filter(run_id=run.id).exists()
    assert Checkpoint.objects.filter(run=run).exists() and ToolCall.objects.filter(run=run)

    # BEGIN, the thread and run locked (one statement), one statement (the DELETE, the audit
    # entry, the thread's state), COMMIT; on SQLite the locks are two reads and that
    # statement's parts run one after another.
    with django_assert_num_queries(4 if connection.vendor == "postgresql" else 8):
        services.run_cancel(run=run, action="rollback", actor=support)

    for model in (Checkpoint, ToolCall, RunEvent, RunSearch):
        assert not model.objects.filter(run_id__in=[run.id, child.id]).exists(), model
    assert not Run.objects.filter(id__in=[run.id, child.id]).exists()
    assert Run.objects.get(id=retry.id).retry_of_id is None
    delegating.refresh_from_db()
    assert delegating.child_run_id is None


def test_an_interrupt_is_one_statement_after_the_locks(
    drain, support, django_assert_num_queries
) -> None:
    """The run's end, its event, the audit entry, the thread's status and values and the
    worker's notice: one statement on PostgreSQL after the thread and run locks (one more)."""
    thread = make_thread()
    earlier = services.run_create(agent_id="echo", thread_id=thread.id, input="x", actor="t")
    drain()
    run = suspended_refund(drain, thread)
    claimed_newest = Checkpoint.objects.filter(thread=thread).order_by("-created_at", "-id")[0]
    assert claimed_newest.run_id == run.id
    # BEGIN, the thread and run locked in one statement, one statement, COMMIT.
    with django_assert_num_queries(4 if connection.vendor == "postgresql" else 9):
        services.run_cancel(run=run, action="interrupt", actor=support, reason="stop")
    run.refresh_from_db()
    assert (run.status, run.cancel_action, run.cancel_reason) == (
        "interrupted",
        "interrupt",
        "stop",
    )
    assert run.finished_at is not None and run.lease_owner is None
    events = list(run.events.order_by("seq").values_list("seq", "kind", "data"))
    assert events[-1] == (run.last_seq, "cancelled", {"action": "interrupt", "reason": "stop"})
    assert AuditEntry.objects.filter(run_id=run.id, action="cancel_interrupt").count() == 1
    thread.refresh_from_db()
    # Idle (nothing else in flight), its values the interrupted run's newest checkpoint.
    assert thread.status == ThreadStatus.IDLE
    assert thread.values == claimed_newest.values
    assert Run.objects.get(id=earlier.id).status == RunStatus.SUCCESS


def test_interrupt_of_a_suspended_run_keeps_checkpoints(drain, support) -> None:
    thread = make_thread()
    run = suspended_refund(drain, thread)
    n = Checkpoint.objects.filter(run=run).count()
    services.run_cancel(run=run, action="interrupt", actor=support)
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert Checkpoint.objects.filter(run=run).count() == n > 0
    thread.refresh_from_db()
    assert thread.status == ThreadStatus.IDLE
    assert selectors.suspended_runs_for_agent(agent_id="refund").total == 0


def test_rollback_of_a_suspended_run_reverts_the_thread(drain, support) -> None:
    thread = make_thread()
    first = services.run_create(agent_id="echo", thread_id=thread.id, input="before", actor="t")
    drain()
    thread.refresh_from_db()
    before = thread.values
    assert before["output"] == {"echo": "before"}
    run = suspended_refund(drain, thread)
    assert Thread.objects.get(id=thread.id).values != before
    services.run_cancel(run=run, action="rollback", actor=support, reason="wrong order")
    assert not Run.objects.filter(id=run.id).exists()
    assert not Checkpoint.objects.filter(run_id=run.id).exists()
    assert not ToolCall.objects.filter(run_id=run.id).exists()
    thread.refresh_from_db()
    assert thread.values == before
    assert thread.status == ThreadStatus.IDLE
    assert Run.objects.filter(id=first.id).exists()
    assert AuditEntry.objects.filter(run_id=run.id, action="cancel_rollback").count() == 1


def test_cancel_of_a_running_run_ends_it_and_fences_the_worker_out(support) -> None:
    thread = make_thread()
    run = services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 3}, actor="t")
    claimed = claim_one()
    result = services.run_cancel(run=run, action="interrupt", actor=support, reason="runaway")
    assert result.status == RunStatus.INTERRUPTED
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED and run.finished_at is not None
    assert (run.cancel_action, run.cancel_reason, run.lease_owner) == ("interrupt", "runaway", None)
    assert Thread.objects.get(id=thread.id).status == ThreadStatus.IDLE
    last = run.events.order_by("-seq").first()
    assert (last.seq, last.kind) == (run.last_seq, "cancelled")
    # The worker's next write is refused: it learns the run was cancelled, not that it lost it.
    assert services.run_heartbeat(owner="w1", run_ids=[run.id]) == {}
    with pytest.raises(RunCancelled) as stop:
        services.run_save_steps(lease=claimed.lease, steps=[])
    assert stop.value.deleted is False
    # ... and its acknowledgement changes nothing.
    assert services.run_acknowledge_cancel(lease=claimed.lease).status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=run.id).last_seq == run.last_seq


def test_a_tool_that_finishes_after_the_cancel_still_has_its_outcome_recorded(support) -> None:
    run = services.run_create(agent_id="slow", thread_id=None, input={"steps": 3}, actor="t")
    claimed = claim_one()
    services.run_save_steps(
        lease=claimed.lease,
        steps=[],
        new_tool_calls=[
            {"tool_call_id": "c1", "tool_name": "tick", "args": {}, "status": "proposed"}
        ],
    )
    tc = ToolCall.objects.get(run_id=run.id, tool_call_id="c1")
    services.tool_call_update(lease=claimed.lease, tool_call=tc, status=ToolCallStatus.RUNNING)
    services.run_cancel(run=run, action="interrupt", actor=support)
    event = ("tool_result", {"tool_call_id": "c1", "status": "succeeded"}, "system")
    with pytest.raises(RunCancelled):
        services.tool_call_update(
            lease=claimed.lease,
            tool_call=tc,
            status=ToolCallStatus.SUCCEEDED,
            result=1,
            event=event,
        )
    tc.refresh_from_db()
    assert (tc.status, tc.result) == (ToolCallStatus.SUCCEEDED, 1)
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    last = run.events.order_by("-seq").first()
    assert (last.seq, last.kind, last.data["after_cancel"]) == (run.last_seq, "tool_result", True)
    # Only a call still running under that attempt: a second report writes nothing.
    with pytest.raises(RunCancelled):
        services.tool_call_update(
            lease=claimed.lease, tool_call=tc, status=ToolCallStatus.FAILED, result=2, event=event
        )
    assert ToolCall.objects.get(id=tc.id).result == 1
    assert Run.objects.get(id=run.id).last_seq == run.last_seq


def test_a_step_write_records_the_last_tool_outcome_with_it(support) -> None:
    """run_save_steps(outcome=…): the call's result, its event and the next step commit
    together; after a cancel the outcome is still recorded (after_cancel), the step is not."""
    run = services.run_create(agent_id="slow", thread_id=None, input={"steps": 3}, actor="t")
    claimed = claim_one()
    proposed = {"tool_call_id": "c1", "tool_name": "tick", "args": {}, "status": "proposed"}
    fence = services.run_save_steps(lease=claimed.lease, steps=[], new_tool_calls=[proposed])
    [tc] = fence.tool_calls  # as written: no read back
    assert ToolCall.objects.get(id=tc.id).tool_call_id == "c1"
    services.tool_call_update(lease=claimed.lease, tool_call=tc, status=ToolCallStatus.RUNNING)
    event = ("tool_result", {"tool_call_id": "c1", "status": "succeeded"}, "system")
    step = services.StepWrite(uuid7(), 1, {"messages": []}, [], None)
    fence = services.run_save_steps(
        lease=claimed.lease,
        steps=[step],
        events=[("update", {"node": "tools"}, "system")],
        outcome=services.ToolOutcome(tool_call=tc, status="succeeded", result=7, event=event),
    )
    assert (ToolCall.objects.get(id=tc.id).status, ToolCall.objects.get(id=tc.id).result) == (
        ToolCallStatus.SUCCEEDED,
        7,
    )
    kinds = list(run.events.filter(seq__gt=fence.last_seq - 3).order_by("seq"))
    assert [e.kind for e in kinds] == ["tool_result", "update", "step"]
    assert kinds[-1].seq == fence.last_seq == Run.objects.get(id=run.id).last_seq

    second = services.run_save_steps(
        lease=claimed.lease,
        steps=[],
        new_tool_calls=[{**proposed, "tool_call_id": "c2"}],
    ).tool_calls[0]
    services.tool_call_update(lease=claimed.lease, tool_call=second, status="running")
    services.run_cancel(run=run, action="interrupt", actor=support)
    checkpoints = Checkpoint.objects.filter(run_id=run.id).count()
    with pytest.raises(RunCancelled):
        services.run_save_steps(
            lease=claimed.lease,
            steps=[services.StepWrite(uuid7(), 2, {"messages": []}, [], step.id)],
            outcome=services.ToolOutcome(
                tool_call=second, status="succeeded", result=8, event=event
            ),
        )
    assert ToolCall.objects.get(id=second.id).result == 8
    assert Checkpoint.objects.filter(run_id=run.id).count() == checkpoints
    last = Run.objects.get(id=run.id).events.order_by("-seq").first()
    assert (last.kind, last.data["after_cancel"]) == ("tool_result", True)


def test_a_decision_that_only_waits_is_written_with_the_suspension() -> None:
    """SuspendPlan(steps=…, new_tool_calls=…, events=…): the model's decision and the run's
    suspension in one transaction, its events just before `suspended`."""
    thread = make_thread()
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "o1", "amount": 5}, actor="t"
    )
    claimed = claim_one()
    call = {
        "tool_call_id": "c9",
        "tool_name": "issue_refund",
        "args": {"order_id": "o1", "amount": 5},
        "status": "proposed",
    }
    step = services.StepWrite(uuid7(), 1, {"messages": ["decided"]}, ["c9"], None)
    plan = services.SuspendPlan(
        lease=claimed.lease,
        waiting=[{**call, "status": "awaiting_approval", "requires_approval": True}],
        steps=[step],
        new_tool_calls=[call],
        events=[("tool_call", {"tool_call_id": "c9"}, "system")],
    )
    assert services.run_suspend(plans=[plan], values=step.values) == RunStatus.SUSPENDED
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    tc = ToolCall.objects.get(run_id=run.id, tool_call_id="c9")
    assert (tc.status, tc.requires_approval) == (ToolCallStatus.AWAITING_APPROVAL, True)
    assert Checkpoint.objects.get(id=step.id).pending == ["c9"]
    tail = list(run.events.order_by("-seq")[:3])[::-1]
    assert [e.kind for e in tail] == ["tool_call", "step", "suspended"]
    assert [e.seq for e in tail] == [run.last_seq - 2, run.last_seq - 1, run.last_seq]
    assert Thread.objects.get(id=thread.id).status == "interrupted"


def test_rollback_of_a_running_run_deletes_it_at_once(support) -> None:
    thread = make_thread()
    run = services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 3}, actor="t")
    claimed = claim_one()
    assert services.run_cancel(run=run, action="rollback", actor=support) is None
    assert not Run.objects.filter(id=run.id).exists()
    assert Thread.objects.get(id=thread.id).values is None
    with pytest.raises(RunCancelled) as stop:
        services.run_save_steps(lease=claimed.lease, steps=[])
    assert stop.value.deleted is True
    assert services.run_acknowledge_cancel(lease=claimed.lease) is None


def test_a_cancel_requested_for_a_dead_worker_is_applied_by_the_reaper(support) -> None:
    # A request written on the row but not applied: what an older version left behind.
    run = services.run_create(agent_id="slow", thread_id=None, input={"steps": 3}, actor="t")
    claim_one()
    Run.objects.filter(id=run.id).update(
        cancel_action="interrupt", cancel_requested_at=timezone.now()
    )
    expire_lease(run)
    assert services.runs_reap()["cancelled"] == 1
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED


@pytest.mark.parametrize("status", ["success", "error", "timeout", "interrupted"])
@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_cancel_of_a_finished_run_is_refused_and_changes_nothing(status, action, support) -> None:
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    Run.objects.filter(id=run.id).update(status=status)
    events = RunEvent.objects.filter(run=run).count()
    with pytest.raises(Conflict) as err:
        services.run_cancel(run=run, action=action, actor=support)
    assert f"already {status}" in err.value.detail
    run.refresh_from_db()
    assert run.status == status
    assert RunEvent.objects.filter(run=run).count() == events
    assert not AuditEntry.objects.exists()


# --- bulk cancel ----------------------------------------------------------------------------------


def test_bulk_cancel_by_status_across_threads(drain, support) -> None:
    pending = [
        services.run_create(agent_id="echo", thread_id=make_thread().id, input=i, actor="t")
        for i in range(3)
    ]
    suspended = suspended_refund(drain, make_thread())
    pending = [
        services.run_create(agent_id="echo", thread_id=make_thread().id, input=i, actor="t")
        for i in range(3)
    ]
    result = services.runs_cancel_many(action="interrupt", actor=support, status="pending")
    assert sorted(result.interrupted) == sorted(r.id for r in pending)
    assert Run.objects.get(id=suspended.id).status == RunStatus.SUSPENDED
    # "all" is pending + running: the run waiting for a human is left alone ...
    result = services.runs_cancel_many(action="rollback", actor=support, status="all")
    assert result.count == 0
    assert Run.objects.get(id=suspended.id).status == RunStatus.SUSPENDED
    # ... until it is asked for by name.
    result = services.runs_cancel_many(action="rollback", actor=support, status="suspended")
    assert result.deleted == [suspended.id]


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_it_cancels_many_running_runs_in_a_few_statements(
    action, support, django_assert_max_num_queries
) -> None:
    threads = [make_thread() for _ in range(12)]
    runs = [
        services.run_create(agent_id="echo", thread_id=t.id, input=i, actor="t")
        for i, t in enumerate(threads)
    ]
    claimed = services.run_claim(owner="w1", limit=12)
    assert len(claimed) == 12
    # The same handful of statements for 12 runs as for 1 (a sweep of runaway runs): on
    # PostgreSQL one that reads the runs and locks their threads, then them, and one more (the
    # runs' end, or their DELETE, which takes their rows in every table with them by ON DELETE;
    # events, audit entries, threads, the workers' notices), within a savepoint here.
    with django_assert_max_num_queries(4 if connection.vendor == "postgresql" else 10):
        result = services.runs_cancel_many(
            action=action, actor=support, status="running", reason="sweep"
        )
    ids = sorted(r.id for r in runs)
    if action == "rollback":
        assert sorted(result.deleted) == ids and not result.interrupted
        assert not Run.objects.filter(id__in=ids).exists()
    else:
        assert sorted(result.interrupted) == ids and not result.deleted
        for run in Run.objects.filter(id__in=ids):
            assert run.status == RunStatus.INTERRUPTED and run.lease_owner is None
            assert run.cancel_action == "interrupt" and run.cancel_reason == "sweep"
            last = run.events.order_by("-seq").first()
            assert (last.seq, last.kind) == (run.last_seq, "cancelled")
            assert last.data == {"action": "interrupt", "reason": "sweep"}
    assert {t.status for t in Thread.objects.filter(id__in=[t.id for t in threads])} == {
        ThreadStatus.IDLE
    }
    audited = AuditEntry.objects.filter(action=f"cancel_{action}", reason="sweep")
    assert sorted(a.run_id for a in audited) == ids
    # The workers holding them are fenced out.
    for c in claimed:
        with pytest.raises(RunCancelled):
            services.run_save_steps(lease=c.lease, steps=[])
    assert services.runs_cancel_many(action=action, actor=support, status="running").count == 0


def test_bulk_cancel_by_ids_skips_finished_runs(drain, support) -> None:
    thread = make_thread()
    done = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    drain()
    waiting = services.run_create(agent_id="echo", thread_id=thread.id, input=2, actor="t")
    result = services.runs_cancel_many(
        action="interrupt", actor=support, thread_id=thread.id, run_ids=[done.id, waiting.id]
    )
    assert result.interrupted == [waiting.id]
    assert Run.objects.get(id=done.id).status == RunStatus.SUCCESS


def test_bulk_cancel_of_no_ids_cancels_nothing(support) -> None:
    run = services.run_create(agent_id="echo", thread_id=make_thread().id, input=1, actor="t")
    for thread_id in (None, run.thread_id):
        result = services.runs_cancel_many(
            action="interrupt", actor=support, run_ids=[], thread_id=thread_id
        )
        assert result.count == 0
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING
    assert not AuditEntry.objects.exists()


def test_bulk_cancel_refuses_status_with_ids(support) -> None:
    with pytest.raises(ValidationFailed):
        services.runs_cancel_many(action="interrupt", actor=support, status="all", run_ids=[])
    with pytest.raises(ValidationFailed) as err:
        services.runs_cancel_many(action="interrupt", actor=support, status="bogus")
    assert "status" in err.value.detail


# --- multitask strategies --------------------------------------------------------------------------


def test_reject_strategy_conflicts_on_a_busy_thread() -> None:
    thread = make_thread()
    services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    with pytest.raises(Conflict) as err:
        services.run_create(
            agent_id="echo", thread_id=thread.id, input=2, multitask_strategy="reject", actor="t"
        )
    assert err.value.detail == services.REJECT_MESSAGE
    assert Run.objects.filter(thread=thread).count() == 1
    # The refused run was written with its event and document, then rolled back with them.
    assert RunEvent.objects.filter(run__thread=thread).count() == 1
    assert RunSearch.objects.filter(run__thread=thread).count() == 1


def test_interrupt_strategy_cancels_the_in_flight_run() -> None:
    thread = make_thread()
    old = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    new = services.run_create(
        agent_id="echo", thread_id=thread.id, input=2, multitask_strategy="interrupt", actor="t"
    )
    assert Run.objects.get(id=old.id).status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=new.id).status == RunStatus.PENDING


def test_rollback_strategy_deletes_the_in_flight_run() -> None:
    thread = make_thread()
    old = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    services.run_create(
        agent_id="echo", thread_id=thread.id, input=2, multitask_strategy="rollback", actor="t"
    )
    assert not Run.objects.filter(id=old.id).exists()


# --- decisions: conflicts and nesting -------------------------------------------------------------


def test_a_second_decision_names_who_decided(drain, reviewer, reviewer2) -> None:
    run = suspended_refund(drain)
    tc = ToolCall.objects.get(run=run, tool_name="issue_refund")
    services.tool_call_approve(run=run, actor=reviewer, tool_call_id=tc.tool_call_id)
    # the run is no longer suspended; deciding the same call again names the winner
    run.refresh_from_db()
    with pytest.raises(Conflict):
        services.tool_call_decline(run=run, actor=reviewer2, tool_call_id=tc.tool_call_id)
    Run.objects.filter(id=run.id).update(status=RunStatus.SUSPENDED)
    with pytest.raises(AlreadyDecided) as err:
        services.tool_call_decline(run=run, actor=reviewer2, tool_call_id=tc.tool_call_id)
    assert "approved by rita" in err.value.detail


def test_several_waiting_calls_are_decided_separately(drain, reviewer, register_agent) -> None:
    from runs.agents.refund import issue_refund
    from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls

    def script(state):
        if len(state.results) == 2:
            return FinalAnswer(output=[r.result for r in state.results])
        return ToolCalls(
            [
                ProposedCall("issue_refund", {"order_id": "a", "amount": 1}, id="c1"),
                ProposedCall("issue_refund", {"order_id": "b", "amount": 2}, id="c2"),
            ]
        )

    register_agent(Agent(id="double", tools=[issue_refund], model=ScriptedModel(script)))
    run = services.run_create(agent_id="double", thread_id=None, input={}, actor="t")
    drain()
    page = selectors.suspended_runs_for_agent(agent_id="double")
    assert [tc.tool_call_id for tc in page.items[0].waiting_tool_calls] == ["c1", "c2"]
    with pytest.raises(Conflict) as err:
        services.tool_call_approve(run=run, actor=reviewer)
    assert err.value.extra["pending_tool_call_ids"] == ["c1", "c2"]
    services.tool_call_approve(run=run, actor=reviewer, tool_call_id="c1")
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED  # c2 still waits
    services.tool_call_decline(run=run, actor=reviewer, tool_call_id="c2", reason="no")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output[0]["refunded"] is True and run.output[1] == {"declined": True, "reason": "no"}


def _support_run(drain):
    run = services.run_create(
        agent_id="support",
        thread_id=make_thread().id,
        input={"message": "charged twice", "order_id": "A-9", "amount": 40.0},
        actor="t",
    )
    drain()
    run.refresh_from_db()
    child = Run.objects.get(parent_run=run)
    return run, child


def test_a_sub_agent_suspension_suspends_the_supervisor_on_the_delegation_call(drain) -> None:
    run, child = _support_run(drain)
    assert run.status == child.status == RunStatus.SUSPENDED
    outer = selectors.suspended_runs_for_agent(agent_id="support")
    inner = selectors.suspended_runs_for_agent(agent_id="billing")
    assert [r.id for r in outer.items] == [run.id]
    assert [r.id for r in inner.items] == [child.id]
    delegation = outer.items[0].waiting_tool_calls[0]
    assert delegation.tool_name == "ask_billing" and delegation.requires_approval
    assert delegation.suspend_payload["tool_calls"][0]["tool_name"] == "issue_refund"
    assert inner.items[0].waiting_tool_calls[0].tool_name == "issue_refund"


def test_deciding_the_supervisor_carries_down_to_the_sub_agent(drain, reviewer) -> None:
    run, child = _support_run(drain)
    services.tool_call_approve(run=run, actor=reviewer, args={"order_id": "A-9", "amount": 30.0})
    drain()
    run.refresh_from_db()
    child.refresh_from_db()
    assert run.status == child.status == RunStatus.SUCCESS
    assert child.output == {"refunded": True, "order_id": "A-9", "amount": 30.0}
    assert run.output["billing"] == child.output


def test_deciding_the_sub_agent_directly_releases_the_supervisor(drain, reviewer) -> None:
    run, child = _support_run(drain)
    services.tool_call_decline(run=child, actor=reviewer, reason="fraud suspected")
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["billing"] == {"refunded": False, "reason": "fraud suspected"}


# --- thread resume (LangGraph command.resume) -----------------------------------------------------


def test_thread_resume_approves_the_waiting_call(drain, reviewer) -> None:
    thread = make_thread()
    run = suspended_refund(drain, thread)
    resumed = services.thread_resume(thread_id=thread.id, resume={"approved": True}, actor=reviewer)
    assert resumed.id == run.id and resumed.status == RunStatus.PENDING


def test_thread_resume_without_a_suspended_run_conflicts() -> None:
    with pytest.raises(Conflict) as err:
        services.thread_resume(thread_id=make_thread().id, resume={"approved": True}, actor="t")
    assert err.value.code == "nothing_to_resume"


def test_thread_resume_of_a_thread_missing_or_out_of_scope_is_not_found(drain, reviewer) -> None:
    import uuid

    thread = make_thread()
    assert thread.resource_id == "acme"
    run = suspended_refund(drain, thread)
    with pytest.raises(NotFound) as err:
        services.thread_resume(thread_id=uuid.uuid4(), resume={"approved": True}, actor="t")
    assert err.value.code == "thread_not_found"
    with pytest.raises(NotFound):
        services.thread_resume(
            thread_id=thread.id, resume={"approved": True}, actor="t", pinned_resource_id="zeta"
        )
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED
    resumed = services.thread_resume(
        thread_id=thread.id, resume={"approved": True}, actor=reviewer, pinned_resource_id="acme"
    )
    assert resumed.id == run.id and resumed.status == RunStatus.PENDING


@pytest.mark.postgres
def test_thread_resume_is_two_statements_on_postgresql(drain, reviewer) -> None:
    """The thread, its suspended run and the run's waiting calls locked and read in one
    statement (no read of the thread before, none of the calls after), then every write in
    one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    thread = make_thread()
    run = suspended_refund(drain, thread)
    with CaptureQueriesContext(connection) as queries:
        services.run_create(
            agent_id="refund",
            thread_id=thread.id,
            command={"resume": {"approved": True}},
            actor=reviewer,
        )
    statements = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) == 2, [sql[:80] for sql in statements]
    assert statements[0].startswith("WITH t AS MATERIALIZED")
    assert "FROM runs_toolcall" in statements[0]
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_resume_without_a_webhook_is_one_transaction_without_a_savepoint(drain) -> None:
    from django.test.utils import CaptureQueriesContext

    thread = make_thread()
    run = suspended_refund(drain, thread)
    with CaptureQueriesContext(connection) as queries:
        services.run_create(
            agent_id="refund",
            thread_id=thread.id,
            command={"resume": {"approved": True}},
            actor="t",
        )
    statements = [q["sql"] for q in queries]
    assert not [sql for sql in statements if "SAVEPOINT" in sql], statements
    assert len(statements) == 4, statements  # BEGIN, the locks and calls, the writes, COMMIT
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


def test_thread_resume_validates_the_approval_value(drain) -> None:
    thread = make_thread()
    suspended_refund(drain, thread)
    with pytest.raises(ValidationFailed):
        services.thread_resume(thread_id=thread.id, resume="yes", actor="t")


# --- bad input ------------------------------------------------------------------------------------


def test_unknown_ids_are_not_found() -> None:
    import uuid

    ghost = Run(id=uuid.uuid4(), agent_id="echo")
    with pytest.raises(NotFound):
        services.run_cancel(run=ghost, action="interrupt", actor="t")
    with pytest.raises(NotFound):
        services.tool_call_approve(run=ghost, actor="t")
    with pytest.raises(NotFound):
        services.run_create(agent_id="nope", thread_id=None, input={}, actor="t")
    with pytest.raises(NotFound):
        services.run_create(agent_id="echo", thread_id=uuid.uuid4(), input={}, actor="t")
    assert not Run.objects.exists()


def test_wrong_states_and_values_are_refused(drain, reviewer) -> None:
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    with pytest.raises(ValidationFailed):
        services.run_cancel(run=run, action="explode", actor="t")
    with pytest.raises(Conflict) as err:
        services.tool_call_approve(run=run, actor=reviewer)
    assert "pending, not suspended" in err.value.detail
    with pytest.raises(ValidationFailed):
        services.run_create(agent_id="refund", thread_id=None, input={"order_id": "x"}, actor="t")
    with pytest.raises(ValidationFailed):
        services.run_create(
            agent_id="echo", thread_id=None, input=1, multitask_strategy="yolo", actor="t"
        )
    suspended = suspended_refund(drain)
    with pytest.raises(ValidationFailed) as err:
        services.tool_call_approve(
            run=suspended, actor=reviewer, args={"order_id": "A-1", "amount": -5}
        )
    assert err.value.errors[0]["field"] == "args.amount"
    with pytest.raises(NotFound):
        services.tool_call_approve(run=suspended, actor=reviewer, tool_call_id="nope")
    assert Run.objects.get(id=suspended.id).status == RunStatus.SUSPENDED
    assert not AuditEntry.objects.exists()


def test_pinned_resource_hides_other_threads(drain) -> None:
    other = make_thread(resource_id="globex")
    run = services.run_create(agent_id="echo", thread_id=other.id, input=1, actor="t")
    with pytest.raises(NotFound):
        services.run_cancel(run=run, action="interrupt", actor="k", pinned_resource_id="acme")
    with pytest.raises(NotFound):
        services.run_create(
            agent_id="echo", thread_id=other.id, input=1, actor="k", pinned_resource_id="acme"
        )
    mine = services.thread_create(metadata={"resource_id": "evil"}, pinned_resource_id="acme")
    assert mine.resource_id == "acme"
