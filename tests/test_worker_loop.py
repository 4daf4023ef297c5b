"""The worker's main loop (runs/engine/worker.py) in this process: when it claims."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runs import live, services
from runs.engine.worker import Worker
from runs.models import Run, RunStatus
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, str]]]:
    """Each claim the worker makes: how many runs it got, and every run's status just before."""
    seen: list[tuple[int, dict[str, str]]] = []
    claim = services.run_claim

    def spy(**kwargs: Any) -> list[services.ClaimedRun]:
        before = {str(r.id): r.status for r in Run.objects.all()}
        got = claim(**kwargs)
        seen.append((len(got), before))
        return got

    monkeypatch.setattr(services, "run_claim", spy)
    return seen


def start(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run_forever, daemon=True)
    thread.start()
    return thread


def echo_runs(n: int) -> list[Run]:
    return [
        services.run_create(agent_id="echo", thread_id=None, input={"n": i}, actor="t")
        for i in range(n)
    ]


def until_all_succeed(runs: list[Run]) -> None:
    ids = [r.id for r in runs]
    wait_for(
        lambda: Run.objects.filter(id__in=ids, status=RunStatus.SUCCESS).count() == len(ids),
        timeout=30,
    )


def test_a_claim_that_fills_fewer_slots_than_free_is_not_repeated_until_a_run_ends(claims) -> None:
    # No timer turns: only wake-ups (a new run, a run's end) make the loop claim.
    worker = Worker(concurrency=4, listen=False, poll_seconds=60, heartbeat_seconds=60)
    loop = start(worker)
    try:
        wait_for(lambda: len(claims) >= 1)  # the first turn finds an empty queue
        run = services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 3, "delay_ms": 150}, actor="t"
        )
        wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.SUCCESS, timeout=20)
        wait_for(lambda: len(claims) >= 3)
    finally:
        worker.stop()
        loop.join(10)
    got = [n for n, _ in claims]
    assert got[:3] == [0, 1, 0], got
    # The claim after the one that got 1 of 4 free slots waited for the run's end (its wake-up);
    # it did not ask again at once while the run was still going.
    assert claims[2][1][str(run.id)] == RunStatus.SUCCESS


def test_runs_queued_past_the_free_slots_are_claimed_as_runs_end(claims) -> None:
    runs = [  # the first two are claimed together and end 0.6 s apart
        services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 2, "delay_ms": ms}, actor="t"
        )
        for ms in (100, 400, 100)
    ]
    worker = Worker(concurrency=2, listen=False, poll_seconds=60, heartbeat_seconds=60)
    loop = start(worker)
    try:  # no timer turn within 60 s: the third run is claimed on the first run's end
        until_all_succeed(runs)
    finally:
        worker.stop()
        loop.join(10)
    got = [n for n, _ in claims]
    assert got[:2] == [2, 1], got
    ended = [r for r, status in claims[1][1].items() if status == RunStatus.SUCCESS]
    assert len(ended) == 1  # the second claim came with the first end


def test_a_claimed_runs_change_goes_out_from_its_own_thread_before_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The claim's change (the run now `running`) is sent by the thread that runs the run, as
    its end is, in that order; the loop's thread, which claims, sends nothing of it."""
    sent: list[tuple[str, str, str]] = []  # (run, status, the sending thread)
    inline, submit = live._publish_inline, live._publisher.submit

    def noting(send: Any) -> Any:
        def noted(change: live.RunChange) -> Any:
            went = send(change)
            if went is not False:  # (an inline send that hands the change to the publisher)
                sent.append((change.run_id, change.status, threading.current_thread().name))
            return went

        return noted

    # Every way out of this process: from the committing thread, or handed to the publisher.
    monkeypatch.setattr(live, "_publish_inline", noting(inline))
    monkeypatch.setattr(live._publisher, "submit", noting(submit))
    runs = echo_runs(2)
    sent.clear()  # their creation's
    worker = Worker(concurrency=2, listen=False, poll_seconds=60, heartbeat_seconds=60)
    loop = start(worker)
    try:
        until_all_succeed(runs)
        wait_for(lambda: len([s for s in sent if s[1] == RunStatus.SUCCESS]) == 2)
    finally:
        worker.stop()
        loop.join(10)
    for run in runs:
        mine = [(status, name) for run_id, status, name in sent if run_id == str(run.id)]
        assert [status for status, _ in mine] == [RunStatus.RUNNING, RunStatus.SUCCESS], sent
        assert {name for _, name in mine} == {"runsite-run"}, sent


