"""The LangGraph surface for graph threads and runs (hooked from runs/api/langgraph.py).

State, history and update_state are computed by the loaded graph over its real checkpoints
(`next` and `tasks` need the graph, not just the saver). Run options that mean something for a
graph (interrupt_before/after, checkpoint_id, command.update/goto, as_node) are accepted here,
while runs/api/schemas.py keeps refusing them for Runsite agents.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from runs import selectors, services
from runs.api import presenters
from runs.api.auth import Caller
from runs.api.presenters import assistant_uuid, find_agent
from runs.api.schemas import KWARG_FIELDS, RunCreateIn, refuse_checkpoint, refuse_keys
from runs.engine.registry import all_agents
from runs.exceptions import NotFound, Unsupported, ValidationFailed
from runs.graphs.jsonable import to_json
from runs.graphs.loader import GraphAgent
from runs.models import GraphCheckpoint, Run, Thread
from runs.services import graphs as graph_services
from runs.webhooks import validate_url

COMMAND_KEYS = ("resume", "update", "goto")
CONFIG_KEYS = ("configurable", "metadata", "tags", "run_name", "recursion_limit")


def graph_agent_for(assistant_id: str) -> GraphAgent | None:
    agent = find_agent(assistant_id)
    return agent if isinstance(agent, GraphAgent) else None


def graph_of_thread(thread: Thread) -> GraphAgent | None:
    """The graph whose checkpoints the thread holds (None: a Runsite agent's thread)."""
    head = (
        GraphCheckpoint.objects.filter(thread_id=thread.id, checkpoint_ns="")
        .order_by("-checkpoint_id")
        .values_list("metadata", flat=True)
        .first()
    )
    graph_id = (head or {}).get("graph_id") if head is not None else None
    if head is None:
        graph_id = (thread.metadata or {}).get("graph_id")
    agent = all_agents().get(graph_id) if isinstance(graph_id, str) else None
    return agent if isinstance(agent, GraphAgent) else None


def _bound(agent: GraphAgent) -> Any:
    # LangGraph is imported on first use: a server without RUNS_GRAPHS never loads it
    # (about 30 MB per web process).
    from runs.graphs.checkpointer import RunsiteSaver

    return agent.graph.copy(update={"checkpointer": RunsiteSaver(value_keys=agent.value_keys)})


def _config(thread: Thread, checkpoint_id: Any = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": str(thread.id), "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = str(checkpoint_id)
    return {"configurable": configurable}


def _ref(config: dict[str, Any] | None) -> dict[str, Any] | None:
    if not config:
        return None
    c = config["configurable"]
    return {
        "thread_id": c["thread_id"],
        "checkpoint_ns": c.get("checkpoint_ns", ""),
        "checkpoint_id": c["checkpoint_id"],
    }


def _interrupt(i: Any) -> dict[str, Any]:
    return {"value": to_json(i.value), "id": i.id}


def state_out(snapshot: Any, value_keys: list[str]) -> dict[str, Any]:
    """A LangGraph ThreadState from a StateSnapshot."""
    checkpoint, parent = _ref(snapshot.config), _ref(snapshot.parent_config)
    values = snapshot.values
    return {
        "values": to_json(values) if isinstance(values, dict) else to_json(values or {}),
        "next": list(snapshot.next),
        "tasks": [
            {
                "id": t.id,
                "name": t.name,
                "path": to_json(t.path),
                "error": f"{type(t.error).__name__}: {t.error}" if t.error else None,
                "interrupts": [_interrupt(i) for i in t.interrupts],
                "checkpoint": None,
                "state": None,
                "result": to_json(t.result) if t.result is not None else None,
            }
            for t in snapshot.tasks
        ],
        "metadata": to_json(snapshot.metadata) if snapshot.metadata else None,
        "created_at": snapshot.created_at,
        "checkpoint": checkpoint,
        "parent_checkpoint": parent,
        "interrupts": [_interrupt(i) for i in snapshot.interrupts],
        "checkpoint_id": checkpoint["checkpoint_id"] if checkpoint else None,
        "parent_checkpoint_id": parent["checkpoint_id"] if parent else None,
    }


def _empty_state(thread: Thread) -> dict[str, Any]:
    return presenters.state_out(
        thread, None
    )  # a graph thread that never ran: the same shape as an agent's


def thread_state(thread: Thread, agent: GraphAgent, checkpoint_id: Any = None) -> dict[str, Any]:
    graph = _bound(agent)
    snapshot = graph.get_state(_config(thread, checkpoint_id))
    if "checkpoint_id" not in (snapshot.config or {}).get("configurable", {}):
        if checkpoint_id:
            raise NotFound(
                f"Checkpoint {checkpoint_id} not found on thread {thread.id}",
                code="checkpoint_not_found",
            )
        return _empty_state(thread)
    return state_out(snapshot, agent.value_keys)


def thread_history(
    thread: Thread, agent: GraphAgent, *, limit: int, before: Any = None
) -> list[dict[str, Any]]:
    graph = _bound(agent)
    before_config = _config(thread, before) if before else None
    snapshots = graph.get_state_history(_config(thread), limit=limit, before=before_config)
    return [state_out(s, agent.value_keys) for s in snapshots]


def update_state(
    thread: Thread,
    agent: GraphAgent,
    *,
    values: Any,
    as_node: str | None,
    checkpoint_id: Any,
    actor: Any,
) -> dict[str, Any]:
    """LangGraph's update_state: a `source="update"` checkpoint as if `as_node` had returned
    `values` (as_node="__end__" with no values clears pending tasks)."""
    graph = _bound(agent)
    config = _config(thread, checkpoint_id)
    config["metadata"] = {"graph_id": agent.id, "assistant_id": agent.id}

    from langgraph.checkpoint.base import EmptyChannelError
    from langgraph.errors import InvalidUpdateError

    from runs.graphs.checkpointer import project_values

    def write() -> tuple[dict[str, Any], Any]:
        try:
            new = graph.update_state(config, values, as_node=as_node)
        except (InvalidUpdateError, EmptyChannelError) as exc:
            raise ValidationFailed.field("as_node", str(exc), detail=str(exc)) from None
        head = graph.get_state({"configurable": new["configurable"]})
        return new, project_values(head.values, agent.value_keys)

    new = graph_services.graph_thread_state_write(
        thread=thread, actor=actor, write=write, values=values, as_node=as_node
    )
    ref = _ref(new) or {}
    return {"checkpoint": ref, "configurable": ref, "checkpoint_id": ref.get("checkpoint_id")}


# --- runs ----------------------------------------------------------------------------------------


def _checkpoint_id_of(payload: RunCreateIn) -> str | None:
    configurable = (payload.config or {}).get("configurable") or {}
    candidates = [
        payload.checkpoint_id,
        (payload.checkpoint or {}).get("checkpoint_id"),
        configurable.get("checkpoint_id") if isinstance(configurable, dict) else None,
    ]
    for value in candidates:
        if value:
            try:
                return str(UUID(str(value)))
            except ValueError:
                raise ValidationFailed.field(
                    "checkpoint_id",
                    "must be a UUID",
                    detail="Invalid checkpoint ID: must be a UUID",
                ) from None
    return None


def _refuse_unsupported(payload: RunCreateIn) -> None:
    if payload.webhook:
        validate_url(payload.webhook, field="webhook")
    checkpoint = {k: v for k, v in (payload.checkpoint or {}).items() if k != "checkpoint_id"}
    refuse_checkpoint(checkpoint)  # another namespace (a subgraph's checkpoint)
    refuse_keys(payload.command, "command", COMMAND_KEYS)
    refuse_keys(payload.config, "config", CONFIG_KEYS)
    config_metadata = (payload.config or {}).get("metadata")
    if config_metadata is not None and not isinstance(config_metadata, dict):
        raise ValidationFailed.field("config.metadata", "must be an object")


def create_run(
    caller: Caller,
    payload: RunCreateIn,
    thread_id: UUID | None,
    stream_mode: list[str],
    run_id: UUID | None = None,
) -> Run:
    """Create a graph run, or resume the thread's suspended graph run (`command.resume`)."""
    agent = graph_agent_for(payload.assistant_id)
    assert agent is not None
    _refuse_unsupported(payload)
    command = payload.command_given()
    if command and command.get("resume") is not None:
        if command.get("update") is not None or command.get("goto") is not None:
            raise Unsupported(
                "command.goto", "resume a graph first; update/goto go in a run of their own"
            )
        if thread_id is None:
            raise ValidationFailed(
                "You must provide a thread_id when resuming.",
                errors=[{"field": "thread_id", "message": "required with command.resume"}],
            )
        thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
        return graph_services.graph_thread_resume(
            thread=thread,
            resume=command["resume"],
            actor=caller.actor,
            webhook=payload.webhook or "",
        )
    kwargs = {k: v for k in KWARG_FIELDS if (v := getattr(payload, k)) is not None}
    kwargs["stream_mode"] = stream_mode
    if command:
        kwargs["command"] = command
    for key in ("interrupt_before", "interrupt_after"):
        value = getattr(payload, key)
        if value:
            kwargs[key] = value if value == "*" or isinstance(value, list) else [value]
    checkpoint_id = _checkpoint_id_of(payload)
    if checkpoint_id:
        if thread_id is None:
            raise ValidationFailed.field("checkpoint_id", "needs a thread")
        if not GraphCheckpoint.objects.filter(
            thread_id=thread_id, checkpoint_ns="", checkpoint_id=checkpoint_id
        ).exists():
            raise NotFound(
                f"Checkpoint {checkpoint_id} not found on thread {thread_id}",
                code="checkpoint_not_found",
            )
        kwargs["checkpoint_id"] = checkpoint_id
    run = services.run_create(
        agent_id=agent.id,
        actor=caller.actor,
        thread_id=thread_id,
        input=payload.input,
        metadata=payload.run_metadata(),
        kwargs=kwargs,
        multitask_strategy=payload.multitask_strategy or "enqueue",
        if_not_exists=payload.if_not_exists or "reject",
        after_seconds=payload.after_seconds,
        pinned_resource_id=caller.pinned_resource_id,
        webhook=payload.webhook or "",
        run_id=run_id,
    )
    head = Thread.objects.filter(runs=run).only("id", "metadata").first()
    if head is not None and "graph_id" not in (head.metadata or {}):
        # The Agent Inbox (and the SDK's searches) find a graph's threads by this metadata.
        services.thread_update(
            thread=head, metadata={"graph_id": agent.id, "assistant_id": assistant_uuid(agent.id)}
        )
    return run


# --- hooks for runs/api/langgraph.py: None means "not a graph thread, answer as before" -------


def _any_graph() -> bool:
    return any(isinstance(a, GraphAgent) for a in all_agents().values())


def graph_thread(caller: Caller, thread_id: UUID) -> tuple[Thread, GraphAgent] | None:
    if not _any_graph():
        return None

    thread = selectors.thread_get(thread_id, pinned_resource_id=caller.pinned_resource_id)
    agent = graph_of_thread(thread)
    return (thread, agent) if agent is not None else None


def state_for(caller: Caller, thread_id: UUID, checkpoint: Any = None) -> dict[str, Any] | None:
    found = graph_thread(caller, thread_id)
    if found is None:
        return None
    checkpoint_id = checkpoint
    if isinstance(checkpoint, dict):
        checkpoint_id = checkpoint.get("checkpoint_id") or (
            checkpoint.get("configurable") or {}
        ).get("checkpoint_id")
    return thread_state(*found, checkpoint_id=checkpoint_id)


def history_for(
    caller: Caller, thread_id: UUID, limit: int, before: Any
) -> list[dict[str, Any]] | None:
    found = graph_thread(caller, thread_id)
    if found is None:
        return None
    if isinstance(before, dict):
        before = before.get("checkpoint_id") or (before.get("configurable") or {}).get(
            "checkpoint_id"
        )
    return thread_history(*found, limit=limit, before=before)


def update_state_for(caller: Caller, thread_id: UUID, payload: Any) -> dict[str, Any] | None:
    found = graph_thread(caller, thread_id)
    if found is None:
        return None
    checkpoint_id = payload.checkpoint_id or (payload.checkpoint or {}).get("checkpoint_id")
    return update_state(
        *found,
        values=payload.values,
        as_node=payload.as_node,
        checkpoint_id=checkpoint_id,
        actor=caller.actor,
    )


def schemas_of(agent: Any) -> dict[str, Any] | None:
    """The graph's own JSON schemas (None: not a graph)."""
    if not isinstance(agent, GraphAgent):
        return None
    graph = agent.graph

    def schema(fn: Any) -> dict[str, Any] | None:
        try:
            return to_json(fn())
        except Exception:  # a state type pydantic cannot describe
            return None

    return {
        "graph_id": agent.id,
        "input_schema": schema(graph.get_input_jsonschema),
        "output_schema": schema(graph.get_output_jsonschema),
        "state_schema": schema(lambda: graph.get_input_jsonschema()),
        "config_schema": schema(graph.get_config_jsonschema),
        "context_schema": schema(graph.get_context_jsonschema),
    }


def drawing_of(agent: Any, xray: bool) -> dict[str, list[dict[str, Any]]] | None:
    """The graph's nodes and edges, as LangGraph's server draws them (None: not a graph)."""
    if not isinstance(agent, GraphAgent):
        return None
    drawn = to_json(agent.graph.get_graph(xray=xray).to_json())
    return {"nodes": drawn.get("nodes", []), "edges": drawn.get("edges", [])}
