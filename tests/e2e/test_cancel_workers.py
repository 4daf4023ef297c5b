"""A cancel of a running run, seen from a real `runagents` process on PostgreSQL: the run ends
in the cancel's transaction, and a tool that ignores the cancel and finishes afterwards still
has its outcome recorded — and nothing after it runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runs import services
from runs.models import Checkpoint, RunEvent, RunStatus, ToolCall, ToolCallStatus
from tests.e2e.cancel_agents import AGENTS, STARTED_FILE
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

WORKER_ENV = {"RUNS_AGENTS": "runs.agents.BUILTIN_AGENTS,tests.e2e.cancel_agents.AGENTS"}


@pytest.fixture
def cancel_agents(register_agent: Callable[[Any], Any]) -> None:
    for agent in AGENTS:  # this process creates the runs; the worker runs them
        register_agent(agent)


def test_a_tool_finishing_after_the_cancel_is_recorded_and_nothing_follows(
    cancel_agents, start_worker, support, tmp_path: Path
) -> None:
    started = tmp_path / "tool-started"
    worker = start_worker(concurrency=1, **WORKER_ENV, **{STARTED_FILE: str(started)})
    thread = services.thread_create(metadata={})
    run = services.run_create(agent_id="stubborn", thread_id=thread.id, input={}, actor="t")
    # The tool itself has started (the record says `running` a moment earlier, with the
    # decision; a cancel in that moment stops the run before the tool: tests/test_engine_writes.py).
    wait_for(started.exists, timeout=15)
    assert ToolCall.objects.get(run=run).status == ToolCallStatus.RUNNING
    checkpoints = Checkpoint.objects.filter(run=run).count()

    ended = services.run_cancel(run=run, action="interrupt", actor=support, reason="stop")
    assert ended is not None and ended.status == RunStatus.INTERRUPTED

    # The tool was mid-call: its outcome arrives after the cancel and is kept on the record.
    call = ToolCall.objects.get(run=run)
    wait_for(lambda: ToolCall.objects.get(id=call.id).status == ToolCallStatus.SUCCEEDED)
    assert ToolCall.objects.get(id=call.id).result == {"charged": 5}
    late = RunEvent.objects.get(run=run, kind="tool_result")
    assert late.data["after_cancel"] is True
    wait_for(lambda: f"cancelled run={run.id}" in worker.output())
    # ... and nothing after it: no second charge, no new step, the run stays interrupted.
    time.sleep(0.5)
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert ToolCall.objects.filter(run=run).count() == 1
    assert Checkpoint.objects.filter(run=run).count() == checkpoints
    assert run.events.order_by("-seq").first().id == late.id
    assert "lease lost" not in worker.output()
