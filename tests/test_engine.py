"""The engine with real worker processes: agents end to end, crashes, fencing, claims, cancels.

These start `manage.py runagents` processes on the test database, so they commit for real
(transaction=True) and most need PostgreSQL (SKIP LOCKED, LISTEN/NOTIFY).
"""

from __future__ import annotations

import signal
import time
from collections import Counter

import pytest
from django.db.models import Count

from runs import selectors, services
from runs.models import Checkpoint, Run, RunEvent, RunStatus, Thread, ToolCall
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = {
    "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS": "1500",
    "RUNS_LEASE_SECONDS": "2",
    "RUNS_HEARTBEAT_SECONDS": "0.5",
    "RUNS_REAPER_SECONDS": "0.5",
    "RUNS_POLL_SECONDS": "0.2",
}


def status_of(run: Run) -> str:
    return Run.objects.get(id=run.id).status


def wait_status(run: Run, *statuses: str, timeout: float = 20.0) -> Run:
    wait_for(lambda: status_of(run) in statuses, timeout=timeout)
    return Run.objects.get(id=run.id)


def thread(resource: str = "acme") -> Thread:
    return services.thread_create(metadata={"resource_id": resource})


def create(agent_id: str, input: object, *, thread_id=None, **kw) -> Run:
    if thread_id is None:  # a stateless run whose thread (and record) the test reads afterwards
        kw.setdefault("kwargs", {"on_completion": "keep"})
    return services.run_create(
        agent_id=agent_id, thread_id=thread_id, input=input, actor="test", **kw
    )


# --- every built-in agent through a worker process -------------------------------------------------


def test_each_built_in_agent_runs_end_to_end_through_a_worker(start_worker, reviewer) -> None:
    start_worker(concurrency=4, **FAST)
    echo = create("echo", {"hi": 1})
    slow = create("slow", {"steps": 5, "delay_ms": 10})
    flaky = create("flaky", {})
    approve = create("refund", {"order_id": "A-1", "amount": 30})
    decline = create("refund", {"order_id": "A-2", "amount": 99})
    weather = create("weather", {})
    support = create("support", {"message": "double charge", "order_id": "S-1", "amount": 12})
    support2 = create("support", {"message": "double charge", "order_id": "S-2", "amount": 13})

    assert wait_status(echo, RunStatus.SUCCESS).output == {"echo": {"hi": 1}}
    assert wait_status(slow, RunStatus.SUCCESS).output == {"steps": 5}
    flaky = wait_status(flaky, RunStatus.SUCCESS)
    assert flaky.attempt == 2 and flaky.output == {"ok": True, "attempt": 2}

    services.tool_call_approve(
        run=wait_status(approve, RunStatus.SUSPENDED),
        actor=reviewer,
        args={"order_id": "A-1", "amount": 20},
    )
    assert wait_status(approve, RunStatus.SUCCESS).output == {
        "refunded": True,
        "order_id": "A-1",
        "amount": 20,
    }
    services.tool_call_decline(
        run=wait_status(decline, RunStatus.SUSPENDED), actor=reviewer, reason="too much"
    )
    assert wait_status(decline, RunStatus.SUCCESS).output == {
        "refunded": False,
        "reason": "too much",
    }

    weather = wait_status(weather, RunStatus.SUSPENDED)
    from runs.exceptions import ValidationFailed

    with pytest.raises(ValidationFailed):
        services.tool_call_answer(run=weather, actor=reviewer, resume_data={"town": "Oslo"})
    services.tool_call_answer(run=weather, actor=reviewer, resume_data={"city": "Oslo"})
    assert wait_status(weather, RunStatus.SUCCESS).output["city"] == "Oslo"

    # nested: decide at the supervisor's level for one, at the sub-agent's level for the other
    services.tool_call_approve(run=wait_status(support, RunStatus.SUSPENDED), actor=reviewer)
    assert wait_status(support, RunStatus.SUCCESS).output["billing"]["refunded"] is True
    wait_status(support2, RunStatus.SUSPENDED)
    child = Run.objects.get(parent_run=support2)
    services.tool_call_approve(run=child, actor=reviewer)
    done = wait_status(support2, RunStatus.SUCCESS)
    assert done.output["billing"] == {"refunded": True, "order_id": "S-2", "amount": 13}
    assert Run.objects.get(id=child.id).status == RunStatus.SUCCESS


# --- crashes and fencing ---------------------------------------------------------------------------


