"""Following a run over HTTP: LangGraph's SSE frames and the `/wait`/`/join` JSON body.

The run's events in the database (RunEvent, ordered by seq) are the truth. A channel-layer
message on `run.<id>` (runs/live.py) only wakes the follower early; without one it re-reads the
database every POLL_SECONDS, so a lost message costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import StreamingHttpResponse
from django.urls import get_script_prefix, set_script_prefix

from runs import selectors, services
from runs.exceptions import RunsError, ValidationFailed
from runs.graphs.streams import frames as graph_frames
from runs.hub import Waiter, hub
from runs.models import RunEvent, RunStatus
from runs.selectors import results

logger = logging.getLogger("runs.api")

HEARTBEAT_SECONDS = 5.0
POLL_SECONDS = 0.5
STOPPED = frozenset(results.STOPPED)
STREAM_MODES = (
    "values",
    "updates",
    "custom",
    "messages",
    "messages-tuple",
    "debug",
    "events",
    "tasks",
    "checkpoints",
)
DISCONNECT_REASON = "client disconnected from the run stream ({})"


# The API handler's thread pool (runsite/handlers.py), set while it serves an async view.
API_EXECUTOR: contextvars.ContextVar[ThreadPoolExecutor | None] = contextvars.ContextVar(
    "API_EXECUTOR", default=None
)


async def on_pool(executor: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on one of the executor's threads, in that thread's own context, as a WSGI
    server's threads run a request: what the call sets there (Django's connections are
    thread-critical, kept per thread either way) stays the thread's.

    asgiref's `sync_to_async` runs the call in a copy of the loop's context and copies it
    back, re-homing each of its Locals (a Django URL resolver holds one apiece: ~20 of them)
    on the way in and out: with it a bare request took ~40 % more instructions in process, a
    `runs.get` ~20 % (docs/benchmarks.md). The one value of the loop's a call needs, the
    request's script prefix, is carried over. (An `async_to_sync` in such a call, an async
    signal receiver's, would run on an event loop of its own, not the server's: the project
    connects none.)"""
    prefix = get_script_prefix()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor, _with_script_prefix, prefix, fn, args)


