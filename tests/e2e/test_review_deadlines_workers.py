"""Review deadlines carried out by real `runagents` processes on PostgreSQL: two workers reap
at once, each overdue call gets its action exactly once, and the run goes on from there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runs import services
from runs.models import AuditEntry, Run, RunEvent, RunStatus, ToolCall
from tests.e2e.deadline_agents import AGENTS
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

WORKER_ENV = {
    "RUNS_AGENTS": "runs.agents.BUILTIN_AGENTS,tests.e2e.deadline_agents.AGENTS",
    "RUNS_REAPER_SECONDS": "0.2",
    "RUNS_POLL_SECONDS": "0.2",
}


@pytest.fixture
def deadline_agents(register_agent: Callable[[Any], Any]) -> None:
    for agent in AGENTS:  # this process creates the runs; the workers run them
        register_agent(agent)


def start(agent_id: str, n: int) -> list[Run]:
    runs = []
    for _ in range(n):
        thread = services.thread_create(metadata={})
        runs.append(
            services.run_create(agent_id=agent_id, thread_id=thread.id, input={}, actor="t")
        )
    return runs


def statuses(runs: list[Run]) -> set[str]:
    return set(Run.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


def test_two_workers_carry_out_each_deadline_once(deadline_agents, start_worker) -> None:
    start_worker(concurrency=2, **WORKER_ENV)
    start_worker(concurrency=2, **WORKER_ENV)
    declined = start("deadline_decline", 4)
    cancelled = start("deadline_cancel", 3)
    marked = start("deadline_mark", 2)
    everything = declined + cancelled + marked

    # Declined: the run continues with the decline and ends with its reason.
    wait_for(lambda: statuses(declined) == {RunStatus.SUCCESS}, timeout=60)
    wait_for(lambda: statuses(cancelled) == {RunStatus.INTERRUPTED}, timeout=60)
    wait_for(
        lambda: RunEvent.objects.filter(run__in=marked, kind="review_overdue").count() == 2,
        timeout=60,
    )

    for run in Run.objects.filter(id__in=[r.id for r in declined]):
        assert run.output == {"paid": False, "reason": "Nobody approved the payment in time."}
    ids = [r.id for r in everything]
    decline_audits = AuditEntry.objects.filter(run_id__in=ids, action="decline")
    cancel_audits = AuditEntry.objects.filter(run_id__in=ids, action="cancel_interrupt")
    assert decline_audits.count() == 4
    assert cancel_audits.count() == 3
    assert set(decline_audits.values_list("actor", flat=True)) == {"system:deadline"}
    assert set(cancel_audits.values_list("actor", flat=True)) == {"system:deadline"}
    # Exactly one overdue event per call, whichever worker's reaper got there first.
    per_run = [RunEvent.objects.filter(run_id=i, kind="review_overdue").count() for i in ids]
    assert per_run == [1] * len(ids)
    # Marked only: still waiting for a human, shown overdue.
    assert statuses(marked) == {RunStatus.SUSPENDED}
    assert all(tc.review_expired_at for tc in ToolCall.objects.filter(run__in=marked))


def test_a_human_decision_before_the_deadline_wins(deadline_agents, reviewer, start_worker) -> None:
    (run,) = start("deadline_decline", 1)
    start_worker(concurrency=1, **{**WORKER_ENV, "RUNS_REAPER_SECONDS": "30"})
    wait_for(lambda: statuses([run]) == {RunStatus.SUSPENDED}, timeout=30)

    services.tool_call_approve(run=run, actor=reviewer)

    wait_for(lambda: statuses([run]) == {RunStatus.SUCCESS}, timeout=30)
    assert Run.objects.get(id=run.id).output == {"paid": True}
    assert not AuditEntry.objects.filter(run_id=run.id, actor="system:deadline").exists()
