"""Suspended-run listing (Mastra's listSuspendedRuns contract): filters, pagination, scope."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import selectors, services
from runs.exceptions import ValidationFailed
from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def suspended(drain):
    """Five suspended refund runs on two resources, plus noise that must not show.

    One thread each: a run waiting for a human holds its thread, so a second run would queue.
    """
    acme = services.thread_create(metadata={"resource_id": "acme"})
    acme2 = services.thread_create(metadata={"resource_id": "acme"})
    globex = services.thread_create(metadata={"resource_id": "globex"})
    globex2 = services.thread_create(metadata={"resource_id": "globex"})
    runs = []
    for i, thread in enumerate([acme, acme2, globex, globex2, None]):
        runs.append(
            services.run_create(
                agent_id="refund",
                thread_id=thread.id if thread else None,
                input={"order_id": f"O-{i}", "amount": 10 + i},
                actor="t",
            )
        )
        drain()
    # noise: a finished refund run, a suspended run of another agent
    services.run_create(agent_id="weather", thread_id=None, input={}, actor="t")
    done = services.run_create(
        agent_id="refund", thread_id=None, input={"order_id": "X", "amount": 1}, actor="t"
    )
    drain()
    services.tool_call_approve(run=done, actor="t")
    drain()
    # spread suspension and creation times so ordering and date filters are meaningful
    base = timezone.now() - timedelta(days=10)
    for i, run in enumerate(runs):
        Run.objects.filter(id=run.id).update(
            created_at=base + timedelta(days=i), suspended_at=base + timedelta(days=i, hours=1)
        )
    return {"acme": acme, "globex": globex, "runs": runs, "base": base}


def ids(page) -> list:
    return [r.id for r in page.items]


def test_it_lists_newest_suspension_first_with_tool_calls(suspended) -> None:
    page = selectors.suspended_runs_for_agent(agent_id="refund")
    assert page.total == 5
    assert ids(page) == [r.id for r in reversed(suspended["runs"])]
    row = page.items[0]
    assert row.status == RunStatus.SUSPENDED
    [tc] = row.waiting_tool_calls
    assert (tc.tool_name, tc.requires_approval, tc.args) == (
        "issue_refund",
        True,
        {"order_id": "O-4", "amount": 14},
    )


def test_it_filters_by_thread_resource_and_dates(suspended) -> None:
    runs, base = suspended["runs"], suspended["base"]
    assert ids(
        selectors.suspended_runs_for_agent(agent_id="refund", thread_id=suspended["acme"].id)
    ) == [runs[0].id]
    assert ids(selectors.suspended_runs_for_agent(agent_id="refund", resource_id="globex")) == [
        runs[3].id,
        runs[2].id,
    ]
    page = selectors.suspended_runs_for_agent(
        agent_id="refund", from_date=base + timedelta(days=1), to_date=base + timedelta(days=3)
    )
    assert ids(page) == [runs[3].id, runs[2].id, runs[1].id]  # inclusive bounds on created_at
    assert (
        selectors.suspended_runs_for_agent(
            agent_id="refund", from_date=base + timedelta(days=30)
        ).total
        == 0
    )


def test_it_paginates_only_when_both_page_and_per_page_are_given(suspended) -> None:
    runs = list(reversed(suspended["runs"]))
    page0 = selectors.suspended_runs_for_agent(agent_id="refund", per_page=2, page=0)
    page2 = selectors.suspended_runs_for_agent(agent_id="refund", per_page=2, page=2)
    beyond = selectors.suspended_runs_for_agent(agent_id="refund", per_page=2, page=3)
    assert (ids(page0), page0.total) == ([r.id for r in runs[:2]], 5)
    assert (ids(page2), page2.total) == ([runs[4].id], 5)
    assert (ids(beyond), beyond.total) == ([], 5)
    assert len(selectors.suspended_runs_for_agent(agent_id="refund", per_page=2).items) == 5


def test_ties_on_suspension_time_are_broken_by_run_id(suspended) -> None:
    same = timezone.now()
    Run.objects.filter(agent_id="refund", status="suspended").update(suspended_at=same)
    page = selectors.suspended_runs_for_agent(agent_id="refund")
    assert ids(page) == sorted(ids(page), reverse=True)


@pytest.mark.parametrize(
    ("per_page", "page", "field"),
    [
        (0, 0, "per_page"),
        (-1, 0, "per_page"),
        (1.5, 0, "per_page"),
        (True, 0, "per_page"),
        ("x", 0, "per_page"),
        (2, -1, "page"),
        (2, 0.5, "page"),
        (2001, 0, "per_page"),
    ],
)
def test_it_rejects_invalid_pagination(suspended, per_page, page, field) -> None:
    with pytest.raises(ValidationFailed) as err:
        selectors.suspended_runs_for_agent(agent_id="refund", per_page=per_page, page=page)
    assert err.value.errors[0]["field"] == field


def test_it_rejects_from_date_after_to_date(suspended) -> None:
    now = timezone.now()
    with pytest.raises(ValidationFailed):
        selectors.suspended_runs_for_agent(
            agent_id="refund", from_date=now, to_date=now - timedelta(days=1)
        )


def test_scope_supervisor_sees_its_outer_run_sub_agent_its_inner_run(drain) -> None:
    run = services.run_create(
        agent_id="support",
        thread_id=None,
        input={"message": "m", "order_id": "S", "amount": 5},
        actor="t",
    )
    drain()
    child = Run.objects.get(parent_run=run)
    assert ids(selectors.suspended_runs_for_agent(agent_id="support")) == [run.id]
    assert ids(selectors.suspended_runs_for_agent(agent_id="billing")) == [child.id]
    assert selectors.suspended_runs_for_agent(agent_id="refund").total == 0


def test_a_pinned_resource_always_wins(suspended) -> None:
    page = selectors.suspended_runs_for_agent(
        agent_id="refund", resource_id="acme", pinned_resource_id="globex"
    )
    assert page.total == 0
    assert (
        selectors.suspended_runs_for_agent(agent_id="refund", pinned_resource_id="globex").total
        == 2
    )


def test_it_lists_in_a_constant_number_of_queries(suspended, django_assert_num_queries) -> None:
    with django_assert_num_queries(3):  # count, page, waiting tool calls
        page = selectors.suspended_runs_for_agent(agent_id="refund", per_page=10, page=0)
        for run in page.items:
            [tc.tool_name for tc in run.waiting_tool_calls]
    with django_assert_num_queries(2):  # all rows, waiting tool calls
        page = selectors.suspended_runs_for_agent(agent_id="refund")
        for run in page.items:
            [tc.tool_name for tc in run.waiting_tool_calls]


def test_runs_for_agent_filters_by_status(suspended) -> None:
    assert selectors.runs_for_agent(agent_id="refund", status="success").total == 1
    assert selectors.runs_for_agent(agent_id="refund", status="running,suspended").total == 5
    with pytest.raises(ValidationFailed) as err:
        selectors.runs_for_agent(agent_id="refund", status="sleeping")
    assert "sleeping" in err.value.detail


def test_counts_are_each_querysets_count_in_one_statement(
    suspended, django_assert_num_queries
) -> None:
    by_status = Run.objects.filter(status=RunStatus.SUSPENDED)
    acme = Run.objects.filter(resource_id="acme").order_by("-created_at")
    nothing = Run.objects.filter(agent_id="no-such-agent")
    expected = [by_status.count(), acme.count(), nothing.count(), Run.objects.count()]
    assert expected[0] == 6 and expected[1] == 2 and expected[2] == 0
    with django_assert_num_queries(1):
        assert selectors.counts(by_status, acme, nothing, Run.objects.all()) == expected