@pytest.mark.postgres
def test_runs_survive_a_worker_killed_with_sigkill(start_worker) -> None:
    a = start_worker(concurrency=5, **FAST)
    start_worker(concurrency=5, **FAST)
    runs = [create("slow", {"steps": 10, "delay_ms": 100}) for _ in range(10)]
    # wait until the first worker holds some runs mid-way, then kill it without warning
    wait_for(
        lambda: Run.objects.filter(
            lease_owner__contains=f":{a.pid}:", status=RunStatus.RUNNING
        ).exists(),
        timeout=15,
    )
    time.sleep(0.3)
    held = list(Run.objects.filter(lease_owner__contains=f":{a.pid}:").values_list("id", flat=True))
    a.signal(signal.SIGKILL)
    for run in runs:
        wait_status(run, RunStatus.SUCCESS, timeout=30)
    assert held, "the killed worker held no run"
    for run in runs:
        finished = RunEvent.objects.filter(run=run, kind="finished").count()
        assert finished == 1, f"run {run.id} finished {finished} times"
        steps = list(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
        assert sorted(steps) == list(range(len(steps))), "a step is missing or written twice"
        ticks = ToolCall.objects.filter(run=run, tool_name="tick")
        assert ticks.count() == 10 and set(ticks.values_list("status", flat=True)) == {"succeeded"}
    assert Run.objects.filter(id__in=held, attempt__gte=2).count() == len(held)


@pytest.mark.postgres
def test_a_worker_paused_past_its_lease_cannot_write_afterwards(start_worker) -> None:
    a = start_worker(concurrency=1, **FAST)
    run = create("slow", {"steps": 30, "delay_ms": 100})
    wait_for(lambda: Checkpoint.objects.filter(run=run).count() >= 3)
    a.signal(signal.SIGSTOP)
    b = start_worker(concurrency=1, **FAST)  # its reaper requeues the run once the lease expires
    wait_for(
        lambda: Run.objects.get(id=run.id).attempt == 2 and status_of(run) == RunStatus.RUNNING,
        timeout=10,
    )
    # requeued because the lease expired, not because the paused worker gave it back
    assert RunEvent.objects.filter(run=run, kind="lease_expired").exists()
    assert not RunEvent.objects.filter(run=run, kind="released").exists()
    a.signal(signal.SIGCONT)
    done = wait_status(run, RunStatus.SUCCESS, timeout=30)
    assert done.lease_owner is None
    assert RunEvent.objects.filter(run=run, kind="finished").count() == 1
    steps = list(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
    assert sorted(steps) == list(range(len(steps)))
    # The paused worker woke up to a lost lease (or a connection the server ended): it wrote
    # nothing, which the single `finished` event and the unique steps above show.
    wait_for(lambda: "lease lost" in a.output() or "could not record" in a.output(), timeout=10)
    assert b.pid != a.pid


# --- claims ----------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_500_runs_on_4_workers_are_each_claimed_exactly_once(start_worker) -> None:
    for _ in range(4):
        start_worker(concurrency=4, **FAST)
    runs = [create("echo", i) for i in range(500)]
    ids = [r.id for r in runs]
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status=RunStatus.SUCCESS).count() == 500, timeout=60
    )
    starts = Counter(
        RunEvent.objects.filter(run_id__in=ids, kind="started").values_list("run_id", flat=True)
    )
    assert len(starts) == 500 and set(starts.values()) == {1}
    workers = Counter(
        e["worker"].rsplit(":", 2)[1]
        for e in RunEvent.objects.filter(run_id__in=ids, kind="started").values_list(
            "data", flat=True
        )
    )
    assert len(workers) >= 2, f"work was not shared: {workers}"


@pytest.mark.postgres
def test_runs_on_one_thread_execute_one_at_a_time_in_creation_order(start_worker) -> None:
    start_worker(concurrency=4, **FAST)
    start_worker(concurrency=4, **FAST)
    t = thread()
    runs = [create("slow", {"steps": 2, "delay_ms": 20}, thread_id=t.id) for _ in range(8)]
    for run in runs:
        wait_status(run, RunStatus.SUCCESS, timeout=30)
    rows = list(
        Run.objects.filter(thread=t).order_by("created_at").values_list("started_at", "finished_at")
    )
    for (_s1, f1), (s2, _f2) in zip(rows, rows[1:], strict=False):
        assert f1 <= s2, "two runs of one thread overlapped"


# --- cancellation ----------------------------------------------------------------------------------


def _stopped_in(worker, run: Run) -> None:
    """The worker holding `run` has stopped executing it (it says so, and wrote nothing more)."""
    wait_for(lambda: f"cancelled run={run.id}" in worker.output(), timeout=5)


