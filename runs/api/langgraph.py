"""The LangGraph-compatible surface: assistants, threads, runs (what langgraph_sdk calls).

Literal paths (/threads/search, /runs/stream, /runs/cancel, …) are registered before the
parameterised ones: Django resolves the first matching pattern and ninja then dispatches by
method, so `/threads/{thread_id}` first would answer POST /threads/search with 405.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Query, Router, Status

from runs import selectors, services
from runs.api import graphs as graph_api
from runs.api import presenters as p
from runs.api import streaming
from runs.api.auth import Caller, caller_of
from runs.api.schemas import (
    KWARG_FIELDS,
    AssistantOut,
    AssistantSchemasOut,
    AssistantSearchIn,
    ClampedLimit,
    ClampedOffset,
    GraphOut,
    HistoryIn,
    RunCreateIn,
    RunOut,
    RunsCancelIn,
    StateAtCheckpointIn,
    ThreadCountIn,
    ThreadCreateIn,
    ThreadOut,
    ThreadPatchIn,
    ThreadPruneIn,
    ThreadPruneOut,
    ThreadSearchIn,
    ThreadStateOut,
    ThreadStateUpdateIn,
    ThreadStateUpdateOut,
    errors,
)
from runs.engine.agent import Agent
from runs.engine.registry import all_agents
from runs.exceptions import NotFound, ValidationFailed
from runs.hub import Waiter, hub
from runs.ids import uuid7
from runs.models import Run, Thread

assistants = Router(tags=["assistants"])
threads = Router(tags=["threads"])
runs = Router(tags=["runs"])

SSE_200 = {
    "responses": {
        "200": {
            "description": "Server-sent events: metadata, values/updates/custom/…, end",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    }
}
JSON_BODY_200 = {
    "responses": {
        "200": {
            "description": "Newline keep-alives, then one JSON value: the final state values, "
            '{"__interrupt__": [...]} for a suspended run, or {"__error__": {...}}',
            "content": {"application/json": {"schema": {}}},
        }
    }
}


# --- assistants ------------------------------------------------------------------------------


def _agent_or_404(assistant_id: str) -> Agent:
    agent = p.find_agent(assistant_id)
    if agent is None:
        raise NotFound(f"Assistant {assistant_id} not found", code="assistant_not_found")
    return agent


@assistants.post("/assistants/search", response={200: list[AssistantOut], **errors()})
def search_assistants(
    request: HttpRequest, payload: AssistantSearchIn, response: HttpResponse
) -> list[dict[str, Any]]:
    rows = [p.assistant_out(a) for a in all_agents().values()]
    if payload.graph_id:
        rows = [r for r in rows if r["graph_id"] == payload.graph_id]
    if payload.name:
        rows = [r for r in rows if payload.name.lower() in r["name"].lower()]
    if payload.metadata:
        rows = [
            r for r in rows if all(r["metadata"].get(k) == v for k, v in payload.metadata.items())
        ]
    rows.sort(
        key=lambda r: str(r[payload.sort_by or "created_at"]),
        reverse=(payload.sort_order or "desc") == "desc",
    )
    page = rows[payload.offset : payload.offset + payload.limit]
    response["X-Pagination-Total"] = str(len(rows))
    if payload.offset + payload.limit < len(rows):
        response["X-Pagination-Next"] = str(payload.offset + payload.limit)
    return page


@assistants.get("/assistants/{assistant_id}", response={200: AssistantOut, **errors(404)})
def get_assistant(request: HttpRequest, assistant_id: str) -> dict[str, Any]:
    return p.assistant_out(_agent_or_404(assistant_id))


@assistants.get(
    "/assistants/{assistant_id}/schemas", response={200: AssistantSchemasOut, **errors(404)}
)
def get_assistant_schemas(request: HttpRequest, assistant_id: str) -> dict[str, Any]:
    agent = _agent_or_404(assistant_id)
    if (graph_schemas := graph_api.schemas_of(agent)) is not None:
        return graph_schemas
    return {
        "graph_id": agent.id,
        "input_schema": agent.input_schema,
        "output_schema": agent.output_schema,
        "state_schema": {
            "type": "object",
            "properties": {"messages": {"type": "array"}, "output": {}},
        },
        "config_schema": None,
        "context_schema": None,
    }


@assistants.get("/assistants/{assistant_id}/graph", response={200: GraphOut, **errors(404)})
def get_assistant_graph(
    request: HttpRequest, assistant_id: str, xray: bool = False
) -> dict[str, list[dict[str, Any]]]:
    if (drawn := graph_api.drawing_of(_agent_or_404(assistant_id), xray)) is not None:
        return drawn
    nodes = [{"id": n, "type": "runnable", "data": n} for n in ("__start__", "agent", "tools")]
    nodes.append({"id": "__end__", "type": "runnable", "data": "__end__"})
    edges = [
        {"source": "__start__", "target": "agent", "conditional": False},
        {"source": "agent", "target": "tools", "conditional": True},
        {"source": "agent", "target": "__end__", "conditional": True},
        {"source": "tools", "target": "agent", "conditional": False},
    ]
    return {"nodes": nodes, "edges": edges}


# --- threads ---------------------------------------------------------------------------------


@threads.post("/threads", response={200: ThreadOut, **errors(409)})
def create_thread(request: HttpRequest, payload: ThreadCreateIn) -> Thread:
    payload.refuse_unsupported()
    caller = caller_of(request)
    thread = services.thread_create(
        metadata=payload.metadata,
        thread_id=payload.thread_id,
        if_exists=payload.if_exists or "raise",
        pinned_resource_id=caller.pinned_resource_id,
        ttl=payload.ttl,
    )
    return p.with_interrupts(thread)


@threads.post("/threads/search", response={200: list[ThreadOut], **errors()})
def search_threads(
    request: HttpRequest, payload: ThreadSearchIn, response: HttpResponse
) -> list[Thread]:
    payload.refuse_unsupported()
    caller = caller_of(request)
    page = selectors.threads_search(
        metadata=payload.metadata,
        values=payload.values,
        status=payload.status,
        ids=payload.ids,
        limit=payload.limit,
        offset=payload.offset,
        sort_by=payload.sort_by,
        sort_order=payload.sort_order,
        pinned_resource_id=caller.pinned_resource_id,
    )
    interrupted = [t.id for t in page.items if t.status == "interrupted"]
    interrupts = selectors.threads_interrupts(interrupted) if interrupted else {}
    response["X-Pagination-Total"] = str(page.total)
    if payload.offset + len(page.items) < page.total:
        response["X-Pagination-Next"] = str(payload.offset + len(page.items))
    return [p.with_interrupts(t, interrupts.get(t.id, {})) for t in page.items]


@threads.post("/threads/count", response={200: int, **errors()})
def count_threads(request: HttpRequest, payload: ThreadCountIn) -> int:
    caller = caller_of(request)
    page = selectors.threads_search(
        metadata=payload.metadata,
        values=payload.values,
        status=payload.status,
        limit=0,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return page.total


@threads.post("/threads/prune", response={200: ThreadPruneOut, **errors()})
def prune_threads(request: HttpRequest, payload: ThreadPruneIn) -> dict[str, int]:
    caller = caller_of(request)
    pruned = services.threads_prune(
        thread_ids=payload.thread_ids,
        strategy=payload.strategy,
        actor=caller.actor,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {"pruned_count": pruned}


@threads.get("/threads/{thread_id}", response={200: ThreadOut, **errors(404)})
def get_thread(request: HttpRequest, thread_id: UUID, include: str | None = None) -> Thread:
    caller = caller_of(request)
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    return p.with_interrupts(thread)


@threads.patch("/threads/{thread_id}", response={200: ThreadOut, 204: None, **errors(404)})
def patch_thread(
    request: HttpRequest, thread_id: UUID, payload: ThreadPatchIn
) -> Thread | Status[None]:
    payload.refuse_unsupported()
    caller = caller_of(request)
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    thread = services.thread_update(thread=thread, metadata=payload.metadata, ttl=payload.ttl)
    if "return=minimal" in request.headers.get("Prefer", ""):
        return Status(204, None)
    return p.with_interrupts(thread)


@threads.delete("/threads/{thread_id}", response={204: None, **errors(404)})
def delete_thread(request: HttpRequest, thread_id: UUID) -> Status[None]:
    caller = caller_of(request)
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    services.thread_delete(thread=thread, actor=caller.actor)
    return Status(204, None)


def _state_of(thread: Thread) -> dict[str, Any]:
    checkpoint = selectors.latest_checkpoint(thread_id=thread.id)
    interrupts = {}
    if thread.status == "interrupted":
        interrupts = selectors.threads_interrupts([thread.id]).get(thread.id, {})
    return p.state_out(thread, checkpoint, interrupts)


@threads.get("/threads/{thread_id}/state", response={200: ThreadStateOut, **errors(404)})
def get_thread_state(
    request: HttpRequest, thread_id: UUID, subgraphs: bool = False
) -> dict[str, Any]:
    caller = caller_of(request)
    if (graph_state := graph_api.state_for(caller, thread_id)) is not None:
        return graph_state  # a LangGraph graph's thread: runs/graphs
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    return _state_of(thread)


@threads.post(
    "/threads/{thread_id}/state", response={200: ThreadStateUpdateOut, **errors(404, 409)}
)
def update_thread_state(
    request: HttpRequest, thread_id: UUID, payload: ThreadStateUpdateIn
) -> dict[str, Any]:
    graph_ref = graph_api.update_state_for(caller_of(request), thread_id, payload)
    if graph_ref is not None:
        return graph_ref  # as_node and checkpoint_id work on graph threads
    # values=None as "__end__" clears what the thread waits on: the Agent Inbox's "mark as
    # resolved". Any other as_node stays refused for Runsite agents.
    resolving = payload.as_node == "__end__" and payload.values is None
    if resolving:
        payload.as_node = None
    payload.refuse_unsupported()
    caller = caller_of(request)
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    checkpoint = None
    if resolving:
        checkpoint = services.thread_resolve_suspended(thread=thread, actor=caller.actor)
    if checkpoint is None:  # nothing waited: an ordinary state write
        checkpoint = services.thread_update_state(
            thread=thread, values=payload.values, actor=caller.actor
        )
    ref = {"thread_id": thread.id, "checkpoint_ns": "", "checkpoint_id": checkpoint.id}
    return {"checkpoint": ref, "configurable": ref, "checkpoint_id": checkpoint.id}


@threads.post(
    "/threads/{thread_id}/state/checkpoint", response={200: ThreadStateOut, **errors(404)}
)
def get_thread_state_at_checkpoint(
    request: HttpRequest, thread_id: UUID, payload: StateAtCheckpointIn
) -> dict[str, Any]:
    caller = caller_of(request)
    if (graph_state := graph_api.state_for(caller, thread_id, payload.checkpoint)) is not None:
        return graph_state
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    checkpoint_id = p.checkpoint_id_from(payload.checkpoint)
    if checkpoint_id is None:
        return _state_of(thread)
    return p.state_out(thread, selectors.thread_checkpoint(thread, checkpoint_id))


@threads.get(
    "/threads/{thread_id}/state/{checkpoint_id}",
    response={200: ThreadStateOut, **errors(404)},
)
def get_thread_state_at(
    request: HttpRequest, thread_id: UUID, checkpoint_id: UUID, subgraphs: bool = False
) -> dict[str, Any]:
    caller = caller_of(request)
    if (graph_state := graph_api.state_for(caller, thread_id, checkpoint_id)) is not None:
        return graph_state
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    return p.state_out(thread, selectors.thread_checkpoint(thread, checkpoint_id))


def _history(caller: Caller, thread_id: UUID, limit: int, before: Any) -> list[dict[str, Any]]:
    if (graph_history := graph_api.history_for(caller, thread_id, limit, before)) is not None:
        return graph_history
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    before_id = p.checkpoint_id_from(before)
    checkpoints = selectors.thread_history(thread, limit=limit, before=before_id)
    interrupts = {}
    if thread.status == "interrupted" and before_id is None:
        interrupts = selectors.threads_interrupts([thread.id]).get(thread.id, {})
    # Only the newest checkpoint is waiting on a human; older ones are plain history.
    return [
        p.state_out(thread, cp, interrupts if i == 0 else None) for i, cp in enumerate(checkpoints)
    ]


@threads.get("/threads/{thread_id}/history", response={200: list[ThreadStateOut], **errors(404)})
def get_thread_history(
    request: HttpRequest, thread_id: UUID, limit: ClampedLimit = 10, before: str | None = None
) -> list[dict[str, Any]]:
    return _history(caller_of(request), thread_id, limit, before)


@threads.post("/threads/{thread_id}/history", response={200: list[ThreadStateOut], **errors(404)})
def post_thread_history(
    request: HttpRequest, thread_id: UUID, payload: HistoryIn
) -> list[dict[str, Any]]:
    payload.refuse_unsupported()
    return _history(caller_of(request), thread_id, payload.limit, payload.before)


# --- runs ------------------------------------------------------------------------------------

# Request fields recorded in the run's `kwargs` (LangGraph's Run.kwargs).


def _create_run(
    caller: Caller,
    payload: RunCreateIn,
    thread_id: UUID | None,
    stream_mode: list[str],
    run_id: UUID | None = None,
) -> Run:
    if graph_api.graph_agent_for(payload.assistant_id) is not None:  # runs/api/graphs.py
        return graph_api.create_run(caller, payload, thread_id, stream_mode, run_id)
    payload.refuse_unsupported()
    agent_id = p.agent_id_for_run(payload.assistant_id)
    command = payload.command_given()
    kwargs = {k: v for k in KWARG_FIELDS if (v := getattr(payload, k)) is not None}
    kwargs["stream_mode"] = stream_mode
    if command:
        kwargs["command"] = command
    return services.run_create(
        agent_id=agent_id,
        actor=caller.actor,
        thread_id=thread_id,
        input=payload.input,
        command=command,  # when both are given, command wins (LangGraph)
        metadata=payload.run_metadata(),
        kwargs=kwargs,
        multitask_strategy=payload.multitask_strategy or "enqueue",
        if_not_exists=payload.if_not_exists or "reject",
        after_seconds=payload.after_seconds,
        pinned_resource_id=caller.pinned_resource_id,
        webhook=payload.webhook or "",
        run_id=run_id,
    )


def _run_path(run: Run) -> str:
    return _path_of(run.thread_id, run.id)


def _path_of(thread_id: UUID | None, run_id: UUID) -> str:
    # Relative to the API root, as the SDK resolves Location against its base URL (…/api).
    return f"/threads/{thread_id}/runs/{run_id}"


def _followed(
    request: HttpRequest, caller: Caller, run: Run, follow: str, cancel_why: str | None
) -> tuple[streaming.DisconnectGuard | None, dict[str, str]]:
    """What every response following a run needs: the guard that cancels the run when the
    client leaves (`cancel_why` set), and Location (…/stream or …/join) + Content-Location."""
    base = _run_path(run)
    guard = streaming.disconnect_guard(request, run.id, caller.actor, cancel_why)
    return guard, {"Location": f"{base}/{follow}", "Content-Location": base}


def _sse_of(
    request: HttpRequest,
    caller: Caller,
    run: Run,
    *,
    modes: list[str],
    after: int,
    cancel_why: str | None,
) -> StreamingHttpResponse:
    guard, headers = _followed(request, caller, run, "stream", cancel_why)
    body = streaming.sse_events(
        run.id, modes=modes, after=after, attempt=p.stream_attempt(run), guard=guard
    )
    return streaming.sse_response(body, headers)


def _result_of(
    request: HttpRequest,
    caller: Caller,
    run: Run,
    *,
    cancel_why: str | None,
    waiter: Waiter | None = None,
    known: tuple[str | None, int, Any] | None = None,
) -> StreamingHttpResponse:
    guard, headers = _followed(request, caller, run, "join", cancel_why)
    body = streaming.result_body(
        run.id,
        thread_id=run.thread_id,
        guard=guard,
        waiter=waiter,
        known=known,
        seq_floor=run.last_seq,
    )
    return streaming.json_stream_response(body, headers)


def _on_disconnect(payload: RunCreateIn) -> str | None:
    return "on_disconnect=cancel" if payload.on_disconnect == "cancel" else None


async def _stream_new_run(
    request: HttpRequest, payload: RunCreateIn, thread_id: UUID | None
) -> StreamingHttpResponse:
    caller = caller_of(request)
    modes = streaming.parse_stream_modes(payload.stream_mode) or ["values"]
    run = await streaming.db(_create_run, caller, payload, thread_id, modes)
    # A resumed run streams from the decision on; a new run from its first event.
    after = run.last_seq if payload.command_given() else 0
    return _sse_of(
        request, caller, run, modes=modes, after=after, cancel_why=_on_disconnect(payload)
    )


async def _wait_new_run(
    request: HttpRequest, payload: RunCreateIn, thread_id: UUID | None
) -> StreamingHttpResponse:
    caller = caller_of(request)
    modes = streaming.parse_stream_modes(payload.stream_mode) or ["values"]
    # Watched before it exists: the run's changes from its creation on wake this request, so
    # it reads the database only once the run may have ended (not after the create, nor on
    # "running").
    run_id = uuid7()
    waiter = hub().watch(run_id)
    try:
        run = await streaming.db(_create_run, caller, payload, thread_id, modes, run_id)
    except BaseException:
        waiter.close()
        raise
    cancel_why = _on_disconnect(payload)
    if run.id != run_id:  # a resumed run: followed from a read, as join does
        waiter.close()
        return _result_of(request, caller, run, cancel_why=cancel_why)
    return _result_of(request, caller, run, cancel_why=cancel_why, waiter=waiter)


# Stateless runs (a temporary thread is created for each).


@runs.post("/runs/stream", response=errors(404, 409), openapi_extra=SSE_200)
async def stream_stateless_run(request: HttpRequest, payload: RunCreateIn) -> StreamingHttpResponse:
    return await _stream_new_run(request, payload, None)


@runs.post("/runs/wait", response=errors(404, 409), openapi_extra=JSON_BODY_200)
async def wait_stateless_run(request: HttpRequest, payload: RunCreateIn) -> StreamingHttpResponse:
    return await _wait_new_run(request, payload, None)


@runs.post("/runs/batch", response={200: list[RunOut], **errors(404, 409)})
def create_runs_batch(request: HttpRequest, payload: list[RunCreateIn]) -> list[Run]:
    caller = caller_of(request)
    if not payload:
        raise ValidationFailed.field("body", "empty", detail="a batch needs at least one run")
    for item in payload:
        item.refuse_unsupported()  # before any run of the batch is created
    return [
        _create_run(caller, item, None, streaming.parse_stream_modes(item.stream_mode))
        for item in payload
    ]


@runs.post("/runs/cancel", response={204: None, **errors(404)})
def cancel_runs(
    request: HttpRequest, payload: RunsCancelIn, action: str | None = None
) -> Status[None]:
    caller = caller_of(request)
    services.runs_cancel_many(
        action="rollback" if action == "rollback" else "interrupt",
        actor=caller.actor,
        run_ids=payload.run_ids,
        thread_id=payload.thread_id,
        status=payload.status,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return Status(204, None)


@runs.post("/runs", response={200: RunOut, **errors(404, 409)})
def create_stateless_run(request: HttpRequest, payload: RunCreateIn, response: HttpResponse) -> Run:
    caller = caller_of(request)
    modes = streaming.parse_stream_modes(payload.stream_mode) or ["values"]
    run = _create_run(caller, payload, None, modes)
    response["Content-Location"] = _run_path(run)
    return run


# Stateful runs.


@runs.post("/threads/{thread_id}/runs/stream", response=errors(404, 409), openapi_extra=SSE_200)
async def stream_run(
    request: HttpRequest, thread_id: UUID, payload: RunCreateIn
) -> StreamingHttpResponse:
    return await _stream_new_run(request, payload, thread_id)


@runs.post("/threads/{thread_id}/runs/wait", response=errors(404, 409), openapi_extra=JSON_BODY_200)
async def wait_run(
    request: HttpRequest, thread_id: UUID, payload: RunCreateIn
) -> StreamingHttpResponse:
    return await _wait_new_run(request, payload, thread_id)


@runs.post("/threads/{thread_id}/runs", response={200: RunOut, **errors(404, 409)})
def create_run(
    request: HttpRequest, thread_id: UUID, payload: RunCreateIn, response: HttpResponse
) -> Run:
    caller = caller_of(request)
    modes = streaming.parse_stream_modes(payload.stream_mode) or ["values"]
    run = _create_run(caller, payload, thread_id, modes)
    response["Content-Location"] = _run_path(run)
    return run


@runs.get("/threads/{thread_id}/runs", response={200: list[RunOut], **errors(404)})
def list_runs(
    request: HttpRequest,
    thread_id: UUID,
    limit: ClampedLimit = 10,
    offset: ClampedOffset = 0,
    status: str | None = None,
    select: list[str] | None = Query(None),  # noqa: B008 - ninja's way to declare a query list
) -> list[Run]:
    caller = caller_of(request)
    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    return selectors.thread_runs(thread, limit=limit, offset=max(0, offset), status=status)


@runs.get("/threads/{thread_id}/runs/{run_id}", response={200: RunOut, **errors(404)})
def get_run(request: HttpRequest, thread_id: UUID, run_id: UUID) -> Run:
    caller = caller_of(request)
    return selectors.run_get(
        run_id, pinned_resource_id=caller.pinned_resource_id, thread_id=thread_id
    )


@runs.delete("/threads/{thread_id}/runs/{run_id}", response={204: None, **errors(404, 409)})
def delete_run(request: HttpRequest, thread_id: UUID, run_id: UUID) -> Status[None]:
    caller = caller_of(request)
    run = selectors.run_get(
        run_id, pinned_resource_id=caller.pinned_resource_id, thread_id=thread_id
    )
    services.run_delete(run=run, actor=caller.actor, pinned_resource_id=caller.pinned_resource_id)
    return Status(204, None)


def _cancel_on_disconnect(value: str | None) -> str | None:
    return "cancel_on_disconnect" if p.as_bool(value) else None


@runs.get(
    "/threads/{thread_id}/runs/{run_id}/join",
    response=errors(404),
    openapi_extra=JSON_BODY_200,
)
async def join_run(
    request: HttpRequest, thread_id: UUID, run_id: UUID, cancel_on_disconnect: str | None = None
) -> StreamingHttpResponse:
    caller = caller_of(request)
    # Watched before the read: a change committed after it still wakes the join.
    waiter = hub().watch(run_id)
    try:
        run, outcome = await streaming.db(
            selectors.run_with_outcome,
            run_id,
            thread_id=thread_id,
            pinned_resource_id=caller.pinned_resource_id,
        )
    except BaseException:
        waiter.close()
        raise
    return _result_of(
        request,
        caller,
        run,
        cancel_why=_cancel_on_disconnect(cancel_on_disconnect),
        waiter=waiter,
        known=outcome,
    )


def _last_event_id(request: HttpRequest, run: Run) -> int:
    """Where a joined stream starts: after Last-Event-ID (-1 = from the start), else live."""
    raw = request.headers.get("Last-Event-ID")
    if raw is None or not raw.strip():
        return run.last_seq
    try:
        return max(0, int(raw.strip().rsplit("_", 1)[-1]))
    except ValueError:
        return 0


@runs.get("/threads/{thread_id}/runs/{run_id}/stream", response=errors(404), openapi_extra=SSE_200)
async def join_run_stream(
    request: HttpRequest,
    thread_id: UUID,
    run_id: UUID,
    cancel_on_disconnect: str | None = None,
    stream_mode: list[str] | None = Query(None),  # noqa: B008 - declared for the docs; read raw below
) -> StreamingHttpResponse:
    caller = caller_of(request)
    modes = streaming.parse_stream_modes(request.GET.getlist("stream_mode"))
    run = await streaming.db(
        selectors.run_get, run_id, pinned_resource_id=caller.pinned_resource_id, thread_id=thread_id
    )
    if not modes:
        modes = streaming.parse_stream_modes((run.kwargs or {}).get("stream_mode")) or ["values"]
    return _sse_of(
        request,
        caller,
        run,
        modes=modes,
        after=_last_event_id(request, run),
        cancel_why=_cancel_on_disconnect(cancel_on_disconnect),
    )


@runs.post(
    "/threads/{thread_id}/runs/{run_id}/cancel",
    response={202: None, **errors(404, 409)},
    openapi_extra=JSON_BODY_200,
)
def cancel_run(
    request: HttpRequest,
    thread_id: UUID,
    run_id: UUID,
    wait: str | None = None,
    action: str | None = None,
) -> HttpResponse:
    caller = caller_of(request)
    # LangGraph turns any other action into interrupt; an absent wait means no wait.
    action = "rollback" if action == "rollback" else "interrupt"
    # With wait, the cancel ends the run in its own (committed) transaction, running ones
    # included, and reads the join body there: nothing to wait for.
    answer = services.CancelAnswer() if p.as_bool(wait) else None
    services.run_cancel_on_thread(
        thread_id=thread_id,
        run_id=run_id,
        action=action,
        actor=caller.actor,
        pinned_resource_id=caller.pinned_resource_id,
        answer=answer,
    )
    if answer is None:
        return HttpResponse(status=202)
    result = answer.result if answer.read else selectors.run_result(run_id, thread_id=thread_id)
    base = _path_of(thread_id, run_id)
    return HttpResponse(
        json.dumps(result, default=str),
        content_type="application/json",
        headers={"Location": f"{base}/join", "Content-Location": base},
    )
