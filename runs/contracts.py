"""Types the engine and the service layer share, and the shape of an interrupt.

A leaf module: it imports nothing from Runsite, so services, selectors, the engine and the API
presenters can all depend on it without import cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID, uuid5

from runs.models import Run, ToolCall, ToolCallStatus

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser


# Who did something: a dashboard user, a string such as "api:ci-key", or None for the system.
# A plain alias rather than a `type` statement: tools that parse this tree may run on 3.11.
Actor: TypeAlias = "AbstractBaseUser | AnonymousUser | str | None"  # noqa: UP040


# Any JSON value a client sent or a JSONField holds: services store it, check its size and
# validate it against a schema, but never look inside without an isinstance check.
JSONValue: TypeAlias = object  # noqa: UP040
# A JSON object (state values, metadata, event data, tool arguments).
JSONObject: TypeAlias = dict[str, Any]  # noqa: UP040
# One timeline event to write: (kind, data, actor name).
Event: TypeAlias = tuple[str, JSONObject, str]  # noqa: UP040


def actor_name(actor: Actor) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    return str(actor.get_username())


@dataclass(frozen=True)
class Lease:
    """What a worker holds on a run it claimed; every write it makes is fenced by it."""

    run_id: UUID
    owner: str
    attempt: int
    # Known at claim time; lets fenced writes lock the thread and publish without a lookup.
    thread_id: UUID | None = None
    agent_id: str = ""
    parent_run_id: UUID | None = None
    resource_id: str | None = None  # carried by published changes (tenant-scoped sockets)


@dataclass
class StepWrite:
    """One checkpoint the step loop wants written (ids are chosen up front so steps can chain)."""

    id: UUID
    step: int
    values: dict[str, Any]
    pending: list[str]
    parent_id: UUID | None


def step_event(w: StepWrite) -> Event:
    """The timeline event a written step gets (LangGraph's `values` in a stream)."""
    return ("step", {"step": w.step, "checkpoint_id": str(w.id), "values": w.values}, "system")


@dataclass
class ClaimedRun:
    run: Run
    lease: Lease


@dataclass
class FenceResult:
    last_seq: int
    cancel_action: str | None
    # The tool calls a step write created (run_save_steps), as written: no need to read back.
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass
class ToolOutcome:
    """A tool call's result, recorded with the step write that follows it (run_save_steps)."""

    tool_call: ToolCall
    status: str  # succeeded or failed
    result: Any
    event: Event


@dataclass
class HeldWrites:
    """Writes the step loop skipped because nothing between them and the next write needed
    them committed (a read-only tool's call, an in-process model's decision): the next write
    makes them first, as the skipped writes would have made them (docs/architecture.md)."""

    steps: list[StepWrite] = field(default_factory=list)
    # Calls proposed and not written yet, each with its own step, status and, once its
    # read-only tool returned, its outcome (result, finished_at).
    tool_calls: list[JSONObject] = field(default_factory=list)
    # In the order the skipped writes would have given them, each held step's `step` event
    # and each outcome's event included.
    events: list[Event] = field(default_factory=list)
    # The outcome of a call already written (its event is in `events`).
    outcome: ToolOutcome | None = None

    def __bool__(self) -> bool:
        return bool(self.steps or self.tool_calls or self.events or self.outcome)


@dataclass
class BulkCancelResult:
    interrupted: list[UUID] = field(default_factory=list)
    deleted: list[UUID] = field(default_factory=list)  # rolled back

    @property
    def count(self) -> int:
        return len(self.interrupted) + len(self.deleted)


@dataclass
class SuspendPlan:
    """One run to park: its waiting tool calls and the state they wait in."""

    lease: Lease
    waiting: list[dict[str, Any]]  # {tool_call_id, status, suspend_payload, resume_schema, ...}
    # The model's decision that led here when it is not written yet (all its calls wait for a
    # reviewer, nothing ran since): written in the suspension's transaction, first.
    steps: list[StepWrite] = field(default_factory=list)
    new_tool_calls: list[JSONObject] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    # Writes held before that decision (`HeldWrites`), written first.
    held: HeldWrites | None = None


# LangGraph's NAMESPACE_GRAPH: a graph's system assistant id is uuid5(NAMESPACE_GRAPH, graph_id).
NAMESPACE_GRAPH = UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


@lru_cache(maxsize=1024)
def assistant_uuid(agent_id: str) -> str:
    """The LangGraph system-assistant id of an agent (what clients filter threads by): a
    name-based UUID, the same for the life of the process (each run's answer carries it twice,
    each a SHA-1 and a UUID's formatting)."""
    return str(uuid5(NAMESPACE_GRAPH, agent_id))


def interrupt_of(w: dict[str, Any]) -> dict[str, Any]:
    """The interrupt a waiting tool call shows to clients, in three conventions at once.

    Runsite's own fields (`type`, `tool_call_id`, `tool_name`, `args` / `payload`,
    `resume_schema`) stay; an approval wait also carries LangChain's human-in-the-loop middleware
    shape (`action_requests`, `review_configs`), and an input wait the Agent Inbox
    `HumanInterrupt` shape (`action_request`, `config`, `description`), so those clients can
    show and answer it unchanged. `w` may carry the tool's `description`.
    """
    tool_name = w.get("tool_name") or ""
    description = w.get("description") or ""
    payload = w.get("suspend_payload")
    if isinstance(payload, dict) and isinstance(payload.get("description"), str):
        description = payload["description"]  # the tool said what it asks for
    value: dict[str, Any]
    if w["status"] == ToolCallStatus.AWAITING_APPROVAL:
        args = w.get("args")
        value = {
            "type": "approval",
            "tool_call_id": w["tool_call_id"],
            "tool_name": tool_name,
            "args": args,
        }
        if payload is not None:
            value["payload"] = payload
        value["description"] = description
        value["action_requests"] = [
            # `arguments` as well as LangChain's `args`: the Agent Inbox app reads `arguments`.
            {"name": tool_name, "args": args, "arguments": args, "description": description}
        ]
        value["review_configs"] = [
            {"action_name": tool_name, "allowed_decisions": ["approve", "edit", "reject"]}
        ]
    else:
        value = {
            "type": "input",
            "tool_call_id": w["tool_call_id"],
            "tool_name": tool_name,
            "payload": payload,
            "resume_schema": w.get("resume_schema"),
            "description": description,
            "action_request": {
                "action": tool_name,
                "args": payload if isinstance(payload, dict) else {"request": payload},
            },
            "config": {
                "allow_accept": False,
                "allow_edit": False,
                "allow_respond": True,
                "allow_ignore": True,
            },
        }
    return {"id": w["tool_call_id"], "value": value}