@pytest.mark.postgres
def test_a_cancel_ends_a_running_run_at_once_and_its_worker_stops(start_worker, support) -> None:
    w = start_worker(concurrency=2, **FAST)
    interrupted = create("slow", {"steps": 200, "delay_ms": 100})
    rolled = create("slow", {"steps": 200, "delay_ms": 100}, thread_id=thread().id)
    for run in (interrupted, rolled):
        wait_for(lambda r=run: Checkpoint.objects.filter(run=r).count() >= 3, timeout=15)
    # Ended by the cancel itself: no wait for the worker.
    assert services.run_cancel(run=interrupted, action="interrupt", actor=support).status == (
        RunStatus.INTERRUPTED
    )
    assert services.run_cancel(run=rolled, action="rollback", actor=support) is None
    assert not Run.objects.filter(id=rolled.id).exists()
    assert not Checkpoint.objects.filter(run_id=rolled.id).exists()
    kept = Checkpoint.objects.filter(run=interrupted).count()
    assert kept >= 3  # interrupt keeps checkpoints
    seq = Run.objects.get(id=interrupted.id).last_seq
    # The worker is told at commit and stops; nothing it does afterwards is written.
    _stopped_in(w, interrupted)
    _stopped_in(w, rolled)
    time.sleep(0.3)  # three of the slow agent's steps
    assert Checkpoint.objects.filter(run=interrupted).count() == kept
    assert Run.objects.get(id=interrupted.id).last_seq == seq
    assert not Checkpoint.objects.filter(run_id=rolled.id).exists()
    assert "lease lost" not in w.output()


@pytest.mark.postgres
def test_a_lost_notification_is_caught_by_the_heartbeat(start_worker, support) -> None:
    # This worker does not LISTEN, so it never hears the NOTIFY, and its one tool call sleeps for
    # 30 s without a fenced write: only its heartbeat can tell it the run has ended.
    heartbeat = 1.0
    start_worker(
        concurrency=1, RUNS_NOTIFY="0", **{**FAST, "RUNS_HEARTBEAT_SECONDS": str(heartbeat)}
    )
    run = create("slow", {"steps": 1, "delay_ms": 30_000})
    wait_for(lambda: ToolCall.objects.filter(run=run, status="running").exists(), timeout=15)
    services.run_cancel(run=run, action="interrupt", actor=support)
    after = create("echo", 1)
    # Its only slot is free again within a heartbeat interval, not after the 30 s tool call.
    done = wait_status(after, RunStatus.SUCCESS, timeout=10)
    cancelled_at = Run.objects.get(id=run.id).finished_at
    assert (done.started_at - cancelled_at).total_seconds() < heartbeat + 1.0


def test_bulk_cancel_by_status_across_threads_through_the_worker(start_worker, support) -> None:
    w = start_worker(concurrency=3, **FAST)
    running = [
        create("slow", {"steps": 300, "delay_ms": 50}, thread_id=thread().id) for _ in range(3)
    ]
    for run in running:
        wait_status(run, RunStatus.RUNNING)
    pending = create("slow", {"steps": 300, "delay_ms": 50}, thread_id=running[0].thread_id)
    result = services.runs_cancel_many(action="interrupt", actor=support, status="all")
    assert sorted(result.interrupted) == sorted(r.id for r in [*running, pending])
    assert not Run.objects.filter(status__in=[RunStatus.RUNNING, RunStatus.PENDING]).exists()
    for run in running:
        _stopped_in(w, run)


# --- restarts and graceful shutdown -------------------------------------------------------------------


def test_suspended_runs_survive_a_restart_and_complete_after_it(start_worker, reviewer) -> None:
    first = start_worker(concurrency=2, **FAST)
    runs = [create("refund", {"order_id": f"R-{i}", "amount": 10 + i}) for i in range(3)]
    for run in runs:
        wait_status(run, RunStatus.SUSPENDED)
    first.stop()
    page = selectors.suspended_runs_for_agent(agent_id="refund", per_page=10, page=0)
    assert page.total == 3 and {r.id for r in page.items} == {r.id for r in runs}
    start_worker(concurrency=2, **FAST)
    for run in runs:
        services.tool_call_approve(run=run, actor=reviewer)
    for run in runs:
        assert wait_status(run, RunStatus.SUCCESS).output["refunded"] is True


@pytest.mark.postgres
def test_sigterm_releases_running_runs_for_another_worker(start_worker) -> None:
    a = start_worker(concurrency=1, **{**FAST, "RUNS_LEASE_SECONDS": "120"})
    run = create("slow", {"steps": 40, "delay_ms": 50})
    wait_for(lambda: Checkpoint.objects.filter(run=run).count() >= 3, timeout=15)
    a.signal(signal.SIGTERM)
    a.proc.wait(10)
    released = Run.objects.get(id=run.id)
    assert released.status == RunStatus.PENDING and released.attempt == 0
    assert RunEvent.objects.filter(run=run, kind="released").exists()
    started = time.monotonic()
    start_worker(concurrency=1, **FAST)
    wait_status(run, RunStatus.SUCCESS, timeout=60)
    # Picked up at once, not after the 120 s lease (the bound is wide: a loaded machine
    # starts a worker process slowly, and this is about the lease, not speed).
    assert time.monotonic() - started < 60
    counts = Checkpoint.objects.filter(run=run).values("step").annotate(n=Count("id"))
    assert all(c["n"] == 1 for c in counts)