@pytest.mark.postgres
def test_a_responder_told_of_a_queued_run_claims_it_without_first_reading_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runs.engine import wakeup
    from runs.services import queue

    # Only the NOTIFY wakes it: no in-process poke after the commit (a worker in a process of
    # its own gets none), which could come first and make the claim an ordinary one.
    monkeypatch.setattr(wakeup, "register", lambda listener: None)
    looks: list[bool] = []  # each read of the queue before a claim, with what it found
    claimable = queue._claimable

    def look(now: Any) -> bool:
        looks.append(claimable(now))
        return looks[-1]

    made: list[tuple[int, list[bool]]] = []  # each claim: runs it got, the reads it made first
    claim = services.run_claim

    def spy(**kwargs: Any) -> list[services.ClaimedRun]:
        before = len(looks)
        got = claim(**kwargs)
        made.append((len(got), looks[before:]))
        return got

    monkeypatch.setattr(queue, "_claimable", look)
    monkeypatch.setattr(services, "run_claim", spy)
    worker = Worker(concurrency=4, listen=True, poll_seconds=60, heartbeat_seconds=60)
    loop = start(worker)
    try:
        wait_for(worker.responder.is_set)
        time.sleep(0.3)  # the turns its start and the responder's lock made are behind it
        wait_for(lambda: worker._waiting and not worker._wake.is_set())
        run = services.run_create(agent_id="echo", thread_id=None, input={"n": 1}, actor="t")
        wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.SUCCESS)
        wait_for(lambda: made[-1][0] == 0 and any(n == 1 for n, _ in made))
    finally:
        worker.stop()
        loop.join(10)
    told = next(i for i, (n, _) in enumerate(made) if n == 1)
    # Told by the NOTIFY, the claim read the queue itself; the claim after the run's end (no
    # NOTIFY: a slot came free) looked first and found nothing, without an empty claim.
    assert made[told] == (1, []), made
    assert made[told + 1] == (0, [False]), made


# --- told of a cancel -------------------------------------------------------------------------


def test_a_cancel_says_in_its_notice_that_it_ended_the_run(
    django_capture_on_commit_callbacks,
) -> None:
    from runs.engine import wakeup

    heard: list[list[str]] = []

    class Listener:
        def wake(self) -> None:
            pass

        def cancel_requested(self, notices: list[str]) -> None:
            heard.append(notices)

    listener = Listener()
    wakeup.register(listener)
    try:
        for action in ("interrupt", "rollback"):
            run = services.run_create(agent_id="slow", thread_id=None, input={}, actor="t")
            (claimed,) = services.run_claim(owner="w1", limit=1)
            with django_capture_on_commit_callbacks(execute=True):
                services.run_cancel(run=claimed.run, action=action, actor="t")
            assert heard[-1] == [f"{run.id}={action}"]
    finally:
        wakeup.unregister(listener)


def _running_slow_run(worker: Worker) -> tuple[services.ClaimedRun, Any]:
    from runs.engine.context import RunControl

    services.run_create(agent_id="slow", thread_id=None, input={}, actor="t")
    (claimed,) = services.run_claim(owner=worker.owner, limit=1)
    control = RunControl()
    worker._active[claimed.lease.run_id] = type(  # what the claim loop registers
        "Active", (), {"control": control, "lease": claimed.lease}
    )()
    return claimed, control