def _with_script_prefix(prefix: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    set_script_prefix(prefix)
    return fn(*args)


async def db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a database call off the event loop and hand its connection back right after.

    On the API handler's pool when it serves the request (each call is whole: it takes a
    connection and hands it back, so consecutive calls may run on different threads);
    elsewhere (Django's own handler, tests) thread-sensitive, as Django runs sync code. The
    connection goes back to the pool after every call, so a stream that waits for minutes does
    not hold one (outside an atomic block: a test's transaction stays open).
    """

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            if not connection.in_atomic_block:
                connection.close()

    executor = API_EXECUTOR.get()
    if executor is not None:
        return await on_pool(executor, call)
    return await sync_to_async(call)()


class _Heartbeat:
    pass


HEARTBEAT = _Heartbeat()


class RunFollower:
    """Yields a run's events after `after` (or heartbeats) until it stops or is deleted.

    Without events (`with_events=False`: wait, join) only the run's end matters: `outcome`
    reads (status, attempt, result) in one statement (`selectors.run_outcome`), and a change
    published as pending or running wakes the follower without a read; any other change, and
    every poll, reads it. `waiter` is one registered before the run was created (the caller then
    knows its status, `known_status`, and the first read is skipped as well). `known` is an
    outcome the caller has just read: a stopped one ends the follower without a read.
    """

    def __init__(
        self,
        run_id: UUID,
        *,
        after: int = 0,
        with_events: bool = True,
        outcome: Callable[[], tuple[str | None, int, Any]] | None = None,
        waiter: Waiter | None = None,
        known_status: str | None = None,
        known: tuple[str | None, int, Any] | None = None,
        seq_floor: int | None = None,
    ):
        self.run_id = run_id
        # Until the follower reads the run itself, a change carrying the run's end (as the
        # outcome read gives it) answers without a read, if it is not older than this seq.
        self.seq_floor = seq_floor if outcome is not None else None
        self.after = after
        self.with_events = with_events and outcome is None
        self.outcome = outcome
        self.result: Any = None
        self.status: str | None = known_status if waiter is not None else None
        self.attempt = 0
        self._done = False
        if known is not None:
            self.status, self.attempt, self.result = known
            self._done = self.status is None or self.status in STOPPED
        self._waiter = waiter

    async def __aenter__(self) -> RunFollower:
        # Registered with this process's hub before the first read, so a change committed
        # between the read and the wait still wakes us (no channel-layer call per request).
        if self._waiter is None and not self._done:
            self._waiter = hub().watch(self.run_id)
        if self._waiter is not None:
            await self._waiter.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._waiter is not None:
            self._waiter.close()

    def _read(self, limit: int) -> tuple[str | None, int, list[RunEvent]]:
        if self.outcome is not None:
            status, attempt, self.result = self.outcome()
            return status, attempt, []
        return selectors.run_stream_state(self.run_id, after=self.after, limit=limit)

    async def items(self) -> AsyncIterator[RunEvent | _Heartbeat]:
        if self._done:
            return
        assert self._waiter is not None, "use the follower as `async with`"
        waiter = self._waiter
        limit = 200 if self.with_events else 0
        next_beat = time.monotonic() + HEARTBEAT_SECONDS
        read = self.status is None
        while True:
            heard = None
            if read and self.seq_floor is not None:
                heard = waiter.heard_outcome(self.seq_floor)
            if heard is not None:
                self.status, self.attempt, self.result = heard
                return
            if read:
                waiter.clear()
                self.seq_floor = None  # read from here on: the database sees all of it
                status, attempt, events = await db(self._read, limit)
                self.status, self.attempt = status, attempt
                for event in events:
                    self.after = event.seq
                    yield event
                if status is None or (status in STOPPED and len(events) < max(limit, 1)):
                    return
                if events and len(events) >= limit:
                    continue  # a backlog: read on before waiting
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + HEARTBEAT_SECONDS
                yield HEARTBEAT
            woke = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    waiter.event.wait(), timeout=min(POLL_SECONDS, max(0.01, next_beat - now))
                )
                woke = True
            read = self.with_events or not woke or waiter.may_have_stopped
            if not read:
                waiter.event.clear()  # heard "still going": wait on


# --- SSE frames ------------------------------------------------------------------------------


def sse_frame(event: str, data: Any, event_id: int | None = None) -> bytes:
    lines = [f"event: {event}", f"data: {json.dumps(data, separators=(',', ':'), default=str)}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


HEARTBEAT_FRAME = b": heartbeat\r\n\r\n"


def parse_stream_modes(raw: list[str] | str | None) -> list[str]:
    """Modes from a body field or query values: str, list, JSON-array string; empty = all."""
    values: list[Any] = []
    for item in raw if isinstance(raw, list) else [raw]:
        if item is None:
            continue
        text = str(item).strip()
        if text.startswith("["):
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                values.extend(str(v) for v in parsed)
                continue
        values.extend(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in STREAM_MODES]
    if bad:
        raise ValidationFailed.field(
            "stream_mode",
            f"must be one of {STREAM_MODES}",
            detail=f"unknown stream_mode {', '.join(map(repr, bad))}; use {', '.join(STREAM_MODES)}",
        )
    return values


def _messages_of(update: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in update.get("messages", []) if isinstance(m, dict)]


def frames_for(event: RunEvent, modes: list[str]) -> list[tuple[str, Any]]:
    """The (SSE event name, data) pairs a run event becomes under the requested modes."""
    want = set(modes) if modes else set(STREAM_MODES)
    kind, data = event.kind, event.data or {}
    if kind == "graph":  # a chunk of a LangGraph graph's own stream (runs/graphs/streams.py)
        return graph_frames(data, modes, event.seq)
    out: list[tuple[str, Any]] = []
    if kind == "step":
        if "values" in want:
            out.append(("values", data.get("values", {})))
        if "checkpoints" in want:
            out.append(
                (
                    "checkpoints",
                    {
                        "checkpoint_id": data.get("checkpoint_id"),
                        "step": data.get("step"),
                        "values": data.get("values", {}),
                    },
                )
            )
    elif kind == "update":
        node, update = data.get("node", "agent"), data.get("update", {})
        if "updates" in want:
            out.append(("updates", {node: update}))
        meta = {"langgraph_node": node, "run_id": str(event.run_id)}
        for message in _messages_of(update):
            if "messages-tuple" in want:
                out.append(("messages", [message, meta]))
            if "messages" in want:
                out.append(("messages/complete", [message]))
    elif kind == "suspended":
        interrupts = data.get("interrupts", [])
        if "updates" in want:
            out.append(("updates", {"__interrupt__": interrupts}))
        elif "values" in want:
            # Only values asked for: LangGraph still surfaces the interrupt as a values event.
            out.append(("values", {"__interrupt__": interrupts}))
    elif kind == "custom":
        if "custom" in want:
            out.append(("custom", data))
    elif kind in ("tool_call", "tool_result"):
        if "tasks" in want:
            task = {"id": data.get("tool_call_id"), "name": data.get("tool_name")}
            if kind == "tool_call":
                task["input"] = data.get("args")
            else:
                task["result"] = data.get("result")
                task["error"] = None if data.get("status") != "failed" else data.get("result")
            out.append(("tasks", task))
    elif kind == "finished" and data.get("status") in (RunStatus.ERROR, RunStatus.TIMEOUT):
        error = data.get("error") or {}
        out.append(
            (
                "error",
                {
                    "error": error.get("error", "Error"),
                    "message": error.get("message", f"run ended {data.get('status')}"),
                },
            )
        )
    if "debug" in want:
        out.append(("debug", {"type": kind, "step": event.seq, "payload": data}))
    if "events" in want:
        out.append(("events", {"event": kind, "seq": event.seq, "data": data}))
    return out


# --- responses -------------------------------------------------------------------------------


def _cancel_quietly(run_id: UUID, actor: str, reason: str) -> None:
    try:
        run = selectors.run_get(run_id)
        services.run_cancel(run=run, action="interrupt", actor=actor, reason=reason)
    except RunsError:
        pass  # finished (or gone) in the meantime: nothing to cancel


async def _cancel_after_disconnect(run_id: UUID, actor: str, why: str) -> None:
    logger.info("stream: client went away; cancelling run=%s (%s)", run_id, why)
    try:
        await db(_cancel_quietly, run_id, actor, DISCONNECT_REASON.format(why))
    except Exception:
        logger.exception("stream: cancelling run=%s after the client left failed", run_id)


_guards: set[asyncio.Task] = set()


class DisconnectGuard:
    """Cancels a run when its client goes away before the response body is complete.

    It watches the ASGI `http.disconnect` (runsite/asgi.py puts an event for it in the request's
    scope), not the body generator: Django drops a response whose client left while the view
    was still creating the run, and that body never starts, so a `finally` in it never runs.
    Without the scope event (WSGI, tests) the body's own `finally` does the cancel.
    """

    def __init__(self, request: Any, run_id: UUID, actor: str, why: str):
        self.run_id, self.actor, self.why = run_id, actor, why
        self.done = asyncio.Event()
        scope = getattr(request, "scope", None) or {}
        self.disconnected: asyncio.Event | None = scope.get("runsite.disconnected")
        if self.disconnected is not None:
            # A fresh context: the watcher outlives the request, whose thread-sensitive
            # executor (inherited through contextvars) is gone by the time it cancels.
            task = asyncio.get_running_loop().create_task(
                self._watch(), context=contextvars.Context()
            )
            _guards.add(task)
            task.add_done_callback(_guards.discard)

    @property
    def watching(self) -> bool:
        return self.disconnected is not None

    async def _watch(self) -> None:
        assert self.disconnected is not None
        waiters = [
            asyncio.ensure_future(self.disconnected.wait()),
            asyncio.ensure_future(self.done.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=24 * 3600, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if self.disconnected.is_set() and not self.done.is_set():
            await _cancel_after_disconnect(self.run_id, self.actor, self.why)

    async def body_ended(self, completed: bool) -> None:
        if completed:
            self.done.set()
        elif not self.watching:
            await _cancel_after_disconnect(self.run_id, self.actor, self.why)


def disconnect_guard(
    request: Any, run_id: UUID, actor: str, why: str | None
) -> DisconnectGuard | None:
    return DisconnectGuard(request, run_id, actor, why) if why else None


async def sse_events(
    run_id: UUID,
    *,
    modes: list[str],
    after: int,
    attempt: int,
    guard: DisconnectGuard | None = None,
) -> AsyncIterator[bytes]:
    """metadata, the run's frames after `after`, heartbeats, then `end` {run_id, status}."""
    completed = False
    try:
        yield sse_frame("metadata", {"run_id": str(run_id), "attempt": attempt})
        async with RunFollower(run_id, after=after) as follower:
            async for item in follower.items():
                if isinstance(item, _Heartbeat):
                    yield HEARTBEAT_FRAME
                    continue
                for name, data in frames_for(item, modes):
                    yield sse_frame(name, data, item.seq)
            status = follower.status or "rolled_back"
        yield sse_frame("end", {"run_id": str(run_id), "status": status})
        completed = True
    finally:
        if guard is not None:
            await guard.body_ended(completed)


async def result_body(
    run_id: UUID,
    *,
    thread_id: UUID | None,
    guard: DisconnectGuard | None = None,
    waiter: Waiter | None = None,
    known: tuple[str | None, int, Any] | None = None,
    seq_floor: int | None = None,
) -> AsyncIterator[bytes]:
    """`\\n` keep-alives while the run is going, then one JSON value (LangGraph /wait body).

    `waiter`: registered before the run was created, which left it pending. `known`: the run's
    outcome as just read (`selectors.run_outcome`); a stopped run is answered from it.
    `seq_floor`: the run's seq as the caller read it (`RunFollower`)."""
    completed = False
    try:
        follower = RunFollower(
            run_id,
            outcome=lambda: selectors.run_outcome(run_id, thread_id=thread_id),
            waiter=waiter,
            known_status=RunStatus.PENDING,
            known=known,
            seq_floor=seq_floor,
        )
        async with follower:
            async for _item in follower.items():
                yield b"\n"
        yield json.dumps(follower.result, default=str).encode()
        completed = True
    finally:
        if guard is not None:
            await guard.body_ended(completed)


def sse_response(body: AsyncIterator[bytes], headers: dict[str, str]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-store"
    response["X-Accel-Buffering"] = "no"
    for key, value in headers.items():
        response[key] = value
    return response


def json_stream_response(
    body: AsyncIterator[bytes], headers: dict[str, str], status: int = 200
) -> StreamingHttpResponse:
    response = StreamingHttpResponse(body, content_type="application/json", status=status)
    response["X-Accel-Buffering"] = "no"
    for key, value in headers.items():
        response[key] = value
    return response
