"""Executing a claimed graph run in the worker, under its lease (runs/engine/worker.py).

One event loop per run on the worker's executor thread drives `graph.astream(...)` (so async
nodes run, and a cancel can stop a node that awaits), with the Runsite checkpointer bound to
the run's lease and `durability="sync"`: a super-step is durable, and fenced, before the next
one starts. A watcher turns the worker's RunControl into LangGraph's: cancel, timeout and a
lost lease cancel the graph's task at once (a node that awaits stops there; completed
super-steps are kept), a shutdown drains it between super-steps.

The run id is the graph's run id on every attempt and every resume, so LangGraph sees a retry
as re-entry into the same run, never as new input.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
from typing import Any

from django.db import DatabaseError
from langgraph.errors import GraphDrained
from langgraph.runtime import RunControl as GraphControl
from langgraph.types import Command, Send

from runs.contracts import FenceResult, Lease
from runs.engine.context import NonRetryableError, RunControl, RunStopped
from runs.engine.loop import Finished
from runs.exceptions import LeaseLost
from runs.graphs.checkpointer import RunsiteSaver
from runs.graphs.interrupts import BREAKPOINT_PREFIX, breakpoint_waiting, resume_value, waiting_for
from runs.graphs.jsonable import to_json
from runs.graphs.loader import GraphAgent
from runs.graphs.streams import event_of, recorded_modes
from runs.models import GraphCheckpoint, Run, ToolCall, ToolCallStatus
from runs.services import graphs as graph_services

logger = logging.getLogger("runs.graphs")

WATCH_SECONDS = 0.02
STAY = object()  # invoke nothing: the run ends at the breakpoint it was stopped at
DECIDED = (ToolCallStatus.ANSWERED, ToolCallStatus.APPROVED, ToolCallStatus.DECLINED)
# Configurable keys the server owns (LangGraph's own server forces the same ones).
RESERVED_CONFIGURABLE = ("thread_id", "checkpoint_id", "checkpoint_ns", "checkpoint_map", "run_id")


def command_of(raw: dict[str, Any]) -> Command:
    """A request's `command` ({update, goto, resume}) as a LangGraph Command."""
    goto = raw.get("goto")
    if isinstance(goto, dict):
        goto = Send(goto["node"], goto.get("input"))
    elif isinstance(goto, list):
        goto = [Send(g["node"], g.get("input")) if isinstance(g, dict) else g for g in goto]
    update = raw.get("update")
    if isinstance(update, list):
        update = [tuple(pair) for pair in update]
    return Command(update=update, goto=goto or (), resume=raw.get("resume"))


def run_config(run: Run, agent: GraphAgent) -> dict[str, Any]:
    kwargs = run.kwargs or {}
    user = kwargs.get("config") or {}
    configurable = {
        k: v for k, v in (user.get("configurable") or {}).items() if k not in RESERVED_CONFIGURABLE
    }
    configurable.update(thread_id=str(run.thread_id), run_id=str(run.id))
    metadata = {**(user.get("metadata") or {}), **(run.metadata or {})}
    metadata.update(run_id=str(run.id), graph_id=agent.id, assistant_id=agent.id)
    config: dict[str, Any] = {"configurable": configurable, "metadata": metadata}
    for key in ("tags", "run_name", "recursion_limit"):
        if user.get(key) is not None:
            config[key] = user[key]
    return config


