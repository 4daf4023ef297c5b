"""The first responder (runs/engine/worker.py, RESPONDER_LOCK): one worker process listens for
queued runs and hands on what it cannot take; real processes on PostgreSQL."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from runs import services
from runs.engine.worker import RESPONDER_LOCK
from runs.models import Run, RunEvent, RunStatus
from tests.helpers import WorkerProcess, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# No worker looks at the queue on its own within a test (its poll, or its loop's turn for a
# heartbeat): a run is claimed because a worker was told of it.
QUIET = {"RUNS_POLL_SECONDS": "60", "RUNS_HEARTBEAT_SECONDS": "30", "RUNS_LEASE_SECONDS": "120"}


def _responders() -> int:
    """How many sessions hold the responder lock in the test's database (PostgreSQL splits a
    bigint key in two; another Runsite on the same server holds its own)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = %s",
            [RESPONDER_LOCK],
        )
        return int(cursor.fetchone()[0])


def _following(start_worker, **kwargs) -> WorkerProcess:
    """Start a worker once another is the responder; return when its listener has tried the
    lock and its first look at the queue (every worker's, at start) is behind it."""
    wait_for(lambda: _responders() == 1)
    worker = start_worker(**kwargs)

    def tried() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle'"
                " AND datname = current_database() AND query LIKE 'SELECT pg_try_advisory_lock%%'"
            )
            return int(cursor.fetchone()[0]) >= 1

    wait_for(tried)
    time.sleep(0.5)
    return worker


def _claimed_by(run: Run) -> int:
    """The OS pid of the worker that claimed the run (its `started` event names the worker)."""
    started = RunEvent.objects.filter(run_id=run.id, kind="started").order_by("seq").first()
    assert started is not None
    return int(started.data["worker"].split(":")[1])


def _done(run: Run, timeout: float = 10.0) -> Run:
    wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.SUCCESS, timeout=timeout)
    return Run.objects.get(id=run.id)


def _echo() -> Run:
    return services.run_create(agent_id="echo", thread_id=None, input={"n": 1}, actor="t")


def test_only_the_first_responder_answers_a_queued_run(start_worker) -> None:
    first = start_worker(concurrency=2, **QUIET)
    _following(start_worker, concurrency=2, **QUIET)
    for _ in range(6):
        run = _done(_echo())
        assert _claimed_by(run) == first.pid
    assert _responders() == 1


def test_a_responder_without_room_hands_a_queued_run_on(start_worker) -> None:
    first = start_worker(concurrency=1, **QUIET)
    second = _following(start_worker, concurrency=1, **QUIET)
    busy = services.run_create(
        agent_id="slow", thread_id=None, input={"steps": 100, "delay_ms": 100}, actor="t"
    )
    wait_for(lambda: Run.objects.get(id=busy.id).status == RunStatus.RUNNING)
    assert _claimed_by(busy) == first.pid
    # The responder has no room: the other worker claims the run at once, not at its poll.
    run = _done(_echo())
    assert _claimed_by(run) == second.pid
    services.run_cancel(run=Run.objects.get(id=busy.id), action="interrupt", actor="t")


def test_when_the_responder_dies_another_worker_answers(start_worker) -> None:
    first = start_worker(concurrency=2, **QUIET)
    second = _following(start_worker, concurrency=2, **QUIET)
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    # Its lock went with its connection: the other worker takes it and listens instead.
    wait_for(lambda: _responders() == 1, timeout=10)
    run = _done(_echo())
    assert _claimed_by(run) == second.pid
