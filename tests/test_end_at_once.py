"""A run's end in one round trip on PostgreSQL (services/finish.py, `_end_at_once`): BEGIN, the
thread's lock, the end with the run's search document built from what its worker holds, and
COMMIT; the two round trips (the thread locked while the document's source is read, then the
end) wherever the database does not hold what the worker does."""

from __future__ import annotations

import threading
import time
from typing import Any
from uuid import UUID

import pytest
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.engine import Agent, FinalAnswer, ScriptedModel
from runs.exceptions import LeaseLost
from runs.ids import uuid7
from runs.models import Checkpoint, Run, RunEvent, RunSearch, RunStatus, Thread
from tests.test_lazy_begin import round_trips, traced
from tests.test_services import claim_one, expire_lease

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# Only the two round trips read the document's source, under a lock of the thread they name.
_SOURCE_READ = "FOR NO KEY UPDATE OF t"


def _transactions(sent: list[str]) -> list[int]:
    """For each transaction traced (`traced`), how many round trips from its BEGIN to its
    COMMIT (statements that commit alone, as a claim, are none)."""
    counts, open_at = [], None
    for n, trip in enumerate(round_trips(sent)):
        if open_at is None and any('"BEGIN"' in m for m in trip):
            open_at = n
        if open_at is not None and any('"COMMIT"' in m for m in trip):
            counts.append(n - open_at + 1)
            open_at = None
    return counts


def _reads_the_source(work: Any) -> bool:
    """Whether `work()` read a run's document source under its thread's lock (the two round
    trips), by the statements it sent (each is written out there, prepared or not)."""
    with CaptureQueriesContext(connection) as sent:
        work()
    return any(_SOURCE_READ in q["sql"] for q in sent.captured_queries)


def _without_ids(kind: str, data: Any) -> Any:
    if kind == "started":
        return None
    return {k: v for k, v in data.items() if k != "checkpoint_id"}


def _written(run_id: UUID) -> dict[str, Any]:
    """What a run's end left for the run and its thread (ids and times aside)."""
    run = Run.objects.get(id=run_id)
    thread = Thread.objects.get(id=run.thread_id)
    return {
        "run": (run.status, run.output, run.error, run.last_seq, run.lease_owner),
        "events": [  # (the claim's names its worker; a step's, its checkpoint's id)
            (e.seq, e.kind, _without_ids(e.kind, e.data), e.actor)
            for e in RunEvent.objects.filter(run_id=run_id)
        ],
        "checkpoints": [
            (c.step, c.values, c.pending) for c in Checkpoint.objects.filter(run_id=run_id)
        ],
        "document": RunSearch.objects.get(run_id=run_id).document,
        "thread": (thread.status, thread.values, thread.metadata),
    }


def _document_read_afresh(run_id: UUID) -> str:
    services.search_refresh(run_ids=[run_id])
    return RunSearch.objects.get(run_id=run_id).document


