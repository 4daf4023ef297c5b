"""The step loop: latest checkpoint → model → tool calls → checkpoint, until done or suspended.

Every write goes through runs/services under the run's lease (fenced). Tool results already
recorded are reused, never re-executed; the model's decision for a step is stored in the
checkpoint (its pending tool calls) before any of its calls runs, so a retried or resumed run
never asks the model twice once something acted on its answer. Writes are folded into the next
one where nothing happens in between (docs/architecture.md): a decision whose calls all wait for
a reviewer is written with the suspension, the last outcome of a step with the step after it.
Writes are also held (`HeldWrites`) where what happens before the next one may safely happen
again after a crash and takes no time worth showing: a decision whose calls are all read-only
tools (`@tool(read_only=True)`) is written with their results, and with an in-process model
(`ScriptedModel`) a step's outcome waits for the model's next decision. A read-only tool still
running after READ_ONLY_GRACE_SECONDS gets the held writes made at once, so it shows as running.
"""

from __future__ import annotations

import logging
import secrets
import threading
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection, connections
from django.utils import timezone

from runs import services
from runs.engine.agent import Agent, Tool
from runs.engine.context import (
    NonRetryableError,
    RunControl,
    RunStopped,
    SubAgentSuspended,
    SuspendRequested,
    ToolContext,
)
from runs.engine.model import FinalAnswer, ModelInput, ToolCalls, ToolResult
from runs.engine.registry import get_agent
from runs.ids import uuid7
from runs.models import Checkpoint, Run, RunStatus, ToolCall, ToolCallStatus
from runs.rows import instances

logger = logging.getLogger("runs.engine")
Event = tuple[str, dict[str, Any], str]
_now = timezone.now

RESOLVED = (ToolCallStatus.SUCCEEDED, ToolCallStatus.FAILED, ToolCallStatus.DECLINED)
# A read-only tool whose decision is held: past this, the held writes are made while it runs.
READ_ONLY_GRACE_SECONDS = 0.05


@dataclass
class Finished:
    output: Any
    values: dict[str, Any]
    steps: list[services.StepWrite]  # written together with the end of the run
    events: list[tuple[str, dict[str, Any], str]]
    held: services.HeldWrites | None = None  # written first, with the end
    # What the run's search document is made of, as the loop holds it (the end writes the
    # document without reading it first when the database agrees).
    source: services.DocumentSource | None = None


@dataclass
class Suspended:
    plans: list[services.SuspendPlan]
    values: dict[str, Any]


def _user_message(value: Any) -> dict[str, Any]:
    return {"role": "user", "content": value}


def _declined_result(tc: ToolCall) -> dict[str, Any]:
    return {"declined": True, "reason": tc.decision_reason or services.DEFAULT_DECLINE_TEXT}


def _model_result(tc: ToolCall, agent: Agent) -> Any:
    """A resolved call's result as the model sees it: the decline, or the tool's result with
    the reviewer's approval comment when the tool shares it."""
    if tc.status == ToolCallStatus.DECLINED:
        return _declined_result(tc)
    tool = agent.get_tool(tc.tool_name)
    if not (tc.decision_comment and tool is not None and tool.share_review_comment):
        return tc.result
    if isinstance(tc.result, dict) and "reviewer_comment" not in tc.result:
        return {**tc.result, "reviewer_comment": tc.decision_comment}
    return {"result": tc.result, "reviewer_comment": tc.decision_comment}


def _error_of(exc: BaseException) -> dict[str, str]:
    return {"error": type(exc).__name__, "message": str(exc)[:2000]}


_LATEST_OF_RUN_SQL = "SELECT * FROM runs_checkpoint WHERE run_id = %s ORDER BY step DESC LIMIT 1"
_CALLS_OF_RUN_SQL = "SELECT * FROM runs_toolcall WHERE run_id = %s"


