"""What a tool sees while it runs, and the signals that stop a run between steps."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from runs.contracts import SuspendPlan


class SuspendRequested(Exception):
    """Raised by ctx.suspend(): park the run until resume data arrives."""

    def __init__(self, payload: Any, resume_schema: dict[str, Any] | None):
        super().__init__("suspend requested")
        self.payload = payload
        self.resume_schema = resume_schema


class SubAgentSuspended(Exception):
    """A sub-agent run suspended; its supervisor suspends on the delegation call."""

    def __init__(self, plans: list[SuspendPlan], child_run_id: Any, agent_id: str):
        super().__init__("sub-agent suspended")
        self.plans = plans
        self.child_run_id = child_run_id
        self.agent_id = agent_id


class RunStopped(Exception):
    """The run must stop at this boundary: cancelled, timed out, lease lost or shutting down."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason  # "cancel" | "timeout" | "lost" | "release"


class NonRetryableError(Exception):
    """An agent error that a retry cannot fix (max steps, unknown agent): end with error."""


class RunControl:
    """Shared between a run's executor thread and the worker's main loop."""

    def __init__(self, deadline: float | None = None):
        self.wake = threading.Event()
        self.cancel = False
        # The cancel action already applied by the request that cancelled the run (the notice
        # said so): the run is ended or deleted, nothing is left to write.
        self.cancel_applied: str | None = None
        self.lost = False
        self.release = False
        self.deadline = deadline  # time.monotonic() value

    def request_cancel(self, applied: str | None = None) -> None:
        if applied:
            self.cancel_applied = applied
        self.cancel = True
        self.wake.set()

    def mark_lost(self) -> None:
        self.lost = True
        self.wake.set()

    def request_release(self) -> None:
        self.release = True
        self.wake.set()

    def timed_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def check(self) -> None:
        if self.lost:
            raise RunStopped("lost")
        if self.cancel:
            raise RunStopped("cancel")
        if self.timed_out():
            raise RunStopped("timeout")
        if self.release:
            raise RunStopped("release")


class ToolContext:
    """Passed to every tool as `ctx`."""

    def __init__(
        self,
        *,
        run_id: Any,
        tool_call_id: str,
        agent_id: str,
        attempt: int,
        resume_data: Any,
        control: RunControl,
        executor: Any,
    ):
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.agent_id = agent_id
        self.attempt = attempt
        self.resume_data = resume_data
        self._control = control
        self._executor = executor

    @property
    def idempotency_key(self) -> str:
        """Stable across retries of this call: pass it to external APIs to dedupe effects."""
        return f"{self.run_id}:{self.tool_call_id}"

    @property
    def resumed(self) -> bool:
        return self.resume_data is not None

    def suspend(self, payload: Any = None, resume_schema: dict[str, Any] | None = None) -> NoReturn:
        """Park the run until someone answers; the tool then runs again with ctx.resume_data."""
        raise SuspendRequested(payload, resume_schema)

    def sleep(self, seconds: float) -> None:
        """Sleep, waking at once if the run is cancelled (then raises RunStopped)."""
        end = time.monotonic() + seconds
        while True:
            self._control.check()
            remaining = end - time.monotonic()
            if self._control.deadline is not None:
                remaining = min(remaining, self._control.deadline - time.monotonic())
            if remaining <= 0:
                break
            self._control.wake.wait(remaining)
        self._control.check()

    def check_cancelled(self) -> None:
        self._control.check()

    def emit(self, data: dict[str, Any]) -> None:
        """Send a custom event to the run's stream (LangGraph `custom` mode) and timeline."""
        self._executor.emit(data)

    def delegate(self, agent_id: str, input: Any) -> Any:
        """Run another agent as a sub-agent; returns its output (or suspends with it)."""
        return self._executor.delegate(self, agent_id, input)