def test_an_echo_runs_end_is_one_round_trip_and_writes_what_the_two_write(
    drain: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    metadata = {"zeta": "last", "team": {"yy": [1, "two"], "b": True}}
    at_once = services.thread_create(metadata=metadata)
    run = services.run_create(
        agent_id="echo", thread_id=at_once.id, input={"text": "hello"}, actor="t"
    )
    with traced() as sent:
        assert drain() == 1
    # The claim commits alone; the end's BEGIN, lock, statement and COMMIT go in one trip.
    assert _transactions(sent) == [1], round_trips(sent)

    # The same run ended by the two round trips writes the same.
    two = services.thread_create(metadata=metadata)
    other = services.run_create(
        agent_id="echo", thread_id=two.id, input={"text": "hello"}, actor="t"
    )
    monkeypatch.setattr(services, "source_in_hand", lambda run, calls: None)
    with traced() as sent:
        assert drain() == 1
    assert _transactions(sent) == [2], round_trips(sent)
    assert _written(run.id) == _written(other.id)
    assert _written(run.id)["run"][0] == RunStatus.SUCCESS
    assert "zeta last" in _written(run.id)["document"]
    assert _written(run.id)["document"] == _document_read_afresh(run.id)


def test_metadata_changed_while_the_run_ran_takes_the_two_round_trips(
    drain: Any, register_agent: Any
) -> None:
    """The worker holds the metadata its claim read; the end finds other metadata and writes
    nothing, and the two round trips write the document of what the thread holds now."""

    def script(state: Any) -> FinalAnswer:
        run = Run.objects.get(id=state.input["run"])
        services.thread_update(thread=run.thread, metadata={"team": "renamed"})
        return FinalAnswer(output={"done": True})

    register_agent(Agent(id="renames_its_thread", tools=[], model=ScriptedModel(script)))
    thread = services.thread_create(metadata={"team": "first"})
    run = services.run_create(
        agent_id="renames_its_thread", thread_id=thread.id, input={}, actor="t"
    )
    Run.objects.filter(id=run.id).update(input={"run": str(run.id)})
    assert _reads_the_source(lambda: drain() == 1)
    row = _written(run.id)
    assert row["run"][0] == RunStatus.SUCCESS and row["run"][1] == {"done": True}
    assert "team renamed" in row["document"] and "team first" not in row["document"]
    assert row["document"] == _document_read_afresh(run.id)
    assert [kind for _, kind, _, _ in row["events"]].count("finished") == 1


def test_a_resumed_run_with_its_calls_ends_in_one_round_trip(
    drain: Any, register_agent: Any, reviewer: Any
) -> None:
    """A model that calls out has every outcome written before it is asked: the end holds
    nothing, and its document lists the run's calls as the worker holds them."""
    from tests.test_engine_writes import _refund_agent

    register_agent(_refund_agent("refund_remote", in_process=False))
    thread = services.thread_create(metadata={"desk": "refunds"})
    run = services.run_create(
        agent_id="refund_remote",
        thread_id=thread.id,
        input={"order_id": "B1", "amount": 5},
        actor="t",
    )
    drain()
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED
    services.tool_call_approve(
        run=Run.objects.get(id=run.id), actor=reviewer, args={"order_id": "B1", "amount": 4}
    )
    assert not _reads_the_source(drain)
    row = _written(run.id)
    assert row["run"][0] == RunStatus.SUCCESS
    assert "tool issue_refund" in row["document"] and "amount 4" in row["document"]
    assert row["document"] == _document_read_afresh(run.id)


@pytest.mark.parametrize("in_hand", [True, False])
def test_a_lost_lease_writes_nothing_and_is_raised(in_hand: bool) -> None:
    """Either way, the lease is found lost after the end's transaction (whose COMMIT went with
    its statement: nothing may be asked in it after that), and raised as such."""
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    old = claim_one("zombie")
    expire_lease(run)
    services.runs_reap()
    claim_one("fresh")
    source = services.source_in_hand(old.run, []) if in_hand else None
    assert (source is not None) == in_hand
    with pytest.raises(LeaseLost):
        services.run_finish(
            lease=old.lease, status=RunStatus.SUCCESS, output={"late": True}, source=source
        )
    row = Run.objects.get(id=run.id)
    assert row.status == RunStatus.RUNNING and row.output is None
    assert not RunEvent.objects.filter(run_id=run.id, kind="finished").exists()


def test_a_run_queued_while_the_end_waits_for_the_thread_keeps_it_busy() -> None:
    """The end's statement follows its lock of the thread: a run queued on the thread by a
    transaction that held the lock first is seen, and the thread stays busy for it."""
    thread = services.thread_create(metadata={})
    run = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    [claimed] = services.run_claim(owner="w", limit=1)
    locked, queued = threading.Event(), []

    def queue_behind_a_lock() -> None:
        try:
            with transaction.atomic():
                Thread.objects.select_for_update(no_key=True).get(id=thread.id)
                locked.set()
                time.sleep(0.5)  # the end waits for the lock meanwhile
                queued.append(
                    Run.objects.create(
                        thread_id=thread.id, agent_id="echo", input=2, status=RunStatus.PENDING
                    )
                )
        finally:
            close_old_connections()

    other = threading.Thread(target=queue_behind_a_lock)
    other.start()
    assert locked.wait(10)
    source = services.source_in_hand(claimed.run, [])
    assert source is not None
    values = {"messages": [], "output": {"echo": 1}}
    assert not _reads_the_source(
        lambda: services.run_finish(
            lease=claimed.lease,
            status=RunStatus.SUCCESS,
            output={"echo": 1},
            values=values,
            steps=[services.StepWrite(uuid7(), 0, values, [], None)],
            source=source,
        )
    )
    other.join(10)
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS
    assert Run.objects.get(id=queued[0].id).status == RunStatus.PENDING
    assert Thread.objects.get(id=thread.id).status == "busy"


def test_a_run_not_read_by_a_claim_has_no_source_in_hand() -> None:
    """`source_in_hand` needs the thread's metadata as a PostgreSQL claim reads it: a run read
    otherwise (as SQLite's claim reads it) has none, and its end reads the source under the
    thread's lock."""
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    assert services.source_in_hand(Run.objects.get(id=run.id), []) is None
    [claimed] = services.run_claim(owner="w", limit=1)
    assert services.source_in_hand(claimed.run, []) is not None


def test_a_resumed_run_ends_with_its_held_outcome_in_one_round_trip(
    drain: Any, reviewer: Any
) -> None:
    """The refund agent's model decides in process: the refund's outcome is held for the end,
    which writes it in its own round trip, behind the thread's lock."""
    thread = services.thread_create(metadata={"desk": "refunds"})
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "C1", "amount": 3}, actor="t"
    )
    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    with traced() as sent:
        assert drain() == 1
    # The claim commits alone (it marks the approved call); the end is one round trip.
    assert _transactions(sent) == [1], round_trips(sent)
    row = _written(run.id)
    assert row["run"][0] == RunStatus.SUCCESS
    assert "result issue_refund" in row["document"]
    assert row["document"] == _document_read_afresh(run.id)
    [refund] = Run.objects.get(id=run.id).tool_calls.filter(tool_name="issue_refund")
    assert refund.status == "succeeded" and refund.result is not None