@pytest.mark.parametrize("action,outcome", [("interrupt", "interrupted"), ("rollback", "deleted")])
def test_a_worker_told_the_cancel_was_applied_stops_without_the_database(
    django_assert_num_queries: Any, action: str, outcome: str
) -> None:
    from runs.engine.worker import _stopped

    worker = Worker(owner="w1", concurrency=1)
    claimed, control = _running_slow_run(worker)
    services.run_cancel(run=claimed.run, action=action, actor="t")
    worker.cancel_requested([f"{claimed.lease.run_id}={action}", "not-a-run-id", "x=interrupt"])
    assert control.cancel and control.cancel_applied == action
    with django_assert_num_queries(0):
        assert _stopped(claimed.lease, "cancel", control) == outcome


def test_a_bare_run_id_leaves_the_cancel_to_the_worker_to_apply() -> None:
    """An older version's notice (or a heartbeat's finding): a cancel written on the row but
    not applied is applied by the worker that stops."""
    from runs.engine.worker import _stopped

    worker = Worker(owner="w1", concurrency=1)
    claimed, control = _running_slow_run(worker)
    Run.objects.filter(id=claimed.lease.run_id).update(cancel_action="interrupt")
    worker.cancel_requested([str(claimed.lease.run_id)])
    assert control.cancel and control.cancel_applied is None
    assert _stopped(claimed.lease, "cancel", control) == RunStatus.INTERRUPTED
    run = Run.objects.get(id=claimed.lease.run_id)
    assert run.status == RunStatus.INTERRUPTED and run.lease_owner is None


# --- the run threads ----------------------------------------------------------------------------


@pytest.mark.django_db(False)
def test_the_run_threads_are_reused_run_in_parallel_and_end_when_idle(monkeypatch) -> None:
    from runs.engine.worker import _DaemonPool

    monkeypatch.setattr(_DaemonPool, "IDLE_SECONDS", 0.3)
    pool = _DaemonPool("test-run")
    first = pool.submit(lambda: threading.current_thread())
    thread = first.result(5)
    assert thread.daemon and thread.name == "test-run"
    # The next run, after the first ended, goes to the same thread.
    assert pool.submit(lambda: threading.current_thread()).result(5) is thread

    # Runs submitted together run at once, each on a thread of its own.
    gate = threading.Barrier(3, timeout=5)
    together = [pool.submit(lambda: (gate.wait(), threading.current_thread())[1]) for _ in range(3)]
    threads = {f.result(5) for f in together}
    assert len(threads) == 3 and thread in threads

    # A run that raises fails its future; the thread serves the next run.
    def boom() -> str:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        pool.submit(boom).result(5)
    assert pool.submit(lambda: "ok").result(5) == "ok"

    # Idle threads end.
    wait_for(lambda: not any(t.is_alive() for t in threads), timeout=5)


@pytest.mark.postgres
def test_a_worker_with_a_backlog_claims_without_first_reading_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runs.services import queue

    looks: list[bool] = []  # each read of the queue before a claim, with what it found
    claimable = queue._claimable

    def look(now: Any) -> bool:
        looks.append(claimable(now))
        return looks[-1]

    made: list[tuple[int, list[bool]]] = []  # each claim: runs it got, the reads it made first
    claim = services.run_claim

    def spy(**kwargs: Any) -> list[services.ClaimedRun]:
        before = len(looks)
        got = claim(**kwargs)
        made.append((len(got), looks[before:]))
        return got

    monkeypatch.setattr(queue, "_claimable", look)
    monkeypatch.setattr(services, "run_claim", spy)
    runs = echo_runs(3)
    # One slot, no NOTIFY, no timer turn: each claim comes with the previous run's end.
    worker = Worker(concurrency=1, listen=False, poll_seconds=60, heartbeat_seconds=60)
    loop = start(worker)
    try:
        until_all_succeed(runs)
        wait_for(lambda: len(made) >= 4)
        worker.wake()  # a turn after the queue drained
        wait_for(lambda: len(made) >= 5)
    finally:
        worker.stop()
        loop.join(10)
    # The first claim looked; each claim after one that filled its slot did not; the claim
    # that found the queue drained was an empty claim, and the one after it looked again.
    assert made[:5] == [(1, [True]), (1, []), (1, []), (0, []), (0, [False])], made
