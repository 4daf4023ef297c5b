"""Request and response schemas of the JSON API (explicit In/Out, unknown request keys ignored)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Field, Schema
from pydantic import ConfigDict, model_validator

# --- shared ------------------------------------------------------------------------------------


class BodyIn(Schema):
    """A request body: a JSON object (ninja's Schema would read any value's attributes, so a
    list or a number would silently become an object of defaults)."""

    @model_validator(mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        raw = getattr(value, "_obj", value)  # ninja hands over its DjangoGetter wrapper
        if not isinstance(raw, dict | Schema):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        return value


class ErrorOut(Schema):
    model_config = ConfigDict(extra="allow")

    detail: str
    code: str


def errors(*codes: int) -> dict[int, type[Schema]]:
    """Every error status an operation may answer, with the one error schema.

    400: a NUL character in the query string (runsite.middleware.RejectNulMiddleware).
    """
    return dict.fromkeys((400, 401, 413, 422, *codes), ErrorOut)


# --- assistants --------------------------------------------------------------------------------


class AssistantOut(Schema):
    assistant_id: str
    graph_id: str
    name: str
    description: str | None = None
    config: dict[str, Any]
    context: dict[str, Any]
    metadata: dict[str, Any]
    version: int
    created_at: datetime
    updated_at: datetime


class AssistantSearchIn(BodyIn):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0)
    sort_by: Literal["assistant_id", "created_at", "updated_at", "name", "graph_id"] | None = None
    sort_order: Literal["asc", "desc"] | None = None


class AssistantSchemasOut(Schema):
    graph_id: str
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    state_schema: dict[str, Any] | None = None
    config_schema: dict[str, Any] | None = None
    context_schema: dict[str, Any] | None = None


class GraphOut(Schema):
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]


# --- threads -----------------------------------------------------------------------------------


class ThreadCreateIn(BodyIn):
    thread_id: UUID | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None


class ThreadPatchIn(BodyIn):
    metadata: dict[str, Any] = Field(default_factory=dict)


class ThreadOut(Schema):
    thread_id: UUID
    created_at: datetime
    updated_at: datetime
    state_updated_at: datetime
    metadata: dict[str, Any]
    status: str
    config: dict[str, Any]
    values: Any = None
    interrupts: dict[str, list[dict[str, Any]]]
    error: Any = None


class ThreadSearchIn(BodyIn):
    ids: list[UUID] | None = None
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] = (
        "created_at"
    )
    sort_order: Literal["asc", "desc"] = "desc"


class ThreadCountIn(BodyIn):
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


class CheckpointRef(Schema):
    thread_id: UUID | None = None
    checkpoint_ns: str = ""
    checkpoint_id: UUID | None = None


class ThreadStateOut(Schema):
    values: Any
    next: list[str]
    tasks: list[dict[str, Any]]
    metadata: dict[str, Any] | None = None
    created_at: datetime | None = None
    checkpoint: CheckpointRef | None = None
    parent_checkpoint: CheckpointRef | None = None
    interrupts: list[dict[str, Any]]
    checkpoint_id: UUID | None = None
    parent_checkpoint_id: UUID | None = None


class ThreadStateUpdateIn(BodyIn):
    values: dict[str, Any] | None = None
    as_node: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None


class StateAtCheckpointIn(BodyIn):
    checkpoint: dict[str, Any] = Field(default_factory=dict)
    subgraphs: bool = False


class ThreadStateUpdateOut(Schema):
    checkpoint: CheckpointRef
    configurable: dict[str, Any]
    checkpoint_id: UUID


class HistoryIn(BodyIn):
    limit: int = Field(10, ge=1, le=1000)
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None


# --- runs --------------------------------------------------------------------------------------

MultitaskStrategyIn = Literal["reject", "rollback", "interrupt", "enqueue"]


class RunCreateIn(BodyIn):
    """LangGraph's RunCreateStateful/Stateless; unknown keys (raise_error, …) are ignored."""

    assistant_id: str
    input: Any = None
    command: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    stream_mode: str | list[str] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    feedback_keys: list[str] | None = None
    webhook: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    multitask_strategy: MultitaskStrategyIn | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: float | None = Field(None, ge=0, le=31_536_000)
    durability: Literal["sync", "async", "exit"] | None = None


class RunOut(Schema):
    run_id: UUID
    thread_id: UUID | None = None
    assistant_id: str
    created_at: datetime
    updated_at: datetime
    status: str
    metadata: dict[str, Any]
    kwargs: dict[str, Any]
    multitask_strategy: str
    cancel_reason: str | None = None


class RunsCancelIn(BodyIn):
    thread_id: UUID | None = None
    run_ids: list[UUID] | None = None
    status: Literal["pending", "running", "suspended", "all"] | None = None


# --- review API --------------------------------------------------------------------------------


class ToolCallOut(Schema):
    tool_call_id: str
    tool_name: str
    args: Any = None
    requires_approval: bool
    suspend_payload: Any = None
    resume_schema: dict[str, Any] | None = None


class ToolCallDetailOut(ToolCallOut):
    status: str
    original_args: Any = None
    resume_data: Any = None
    result: Any = None
    decided_by: str = ""
    decided_at: datetime | None = None
    decision_reason: str = ""
    child_run_id: UUID | None = None


class SuspendedRunOut(Schema):
    run_id: UUID
    status: str
    agent_id: str
    thread_id: UUID | None = None
    resource_id: str | None = None
    suspended_at: datetime | None = None
    tool_calls: list[ToolCallOut]


class SuspendedRunsOut(Schema):
    runs: list[SuspendedRunOut]
    total: int


class AgentRunOut(SuspendedRunOut):
    created_at: datetime
    updated_at: datetime


class AgentRunsOut(Schema):
    runs: list[AgentRunOut]
    total: int


class ReviewRunOut(Schema):
    run_id: UUID
    status: str
    agent_id: str
    thread_id: UUID | None = None
    resource_id: str | None = None
    parent_run_id: UUID | None = None
    attempt: int
    input: Any = None
    output: Any = None
    error: Any = None
    metadata: dict[str, Any]
    multitask_strategy: str
    cancel_reason: str = ""
    created_at: datetime
    started_at: datetime | None = None
    suspended_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime
    tool_calls: list[ToolCallDetailOut]
    values: Any = None
    checkpoint_id: UUID | None = None


class RunEventOut(Schema):
    seq: int
    kind: str
    data: Any = None
    actor: str
    created_at: datetime


class RunEventsOut(Schema):
    events: list[RunEventOut]
    next_after: int


class ApproveIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None
    args: dict[str, Any] | None = None


class DeclineIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None
    reason: str | None = Field(None, max_length=10_000)


class ResumeIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None
    resume_data: Any = None