class GraphLoop:
    """Same contract as engine.loop.StepLoop: run_until_stop() returns Finished, or the status
    string of a run it suspended itself; raises RunStopped / LeaseLost / NonRetryableError."""

    def __init__(self, *, run: Run, lease: Lease, control: RunControl, agent: GraphAgent):
        self.run = run
        self.lease = lease
        self.control = control
        self.agent = agent
        self._events: list[tuple[str, dict[str, Any], str]] = []
        self._events_lock = threading.Lock()

    # -- events gathered between writes --------------------------------------------------------

    def _take_events(self) -> list[tuple[str, dict[str, Any], str]]:
        with self._events_lock:
            events, self._events = self._events, []
        return events

    def _on_fence(self, fence: FenceResult) -> None:
        # Every fenced write also reads the run's cancel request: no NOTIFY needed to see it.
        if fence.cancel_action:
            self.control.request_cancel()

    # -- the run -------------------------------------------------------------------------------

    def run_until_stop(self) -> Finished | str:
        return asyncio.run(self._run())

    async def _run(self) -> Finished | str:
        saver = RunsiteSaver(
            lease=self.lease,
            value_keys=self.agent.value_keys,
            take_events=self._take_events,
            on_fence=self._on_fence,
        )
        base = self.agent.graph
        graph = base.copy(update={"checkpointer": saver, "config": copy.deepcopy(base.config)})
        config = run_config(self.run, self.agent)
        try:
            graph_input, config = await saver._call(self._input, graph, config)
            if graph_input is not STAY:
                await self._stream(graph, saver, graph_input, config)
            return await saver._call(self._outcome, graph, saver, config)
        finally:
            saver.close()

    def _input(self, graph: Any, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """What to invoke the graph with: answers to its interrupts, nothing (continue after a
        crash or a breakpoint), a command, or the run's input (runs on the saver's thread)."""
        kwargs = self.run.kwargs or {}
        started = GraphCheckpoint.objects.filter(run_id=self.run.id).exists()
        if started:
            state = graph.get_state(config)
            pending = {i.id for i in state.interrupts}
            decided = list(
                ToolCall.objects.filter(run_id=self.run.id, status__in=DECIDED).order_by(
                    "created_at", "id"
                )
            )
            answers = {
                tc.tool_call_id: resume_value(tc) for tc in decided if tc.tool_call_id in pending
            }
            if answers:
                return Command(resume=answers), config
            head_id = (state.config or {}).get("configurable", {}).get("checkpoint_id")
            breakpoint_id = f"{BREAKPOINT_PREFIX}{head_id}"
            if any(
                tc.tool_call_id == breakpoint_id and tc.status == ToolCallStatus.DECLINED
                for tc in decided
            ):
                return STAY, config  # a declined breakpoint: the run ends where it stopped
            return None, config  # a retry, or past a breakpoint: continue from the head
        if kwargs.get("checkpoint_id"):
            # Time travel: run from that checkpoint; the new checkpoints branch off it.
            config = {
                **config,
                "configurable": {
                    **config["configurable"],
                    "checkpoint_id": kwargs["checkpoint_id"],
                    "checkpoint_ns": "",
                },
            }
        command = kwargs.get("command")
        if command:
            return command_of(command), config
        return self.run.input, config

    async def _stream(
        self, graph: Any, saver: RunsiteSaver, graph_input: Any, config: dict[str, Any]
    ) -> None:
        kwargs = self.run.kwargs or {}
        control = GraphControl()
        options: dict[str, Any] = {
            "stream_mode": recorded_modes(kwargs.get("stream_mode")),
            "durability": kwargs.get("durability") or "sync",
            "control": control,
            "subgraphs": bool(kwargs.get("stream_subgraphs")),
        }
        for key in ("interrupt_before", "interrupt_after"):
            if kwargs.get(key):
                options[key] = kwargs[key]
        if kwargs.get("context") is not None:
            options["context"] = kwargs["context"]

        async def consume() -> None:
            async for item in graph.astream(graph_input, config, **options):
                ns, mode, chunk = item if len(item) == 3 else ((), *item)
                event = event_of(tuple(ns), mode, chunk)
                if event is None:
                    continue
                with self._events_lock:
                    self._events.append(event)
                if mode in ("custom", "messages"):
                    # Live data from inside a node: written now, not at the next checkpoint.
                    events = self._take_events()
                    fence = await saver._call(
                        graph_services.graph_run_events, lease=self.lease, events=events
                    )
                    if fence is not None:
                        self._on_fence(fence)

        task = asyncio.ensure_future(consume())
        stop: str | None = None
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_SECONDS)
                if task.done():
                    break
                stop = self._stop_reason()
                if stop == "release":
                    control.request_drain("shutdown")
                elif stop is not None:
                    task.cancel()
                    break
            await task
        except asyncio.CancelledError:
            raise RunStopped(stop or "cancel") from None
        except GraphDrained:
            raise RunStopped(self._stop_reason() or "release") from None
        except (RunStopped, LeaseLost):
            raise
        except DatabaseError:
            raise  # the worker records the failure and retries the run
        except Exception as exc:
            # A node raised (or the graph hit its recursion limit): the `__error__` write stays
            # on the checkpoint, as with LangGraph's server; a retry would only repeat it.
            raise NonRetryableError(f"{type(exc).__name__}: {exc}") from exc

    def _stop_reason(self) -> str | None:
        c = self.control
        if c.lost:
            return "lost"
        if c.cancel:
            return "cancel"
        if c.timed_out():
            return "timeout"
        if c.release:
            return "release"
        return None

    def _outcome(self, graph: Any, saver: RunsiteSaver, config: dict[str, Any]) -> Finished | str:
        """Finished, or suspended on the graph's pending interrupts / a static breakpoint."""
        head = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
        state = graph.get_state(head)
        values = to_json(state.values) if isinstance(state.values, dict) else {}
        events = self._take_events()
        step = int((state.metadata or {}).get("step", 0) or 0) + 1
        waiting = waiting_for([t for t in state.tasks if t.interrupts], step=step)
        if not waiting and state.next:
            checkpoint_id = state.config["configurable"]["checkpoint_id"]
            answered = ToolCall.objects.filter(
                run_id=self.run.id, tool_call_id=f"{BREAKPOINT_PREFIX}{checkpoint_id}"
            ).exists()
            if answered:
                # Declined: the run ends here, the thread stays paused before `next`.
                return Finished(output=values, values=values, steps=[], events=events)
            waiting = [breakpoint_waiting(checkpoint_id, list(state.next), step)]
        if waiting:
            return graph_services.graph_run_suspend(
                lease=self.lease, waiting=waiting, values=values, events=events
            )
        return Finished(output=values, values=values, steps=[], events=events)
