"""`make run` stops on Ctrl-C or SIGTERM with a run in flight; the run goes back to the queue."""

from __future__ import annotations

import signal
import subprocess

import pytest

from runs import services
from runs.models import Run, RunEvent, RunStatus
from tests.e2e.conftest import start_daphne
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_it_exits_promptly_and_releases_the_run_in_flight(transactional_db, tmp_path, sig) -> None:
    site = start_daphne(tmp_path)
    thread = services.thread_create()
    # The demo's long run: 10 steps a second for ten minutes.
    run = services.run_create(
        agent_id="slow", thread_id=thread.id, input={"steps": 6000, "delay_ms": 100}, actor="t"
    )
    wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.RUNNING, timeout=15)
    wait_for(lambda: Run.objects.get(id=run.id).checkpoints.count() >= 3, timeout=15)

    site.proc.send_signal(sig)
    try:
        # The bound: the server is gone within 5 s of the signal.
        site.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        site.proc.kill()
        pytest.fail(f"server still running 5 s after {sig.name}:\n{site.output()}")

    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    assert run.lease_owner is None
    assert RunEvent.objects.filter(run=run, kind="released").exists()
    steps_before = run.checkpoints.count()

    # The next start picks it up again and continues from its checkpoints.
    again = start_daphne(tmp_path, name="again")
    try:
        wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.RUNNING, timeout=15)
        wait_for(lambda: Run.objects.get(id=run.id).checkpoints.count() > steps_before, timeout=15)
        assert Run.objects.get(id=run.id).attempt == 1  # a release is not a failed attempt
    finally:
        services.run_cancel(run=Run.objects.get(id=run.id), action="interrupt", actor="t")
        again.stop()
