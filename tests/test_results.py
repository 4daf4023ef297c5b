"""`selectors.run_outcome`: what a wait, join or cancel(wait) answers, in one read."""

from __future__ import annotations

import pytest

from runs import selectors, services
from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def test_a_run_that_is_going_has_no_outcome_yet(django_assert_num_queries) -> None:
    thread = services.thread_create()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input={"a": 1}, actor="t")

    with django_assert_num_queries(1):
        assert selectors.run_outcome(run.id, thread_id=thread.id) == ("pending", 0, None)


def test_a_finished_run_answers_with_its_last_state(drain, django_assert_num_queries) -> None:
    thread = services.thread_create()
    first = services.run_create(agent_id="echo", thread_id=thread.id, input="one", actor="t")
    drain()
    second = services.run_create(agent_id="echo", thread_id=thread.id, input="two", actor="t")
    drain()

    with django_assert_num_queries(1):
        status, attempt, result = selectors.run_outcome(second.id, thread_id=thread.id)
    assert (status, attempt) == ("success", 1)
    assert result["output"] == {"echo": "two"}
    # Each run answers with its own newest checkpoint, not the thread's.
    assert selectors.run_result(first.id, thread_id=thread.id)["output"] == {"echo": "one"}


def test_a_failed_run_answers_with_its_error_and_not_its_state() -> None:
    thread = services.thread_create()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    Run.objects.filter(id=run.id).update(
        status=RunStatus.ERROR, error={"error": "ValueError", "message": "bad input"}
    )
    assert selectors.run_result(run.id) == {
        "__error__": {"error": "ValueError", "message": "bad input"}
    }
    Run.objects.filter(id=run.id).update(status=RunStatus.TIMEOUT, error=None)
    assert selectors.run_result(run.id) == {
        "__error__": {"error": "Error", "message": "run ended timeout"}
    }


def test_a_suspended_run_answers_with_its_interrupts_in_two_reads(
    drain, django_assert_num_queries
) -> None:
    thread = services.thread_create()
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "O-1", "amount": 30}, actor="t"
    )
    drain()

    # The run, then its waiting calls with their run (not one more read per call).
    with django_assert_num_queries(2):
        status, _, result = selectors.run_outcome(run.id, thread_id=thread.id)
    assert status == "suspended"
    [interrupt] = result["__interrupt__"]
    assert interrupt["value"]["tool_name"] == "issue_refund"
    assert interrupt["value"]["args"]["order_id"] == "O-1"


def test_a_rolled_back_run_answers_with_its_threads_reverted_state(drain) -> None:
    thread = services.thread_create()
    services.run_create(agent_id="echo", thread_id=thread.id, input="kept", actor="t")
    drain()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input="gone", actor="t")
    services.run_cancel(run=run, action="rollback", actor="t")

    status, _, result = selectors.run_outcome(run.id, thread_id=thread.id)
    assert status is None
    assert result["output"] == {"echo": "kept"}
    assert selectors.run_outcome(run.id) == (None, 0, {})


def test_a_join_reads_the_run_with_its_outcome_in_one_statement(
    drain, django_assert_num_queries
) -> None:
    thread = services.thread_create()
    done = services.run_create(agent_id="echo", thread_id=thread.id, input="one", actor="t")
    drain()
    going = services.run_create(agent_id="echo", thread_id=thread.id, input="two", actor="t")

    with django_assert_num_queries(1):
        run, outcome = selectors.run_with_outcome(going.id, thread_id=thread.id)
    assert run.id == going.id and run.status == "pending"
    assert outcome == selectors.run_outcome(going.id, thread_id=thread.id) == ("pending", 0, None)

    with django_assert_num_queries(1):
        run, outcome = selectors.run_with_outcome(done.id, thread_id=thread.id)
    assert run.id == done.id and run.input == "one"
    assert outcome == selectors.run_outcome(done.id, thread_id=thread.id)
    assert outcome[:2] == ("success", 1) and outcome[2]["output"] == {"echo": "one"}


def test_a_join_of_a_failed_or_suspended_run_answers_as_run_outcome_does(drain) -> None:
    thread = services.thread_create()
    failed = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
    Run.objects.filter(id=failed.id).update(
        status=RunStatus.ERROR, error={"error": "ValueError", "message": "bad input"}
    )
    _, outcome = selectors.run_with_outcome(failed.id, thread_id=thread.id)
    assert outcome == selectors.run_outcome(failed.id, thread_id=thread.id)
    assert outcome[2] == {"__error__": {"error": "ValueError", "message": "bad input"}}
    Run.objects.filter(id=failed.id).update(status=RunStatus.TIMEOUT, error=None)
    _, outcome = selectors.run_with_outcome(failed.id, thread_id=thread.id)
    assert outcome[2] == {"__error__": {"error": "Error", "message": "run ended timeout"}}

    other = services.thread_create()
    parked = services.run_create(
        agent_id="refund", thread_id=other.id, input={"order_id": "O-2", "amount": 30}, actor="t"
    )
    drain()
    run, outcome = selectors.run_with_outcome(parked.id, thread_id=other.id)
    assert run.status == outcome[0] == "suspended"
    assert outcome == selectors.run_outcome(parked.id, thread_id=other.id)
    [interrupt] = outcome[2]["__interrupt__"]
    assert interrupt["value"]["args"]["order_id"] == "O-2"


def test_a_join_of_a_run_on_another_thread_or_outside_the_callers_scope_is_not_found() -> None:
    from runs.exceptions import NotFound

    thread = services.thread_create(pinned_resource_id="tenant-a")
    run = services.run_create(
        agent_id="echo", thread_id=thread.id, input=1, actor="t", pinned_resource_id="tenant-a"
    )
    elsewhere = services.thread_create()

    found, outcome = selectors.run_with_outcome(
        run.id, thread_id=thread.id, pinned_resource_id="tenant-a"
    )
    assert (found.id, outcome) == (run.id, ("pending", 0, None))
    for thread_id, pinned in ((elsewhere.id, None), (thread.id, "tenant-b")):
        with pytest.raises(NotFound) as refused:
            selectors.run_with_outcome(run.id, thread_id=thread_id, pinned_resource_id=pinned)
        assert refused.value.code == "run_not_found"