@pytest.mark.parametrize("announced", ["rule", "webhook"])
def test_an_end_with_deliveries_takes_the_two_round_trips_and_writes_them(
    drain: Any, settings: Any, announced: str
) -> None:
    from runs.models import Delivery, NotificationRule

    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = True
    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    if announced == "rule":
        NotificationRule.objects.create(
            name="ends", agent_id="echo", events=["success"], webhook_url="https://hooks.test/x"
        )
    else:
        Run.objects.filter(id=run.id).update(webhook="https://hooks.test/run")
    assert _reads_the_source(lambda: drain() == 1)
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS
    assert Delivery.objects.filter(run_id=run.id).count() == 1


def test_held_writes_behind_a_source_that_changed_roll_back_and_are_made_once(
    reviewer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end with a held outcome finds the thread's metadata changed since the claim: its
    statement fails, the outcome written before it in the same round trip rolls back with it,
    and the two round trips write the outcome once, with the document of what the thread holds
    now."""
    thread = services.thread_create(metadata={"desk": "refunds"})
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "D1", "amount": 2}, actor="t"
    )
    from runs.engine.worker import drain

    drain()
    services.tool_call_approve(run=Run.objects.get(id=run.id), actor=reviewer)
    [claimed] = services.run_claim(owner="w", limit=1)
    _, calls = claimed.run.resumed_from
    [refund] = [tc for tc in calls if tc.tool_name == "issue_refund"]
    source = services.source_in_hand(claimed.run, calls)
    assert source is not None
    services.thread_update(thread=Thread.objects.get(id=thread.id), metadata={"desk": "moved"})
    result = {"refunded": 2}
    refund.status, refund.result = "succeeded", result
    outcome = services.ToolOutcome(
        tool_call=refund,
        status="succeeded",
        result=result,
        event=("tool_result", {"tool_call_id": refund.tool_call_id, "result": result}, "system"),
    )
    values = {"messages": [], "output": {"done": True}}
    from runs.services import finish

    two_round_trips = []
    real = finish._end_in_transaction
    monkeypatch.setattr(
        finish, "_end_in_transaction", lambda *a: two_round_trips.append(1) or real(*a)
    )
    services.run_finish(
        lease=claimed.lease,
        status=RunStatus.SUCCESS,
        output={"done": True},
        values=values,
        steps=[services.StepWrite(uuid7(), 9, values, [], None)],
        events=[("tool_result", {"tool_call_id": refund.tool_call_id}, "system")],
        held=services.HeldWrites(outcome=outcome),
        source=source,
    )
    assert two_round_trips == [1]  # (after the one round trip failed and rolled back)
    row = _written(run.id)
    assert row["run"][0] == RunStatus.SUCCESS
    assert "desk moved" in row["document"] and "refunded 2" in row["document"]
    assert row["document"] == _document_read_afresh(run.id)
    stored = Run.objects.get(id=run.id).tool_calls.get(tool_name="issue_refund")
    assert (stored.status, stored.result) == ("succeeded", result)
    assert [kind for _, kind, _, _ in row["events"]].count("finished") == 1
