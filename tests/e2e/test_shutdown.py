"""`make run` stops on Ctrl-C or SIGTERM with a run in flight; the run goes back to the queue.
A client streaming a long run does not hold a stopping server (each supported server)."""

from __future__ import annotations

import signal
import subprocess
import threading

import httpx
import pytest

from runs import services
from runs.models import Run, RunEvent, RunStatus
from runsite import servers
from tests.e2e.conftest import start_site
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.every_server]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_it_exits_promptly_and_releases_the_run_in_flight(
    transactional_db, tmp_path, sig, server
) -> None:
    site = start_site(tmp_path, server=server)
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
    again = start_site(tmp_path, name="again", server=server)
    try:
        wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.RUNNING, timeout=15)
        wait_for(lambda: Run.objects.get(id=run.id).checkpoints.count() > steps_before, timeout=15)
        assert Run.objects.get(id=run.id).attempt == 1  # a release is not a failed attempt
    finally:
        services.run_cancel(run=Run.objects.get(id=run.id), action="interrupt", actor="t")
        again.stop()


def test_an_open_stream_does_not_hold_a_stopping_server(transactional_db, tmp_path, server) -> None:
    site = start_site(tmp_path, server=server)
    thread = services.thread_create()
    lines: list[str] = []

    def follow() -> None:
        body = {"assistant_id": "slow", "input": {"steps": 6000, "delay_ms": 100}}
        try:
            with httpx.stream(
                "POST", f"{site.url}/api/threads/{thread.id}/runs/stream", json=body, timeout=60
            ) as answer:
                for line in answer.iter_lines():
                    lines.append(line)
        except httpx.HTTPError:
            pass  # the server went away mid-stream: what this test expects

    client = threading.Thread(target=follow, daemon=True)
    client.start()
    wait_for(lambda: len(lines) >= 10, timeout=15)  # the run is streaming its steps
    site.proc.send_signal(signal.SIGTERM)
    try:
        # uvicorn gives open streams servers.GRACE_SECONDS; Daphne closes them at once.
        site.proc.wait(timeout=servers.GRACE_SECONDS + 5)
    except subprocess.TimeoutExpired:
        site.proc.kill()
        pytest.fail(f"{server} still running with a stream open:\n{site.output()}")
    client.join(5)
    assert not client.is_alive()
    run = Run.objects.get(thread=thread)
    assert run.status == RunStatus.PENDING  # given back to the queue, as with no stream open
    assert run.lease_owner is None
