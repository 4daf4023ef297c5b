"""A claim walks the queue in its order and stops at what it claims.

On PostgreSQL the claim reads the pending runs one step of the queue's index at a time, each
run by its row version, and stops at the LIMIT. Before, the planner (with statistics from
before a burst) read every pending run, checked each and sorted them: one claim took 20-580 ms
with 4,000 queued runs on a table with history (bench/engine.py figures in docs/benchmarks.md).
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from runs import services
from runs.models import Run, RunEvent, RunStatus, Thread

pytestmark = pytest.mark.django_db


def queued(n: int) -> list[Run]:
    """n pending echo runs, each on its own thread, oldest first (as a burst queues them)."""
    now = timezone.now()
    threads = Thread.objects.bulk_create([Thread(status="busy", metadata={}) for _ in range(n)])
    runs = Run.objects.bulk_create(
        [
            Run(thread=t, agent_id="echo", input={"i": i}, status=RunStatus.PENDING, last_seq=1)
            for i, t in enumerate(threads)
        ]
    )
    RunEvent.objects.bulk_create(
        [RunEvent(run=r, seq=1, kind="created", data={}, created_at=now) for r in runs]
    )
    return sorted(runs, key=lambda r: (r.created_at, r.id))


def test_a_claim_passes_over_heads_that_must_wait_to_the_first_run_that_may_start() -> None:
    busy, held, later, free = (Thread.objects.create(status="busy") for _ in range(4))
    Run.objects.create(thread=busy, agent_id="echo", status=RunStatus.RUNNING, last_seq=1)
    Run.objects.create(thread=held, agent_id="refund", status=RunStatus.SUSPENDED, last_seq=1)
    behind_running = services.run_create(agent_id="echo", thread_id=busy.id, input=1, actor="t")
    behind_suspended = services.run_create(agent_id="echo", thread_id=held.id, input=2, actor="t")
    services.run_create(agent_id="echo", thread_id=later.id, input=3, actor="t", after_seconds=60)
    first = services.run_create(agent_id="echo", thread_id=free.id, input=4, actor="t")
    second = services.run_create(agent_id="echo", thread_id=free.id, input=5, actor="t")
    last = services.run_create(agent_id="echo", thread_id=None, input=6, actor="t")

    claimed = services.run_claim(owner="w1", limit=5)

    # The free thread's head and the stateless run; its second run waits behind its first.
    assert [c.run.id for c in claimed] == [first.id, last.id]
    assert set(
        Run.objects.filter(id__in=[behind_running.id, behind_suspended.id, second.id]).values_list(
            "status", flat=True
        )
    ) == {RunStatus.PENDING}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_walks_past_runs_another_claim_holds_and_keeps_the_queue_order() -> None:
    runs = queued(6)
    settings = connection.get_connection_params()
    with psycopg.connect(**settings) as other:  # an in-flight claim of the two oldest
        other.execute(
            "SELECT id FROM runs_run WHERE id = ANY(%s) FOR UPDATE", [[runs[0].id, runs[1].id]]
        )
        claimed = services.run_claim(owner="w1", limit=3)
        assert [c.run.id for c in claimed] == [r.id for r in runs[2:5]]
        other.rollback()
    assert [c.run.id for c in services.run_claim(owner="w2", limit=5)] == [
        runs[0].id,
        runs[1].id,
        runs[5].id,
    ]