class StepLoop:
    def __init__(
        self, *, run: Run, lease: services.Lease, control: RunControl, agent: Agent | None = None
    ):
        self.run = run
        self.lease = lease
        self.control = control
        self.agent = agent or get_agent(run.agent_id)
        # Steps not written yet: the input checkpoint waits for the next write, and the final
        # step is written with the end of the run, so an agent that answers at once costs one
        # transaction after its claim.
        self._unsaved: list[services.StepWrite] = []
        # Writes skipped for the next one (module docstring); `_held_lock` is taken by whoever
        # makes them while a read-only tool runs (its grace timer, or the tool's own emit).
        self._held = services.HeldWrites()
        self._held_lock = threading.Lock()
        self._held_error: BaseException | None = None
        self._grace_open = False
        # Calls written `running` with their decision or by the claim (this attempt): not
        # marked again; each with the status it goes back to if its tool never starts.
        self._marked_running: dict[str, str] = {}

    # -- state --------------------------------------------------------------------------------

    def _load(self) -> tuple[services.StepWrite, dict[str, ToolCall]]:
        """The checkpoint the run continues from and its recorded tool calls (written reads:
        every resumed run makes them, and the ORM compiled both on every call)."""
        checkpoint = None
        calls: dict[str, ToolCall] = {}
        if not (getattr(self.run, "fresh", False) and self.run.parent_run_id is None):
            # Started before (a retry, a resume, a sub-agent taken over): continue from its
            # latest checkpoint and reuse every tool result it recorded.
            resumed_from = self.run.__dict__.get("resumed_from")  # read by the claim
            if resumed_from is None:
                run_id = Run._meta.pk.get_db_prep_value(self.run.id, connection)
                found = instances(Checkpoint, _LATEST_OF_RUN_SQL, [run_id])
                resumed_from = (
                    found[0] if found else None,
                    instances(ToolCall, _CALLS_OF_RUN_SQL, [run_id]),
                )
            row, own_calls = resumed_from
            calls = {tc.tool_call_id: tc for tc in own_calls}
            self._marked_running.update(self.run.__dict__.get("marked_calls") or {})
            if row is not None:
                checkpoint = services.StepWrite(
                    row.id, row.step, row.values, list(row.pending), row.parent_id
                )
        if checkpoint is not None:
            return checkpoint, calls
        base_id: UUID | None = None
        base_values: dict[str, Any] = {}
        if getattr(self.run, "fresh", False) and hasattr(self.run, "base_checkpoint_id"):
            # The claim already read the thread's latest checkpoint (PostgreSQL).
            if self.run.base_checkpoint_id is not None:
                base_id, base_values = self.run.base_checkpoint_id, self.run.base_values or {}
        elif self.run.thread_id is not None:
            base = (
                Checkpoint.objects.filter(thread_id=self.run.thread_id)
                .order_by("-created_at", "-id")
                .values("id", "values")
                .first()
            )
            if base is not None:
                base_id, base_values = base["id"], base["values"]
        values = dict(base_values)
        values["messages"] = [*values.get("messages", []), _user_message(self.run.input)]
        values["output"] = None
        first = services.StepWrite(uuid7(), 0, values, [], base_id)
        self._unsaved.append(first)
        return first, calls

    def _results(self, calls: dict[str, ToolCall]) -> list[ToolResult]:
        out = []
        for tc in sorted(calls.values(), key=lambda c: (c.step, c.created_at, c.tool_call_id)):
            if tc.status not in RESOLVED:
                continue
            declined = tc.status == ToolCallStatus.DECLINED
            out.append(
                ToolResult(
                    tool_call_id=tc.tool_call_id,
                    name=tc.tool_name,
                    args=tc.args,
                    result=_model_result(tc, self.agent),
                    declined=declined,
                    reason=tc.decision_reason if declined else "",
                )
            )
        return out

    # -- the loop -----------------------------------------------------------------------------

    def _next(
        self, prev: services.StepWrite, values: dict[str, Any], pending: list[str]
    ) -> services.StepWrite:
        return services.StepWrite(uuid7(), prev.step + 1, values, pending, prev.id)

    def run_until_stop(self) -> Finished | Suspended:
        try:
            return self._steps()
        except BaseException as exc:
            # Whatever stops the run, what was held is written first (a tool's outcome must not
            # vanish); under a cancel the write records only the outcome, as after_cancel.
            self._write_held_quietly()
            if isinstance(exc, RunStopped) and self._marked_running:
                # Written `running` with their decision or their claim, but stopped before
                # their tools started.
                services.tool_calls_not_started(lease=self.lease, calls=self._marked_running)
            raise

    def _steps(self) -> Finished | Suspended:
        checkpoint, calls = self._load()
        decisions = len({c.step for c in calls.values()})
        while True:
            self.control.check()
            if checkpoint.pending:
                plans, last = self._run_tools(checkpoint, calls)
                if plans is not None:
                    plans[-1].held = self._take_held()  # this run's own plan is the last
                    return Suspended(plans=plans, values=checkpoint.values)
                values = dict(checkpoint.values)
                tool_messages = []
                for tcid in checkpoint.pending:
                    tc = calls[tcid]
                    tool_messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": tcid,
                            "name": tc.tool_name,
                            "content": _model_result(tc, self.agent),
                        }
                    )
                values["messages"] = [*values.get("messages", []), *tool_messages]
                checkpoint = self._next(checkpoint, values, [])
                update = {"node": "tools", "update": {"messages": tool_messages}}
                if getattr(self.agent.model, "in_process", False) is True:
                    # The model decides at once, in this process: the outcome goes with it.
                    self._hold(checkpoint, events=[("update", update, "system")], outcome=last)
                else:
                    self._save(checkpoint, events=[("update", update, "system")], outcome=last)
                continue

            if decisions >= self.agent.max_steps:
                raise NonRetryableError(
                    f"agent {self.agent.id} made {decisions} decisions without finishing "
                    f"(max_steps={self.agent.max_steps})"
                )
            state = ModelInput(
                agent_id=self.agent.id,
                input=self.run.input,
                messages=checkpoint.values.get("messages", []),
                step=checkpoint.step,
                results=self._results(calls),
            )
            decision = self.agent.model.decide(state, self.agent.tools)
            decisions += 1
            self.control.check()  # a cancel that arrived during the model call wins
            values = dict(checkpoint.values)
            if isinstance(decision, FinalAnswer):
                message = {"role": "assistant", "content": decision.content or decision.output}
                values["messages"] = [*values.get("messages", []), message]
                values["output"] = decision.output
                final = self._next(checkpoint, values, [])
                steps, self._unsaved = [*self._unsaved, final], []
                update = {
                    "node": "agent",
                    "update": {"messages": [message], "output": decision.output},
                }
                held = self._take_held()
                unwritten = {c["tool_call_id"] for c in held.tool_calls} if held else set()
                return Finished(
                    output=decision.output,
                    values=values,
                    steps=steps,
                    events=[("update", update, "system")],
                    held=held,
                    # (the held calls are added as the end writes them)
                    source=services.source_in_hand(
                        self.run, [c for c in calls.values() if c.tool_call_id not in unwritten]
                    ),
                )
            if not isinstance(decision, ToolCalls) or not decision.calls:
                raise NonRetryableError(f"model of agent {self.agent.id} returned {decision!r}")
            new_calls: list[dict[str, Any]] = []
            for call in decision.calls:
                tcid = call.id or f"call_{secrets.token_hex(8)}"
                while tcid in calls or any(n["tool_call_id"] == tcid for n in new_calls):
                    tcid = f"call_{secrets.token_hex(8)}"
                new_calls.append(
                    {
                        "tool_call_id": tcid,
                        "tool_name": call.name,
                        "args": call.args,
                        "status": ToolCallStatus.PROPOSED,
                    }
                )
            message = {
                "role": "assistant",
                "content": decision.content,
                "tool_calls": [
                    {"id": n["tool_call_id"], "name": n["tool_name"], "args": n["args"]}
                    for n in new_calls
                ],
            }
            values["messages"] = [*values.get("messages", []), message]
            checkpoint = self._next(checkpoint, values, [n["tool_call_id"] for n in new_calls])
            call_events = [
                (
                    "tool_call",
                    {k: n[k] for k in ("tool_call_id", "tool_name", "args")},
                    "system",
                )
                for n in new_calls
            ]
            update = {"node": "agent", "update": {"messages": [message]}}
            events = [("update", update, "system"), *call_events]
            if all(self._at_once(n) == "wait" for n in new_calls):
                # Nothing runs before the suspension: the decision is written with it.
                steps, self._unsaved = [*self._unsaved, checkpoint], []
                waiting = [
                    self._waiting_entry(
                        ToolCall(run_id=self.run.id, step=checkpoint.step, **n),
                        ToolCallStatus.AWAITING_APPROVAL,
                        requires_approval=True,
                    )
                    for n in new_calls
                ]
                plan = services.SuspendPlan(
                    lease=self.lease,
                    waiting=waiting,
                    steps=steps,
                    new_tool_calls=new_calls,
                    events=events,
                    held=self._take_held(),
                )
                return Suspended(plans=[plan], values=checkpoint.values)
            if all(self._at_once(n) == "read" for n in new_calls):
                # Only read-only tools run next: the decision is written with their results.
                for n in new_calls:
                    n["id"], n["step"] = uuid7(), checkpoint.step
                self._hold(checkpoint, new_tool_calls=new_calls, events=events)
                calls.update(
                    {n["tool_call_id"]: ToolCall(run_id=self.run.id, **n) for n in new_calls}
                )
                continue
            first = new_calls[0]
            if self._at_once(first) in ("run", "read"):
                # The first call runs right after the decision: its `running` mark goes with it.
                self.control.check()  # stop before any tool call
                first["status"] = ToolCallStatus.RUNNING
                self._marked_running[first["tool_call_id"]] = ToolCallStatus.PROPOSED
            created = self._save(checkpoint, new_tool_calls=new_calls, events=events)
            calls.update({tc.tool_call_id: tc for tc in created})

    def _at_once(self, call: dict[str, Any]) -> str | None:
        """What `_run_tools` will do first with a proposed call: "run" it, run it and it is
        "read"-only, "wait" for a reviewer, or None (it fails: unknown tool or invalid
        arguments)."""
        tool = self.agent.get_tool(call["tool_name"])
        if tool is None or tool.argument_errors(call["args"]):
            return None
        if tool.needs_approval(call["args"]):
            return "wait"
        return "read" if tool.read_only else "run"

    def _run_tools(
        self, checkpoint: services.StepWrite, calls: dict[str, ToolCall]
    ) -> tuple[list[services.SuspendPlan] | None, services.ToolOutcome | None]:
        """Execute this step's tool calls. Returns suspend plans when any call must wait;
        otherwise the outcome of the call that ran last, which is recorded together with the
        step the loop writes next (every other outcome is recorded as soon as it is known, so
        a later call's crash never re-executes it)."""
        waiting: list[dict[str, Any]] = []
        inner_plans: list[services.SuspendPlan] = []
        last: services.ToolOutcome | None = None
        for tcid in checkpoint.pending:
            tc = calls[tcid]
            if tc.status in RESOLVED:
                continue  # recorded before a crash or a suspension: reuse, never re-execute
            if tc.status in (ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT):
                waiting.append(self._waiting_entry(tc, tc.status))
                continue
            if last is not None:  # another call is handled next: the previous outcome first
                self._record(last)
                last = None
            tool = self.agent.get_tool(tc.tool_name)
            if tool is None:
                self._record(
                    self._outcome(
                        tc, ToolCallStatus.FAILED, {"error": f"unknown tool {tc.tool_name!r}"}
                    )
                )
                continue
            if tc.status == ToolCallStatus.PROPOSED:
                errors = tool.argument_errors(tc.args)
                if errors:
                    self._record(
                        self._outcome(
                            tc,
                            ToolCallStatus.FAILED,
                            {"error": "invalid arguments", "details": errors},
                        )
                    )
                    continue
                if tool.needs_approval(tc.args):
                    waiting.append(
                        self._waiting_entry(
                            tc, ToolCallStatus.AWAITING_APPROVAL, requires_approval=True
                        )
                    )
                    continue
            self.control.check()  # stop before any tool call
            held_call = self._held_call(tc.tool_call_id)
            if held_call is not None:  # read-only, its decision held: written with its result
                held_call["status"], held_call["started_at"] = ToolCallStatus.RUNNING, _now()
            elif tc.tool_call_id in self._marked_running:
                del self._marked_running[tc.tool_call_id]  # marked with its decision or claim
            else:
                self._write_held()
                self._fenced(
                    services.tool_call_update(
                        lease=self.lease, tool_call=tc, status=ToolCallStatus.RUNNING
                    )
                )
            ctx = ToolContext(
                run_id=self.run.id,
                tool_call_id=tc.tool_call_id,
                agent_id=self.agent.id,
                attempt=self.lease.attempt,
                resume_data=tc.resume_data,
                control=self.control,
                executor=self,
            )
            try:
                if held_call is not None:
                    result = self._run_read_only(tool, ctx, tc.args)
                else:
                    result = tool.run(ctx, tc.args)
            except SuspendRequested as s:
                entry = self._waiting_entry(tc, ToolCallStatus.AWAITING_INPUT)
                entry["suspend_payload"] = s.payload
                entry["resume_schema"] = s.resume_schema
                waiting.append(entry)
                continue
            except SubAgentSuspended as s:
                inner_plans.extend(s.plans)
                waiting.append(self._delegation_entry(tc, s))
                continue
            last = self._outcome(tc, ToolCallStatus.SUCCEEDED, result)
        if waiting:
            if last is not None:
                self._record(last)
            return [*inner_plans, services.SuspendPlan(lease=self.lease, waiting=waiting)], None
        return None, last

    def _save(
        self,
        step: services.StepWrite,
        *,
        new_tool_calls: list[dict[str, Any]] | None = None,
        events: list[Event] | None = None,
        outcome: services.ToolOutcome | None = None,
    ) -> list[ToolCall]:
        """Write the step (after what was held, with any unsaved before it); returns the tool
        calls it created, the held ones first."""
        events, outcome = self._outcome_held(list(events or ()), outcome)
        steps, self._unsaved = [*self._unsaved, step], []
        fence = services.run_save_steps(
            lease=self.lease,
            steps=steps,
            new_tool_calls=new_tool_calls or (),
            events=events,
            outcome=outcome,
            held=self._take_held(),
        )
        self._fenced(fence)
        return fence.tool_calls

    # -- writes held for the next one (module docstring) -------------------------------------

    def _hold(
        self,
        step: services.StepWrite,
        *,
        new_tool_calls: list[dict[str, Any]] | None = None,
        events: list[Event] | None = None,
        outcome: services.ToolOutcome | None = None,
    ) -> None:
        """What `_save` would write, held for the next write, in the same order."""
        events, outcome = self._outcome_held(list(events or ()), outcome)
        steps, self._unsaved = [*self._unsaved, step], []
        held = self._held
        outcome_events = [outcome.event] if outcome is not None else []
        held.events += [*outcome_events, *events, *(services.step_event(w) for w in steps)]
        held.steps += steps
        held.tool_calls += new_tool_calls or []
        if outcome is not None:
            held.outcome = outcome

    def _outcome_held(
        self, events: list[Event], outcome: services.ToolOutcome | None
    ) -> tuple[list[Event], services.ToolOutcome | None]:
        """An outcome about to be written or held: folded into its call when that call is held
        (its event first among `events`, where a write puts an outcome's), else returned; a
        second outcome of a written call gets what is held written first (one at a time)."""
        if outcome is None:
            return events, None
        call = self._held_call(outcome.tool_call.tool_call_id)
        if call is not None:
            call.update(status=outcome.status, result=outcome.result, finished_at=_now())
            return [outcome.event, *events], None
        if self._held.outcome is not None:
            self._write_held()
        return events, outcome

    def _held_call(self, tool_call_id: str) -> dict[str, Any] | None:
        return next((c for c in self._held.tool_calls if c["tool_call_id"] == tool_call_id), None)

    def _take_held(self) -> services.HeldWrites | None:
        held, self._held = self._held, services.HeldWrites()
        return held or None

    def _write_held(self) -> None:
        """Make what is held now, as a write of its own (before a write that cannot carry it)."""
        with self._held_lock:
            held = self._take_held()
            if held is not None:
                self._fenced(services.run_save_steps(lease=self.lease, steps=[], held=held))

    def _write_held_quietly(self) -> None:
        try:
            self._write_held()
        except Exception as exc:  # the run stops anyway: its lease lost, cancelled, deleted
            logger.info("run=%s: held writes not made (%s)", self.run.id, type(exc).__name__)

    def _run_read_only(self, tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> Any:
        """Run a read-only tool whose decision is held. Still running after the grace, it gets
        the held writes made from a timer's thread (its own connection), so that a slow
        lookup shows on the run's page as running; a call that waits gets them made first."""
        self._grace_open = True
        timer = threading.Timer(READ_ONLY_GRACE_SECONDS, self._write_held_after_grace)
        timer.daemon = True
        timer.start()
        try:
            result = tool.run(ctx, args)
        except (SuspendRequested, SubAgentSuspended):
            self._close_grace(timer)
            self._write_held()  # a waiting call is written before its suspension
            raise
        except BaseException:
            self._close_grace(timer)
            raise
        self._close_grace(timer)
        return result

    def _write_held_after_grace(self) -> None:
        try:
            with self._held_lock:
                if self._grace_open:
                    held = self._take_held()
                    if held is not None:
                        self._fenced(services.run_save_steps(lease=self.lease, steps=[], held=held))
        except BaseException as exc:  # raised in the loop's thread once the tool returns
            self._held_error = exc
        finally:
            connections.close_all()

    def _close_grace(self, timer: threading.Timer) -> None:
        timer.cancel()
        with self._held_lock:  # a write the timer began is waited for
            self._grace_open = False
            error, self._held_error = self._held_error, None
        if error is not None:
            raise error

    def _fenced(self, fence: services.FenceResult) -> None:
        # Every fenced write also reads the run's cancel request: no NOTIFY needed to see it.
        if fence.cancel_action:
            self.control.request_cancel()

    def _outcome(self, tc: ToolCall, status: str, result: Any) -> services.ToolOutcome:
        """A call's outcome, to record; the loop sees it at once (its messages, its model)."""
        tc.status, tc.result = status, result
        event = (
            "tool_result",
            {
                "tool_call_id": tc.tool_call_id,
                "tool_name": tc.tool_name,
                "status": status,
                "result": result,
            },
            "system",
        )
        return services.ToolOutcome(tool_call=tc, status=status, result=result, event=event)

    def _record(self, outcome: services.ToolOutcome) -> None:
        events, unheld = self._outcome_held([], outcome)
        if unheld is None:  # a held call's: its event waits with it
            self._held.events += events
            return
        self._write_held()
        services.tool_call_update(
            lease=self.lease,
            tool_call=outcome.tool_call,
            status=outcome.status,
            result=outcome.result,
            event=outcome.event,
        )

    def _waiting_entry(
        self, tc: ToolCall, status: str, requires_approval: bool | None = None
    ) -> dict[str, Any]:
        return {
            "tool_call_id": tc.tool_call_id,
            "tool_name": tc.tool_name,
            "args": tc.args,
            "status": status,
            "requires_approval": tc.requires_approval
            if requires_approval is None
            else requires_approval,
            "suspend_payload": tc.suspend_payload,
            "resume_schema": tc.resume_schema,
        }

    def _delegation_entry(self, tc: ToolCall, s: SubAgentSuspended) -> dict[str, Any]:
        child_waiting = s.plans[-1].waiting  # the direct child's plan is the last of its list
        approval = any(w["status"] == ToolCallStatus.AWAITING_APPROVAL for w in child_waiting)
        inputs = [w for w in child_waiting if w["status"] == ToolCallStatus.AWAITING_INPUT]
        return {
            "tool_call_id": tc.tool_call_id,
            "tool_name": tc.tool_name,
            "args": tc.args,
            "status": ToolCallStatus.AWAITING_APPROVAL
            if approval
            else ToolCallStatus.AWAITING_INPUT,
            "requires_approval": approval,
            "suspend_payload": {
                "agent_id": s.agent_id,
                "run_id": str(s.child_run_id),
                "tool_calls": [
                    {
                        k: w.get(k)
                        for k in ("tool_call_id", "tool_name", "args", "status", "suspend_payload")
                    }
                    for w in child_waiting
                ],
            },
            "resume_schema": inputs[0]["resume_schema"]
            if (inputs and not approval and len(inputs) == 1)
            else None,
        }

    # -- called through ToolContext -----------------------------------------------------------

    def emit(self, data: dict[str, Any]) -> None:
        self._write_held()  # the event follows what is held, in the timeline's order
        services.run_emit(lease=self.lease, kind="custom", data=data)

    def delegate(self, ctx: ToolContext, agent_id: str, input: Any) -> Any:
        self._write_held()  # the delegating call is read back
        tc = ToolCall.objects.get(run_id=self.run.id, tool_call_id=ctx.tool_call_id)
        child_lease = services.run_create_child(
            lease=self.lease, tool_call=tc, agent_id=agent_id, input=input
        )
        child = Run.objects.get(id=child_lease.run_id)
        if child.status == RunStatus.SUCCESS:
            return child.output
        if child.status != RunStatus.RUNNING:
            raise NonRetryableError(f"sub-agent run {child.id} ended {child.status}")
        loop = StepLoop(run=child, lease=child_lease, control=self.control)
        outcome = loop.run_until_stop()
        if isinstance(outcome, Suspended):
            raise SubAgentSuspended(outcome.plans, child.id, agent_id)
        services.run_finish(
            lease=child_lease,
            status=RunStatus.SUCCESS,
            output=outcome.output,
            values=outcome.values,
            steps=outcome.steps,
            events=outcome.events,
            held=outcome.held,
        )
        return outcome.output


def error_of(exc: BaseException) -> dict[str, str]:
    return _error_of(exc)
