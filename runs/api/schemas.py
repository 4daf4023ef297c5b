"""Request and response schemas of the JSON API (explicit In/Out).

Requests fail closed: a LangGraph field Runsite does not honour is declared here and refused
with 422 `unsupported` when it is sent with a value (`refuse_unsupported`); keys no schema
declares are ignored (the SDK sends client-side ones such as `langsmith_tracer`). Responses are
read straight off the models (`from_attributes`, aliases, `resolve_<field>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from django.utils import timezone
from ninja import Field, Schema
from pydantic import AfterValidator, ConfigDict, model_validator

from runs.api.presenters import assistant_uuid
from runs.exceptions import Unsupported, ValidationFailed
from runs.models import Run, Thread, ToolCall
from runs.webhooks import validate_url

# --- shared ------------------------------------------------------------------------------------

MAX_LIMIT = 1000

# A page size in a request body: outside 1..1000 is refused (422).
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT)]
# A page size in a query string: clamped into 1..1000, as LangGraph's server does.
ClampedLimit = Annotated[int, AfterValidator(lambda v: max(1, min(v, MAX_LIMIT)))]
# How far into a list: beyond a billion rows there is nothing to page to, and the database's
# bigint would overflow on offset + limit (a 500 instead of a clear answer).
MAX_OFFSET = 1_000_000_000
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET)]
ClampedOffset = Annotated[int, AfterValidator(lambda v: max(0, min(v, MAX_OFFSET)))]


def given(value: Any) -> bool:
    """Sent with a value: not null and not empty (an object of empties is empty too).

    The SDK sends some fields with null or empty defaults; only a value asks for an effect.
    """
    if isinstance(value, dict):
        return any(given(v) for v in value.values())
    return value not in (None, "", [])


def refuse_keys(obj: dict[str, Any] | None, prefix: str, allowed: Iterable[str] = ()) -> None:
    """Unsupported for the first key of `obj` outside `allowed` that carries a value."""
    for key, value in (obj or {}).items():
        if key not in allowed and given(value):
            raise Unsupported(f"{prefix}.{key}")


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

    # Fields accepted by the schema that Runsite cannot honour: refused when given.
    UNSUPPORTED: ClassVar[tuple[str, ...]] = ()

    def refuse_unsupported(self) -> None:
        for name in self.UNSUPPORTED:
            if given(getattr(self, name)):
                raise Unsupported(name)


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
    limit: Limit = 10
    offset: Offset = 0
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
    # minutes, or {"ttl": minutes, "strategy": "delete"} (checked by services.thread_create)
    ttl: Any = None
    supersteps: Any = None

    UNSUPPORTED = ("supersteps",)


class ThreadPatchIn(BodyIn):
    metadata: dict[str, Any] = Field(default_factory=dict)
    ttl: Any = None


class ThreadPruneIn(BodyIn):
    thread_ids: list[UUID] = Field(max_length=MAX_LIMIT)
    strategy: str = "delete"


class ThreadPruneOut(Schema):
    pruned_count: int


class ThreadOut(Schema):
    """A Thread; `interrupts` come from the attribute `presenters.with_interrupts` sets."""

    thread_id: UUID = Field(alias="id")
    created_at: datetime
    updated_at: datetime
    state_updated_at: datetime = Field(alias="updated_at")
    metadata: dict[str, Any]
    status: str
    config: dict[str, Any]
    values: Any = None
    interrupts: dict[str, list[dict[str, Any]]]
    error: Any = None

    @staticmethod
    def resolve_config(obj: Thread) -> dict[str, Any]:
        return {}

    @staticmethod
    def resolve_interrupts(obj: Thread) -> dict[str, list[dict[str, Any]]]:
        return getattr(obj, "waiting_interrupts", None) or {}

    @staticmethod
    def resolve_error(obj: Thread) -> None:
        return None


class ThreadSearchIn(BodyIn):
    ids: list[UUID] | None = None
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: Limit = 10
    offset: Offset = 0
    sort_by: Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] = (
        "created_at"
    )
    sort_order: Literal["asc", "desc"] = "desc"
    extract: dict[str, Any] | None = None

    UNSUPPORTED = ("extract",)


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


def refuse_checkpoint(value: Any, name: str = "checkpoint") -> None:
    # A checkpoint that names nothing ({"thread_id": …, "checkpoint_ns": ""}) is the latest one.
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "thread_id"}
    if given(value):
        raise Unsupported(name)


class ThreadStateUpdateIn(BodyIn):
    values: dict[str, Any] | None = None
    as_node: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None

    UNSUPPORTED = ("as_node", "checkpoint_id")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        # Writing at an older checkpoint forks the thread; Runsite writes after the latest.
        refuse_checkpoint(self.checkpoint)


class StateAtCheckpointIn(BodyIn):
    checkpoint: dict[str, Any] = Field(default_factory=dict)
    subgraphs: bool = False


class ThreadStateUpdateOut(Schema):
    checkpoint: CheckpointRef
    configurable: dict[str, Any]
    checkpoint_id: UUID


class HistoryIn(BodyIn):
    limit: Limit = 10
    before: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None

    UNSUPPORTED = ("metadata",)

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        refuse_checkpoint(self.checkpoint)  # a subgraph namespace: Runsite has none


# --- runs --------------------------------------------------------------------------------------

MultitaskStrategyIn = Literal["reject", "rollback", "interrupt", "enqueue"]

# `command` keys and `config` keys with an effect in Runsite; any other one is refused.
COMMAND_KEYS = ("resume",)
CONFIG_KEYS = ("configurable", "metadata", "tags", "run_name")


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
    checkpoint_during: bool | None = None
    multitask_strategy: MultitaskStrategyIn | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    after_seconds: float | None = Field(None, ge=0, le=31_536_000)
    durability: Literal["sync", "async", "exit"] | None = None

    UNSUPPORTED = ("interrupt_before", "interrupt_after", "checkpoint_id")

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.webhook:
            # Before anything is created (a batch is checked whole first).
            validate_url(self.webhook, field="webhook")
        refuse_checkpoint(self.checkpoint)  # time travel
        refuse_keys(self.command, "command", COMMAND_KEYS)
        refuse_keys(self.config, "config", CONFIG_KEYS)
        configurable = (self.config or {}).get("configurable")
        if isinstance(configurable, dict):
            # LangGraph's older spelling of time travel.
            for key in ("checkpoint_id", "checkpoint_ns", "checkpoint_map"):
                if given(configurable.get(key)):
                    raise Unsupported(f"config.configurable.{key}")
        config_metadata = (self.config or {}).get("metadata")
        if config_metadata is not None and not isinstance(config_metadata, dict):
            raise ValidationFailed.field("config.metadata", "must be an object")

    def command_given(self) -> dict[str, Any] | None:
        """The command with its empty keys dropped; None when nothing is left."""
        command = {k: v for k, v in (self.command or {}).items() if v is not None}
        return command or None

    def run_metadata(self) -> dict[str, Any] | None:
        """`metadata` over `config.metadata` (LangGraph merges both into the run's metadata)."""
        from_config = (self.config or {}).get("metadata") or {}
        if not from_config:
            return self.metadata
        return {**from_config, **(self.metadata or {})}


class RunOut(Schema):
    run_id: UUID = Field(alias="id")
    thread_id: UUID | None = None
    assistant_id: str
    created_at: datetime
    updated_at: datetime
    status: str
    metadata: dict[str, Any]
    kwargs: dict[str, Any]
    multitask_strategy: str
    cancel_reason: str | None = None

    @staticmethod
    def resolve_assistant_id(obj: Run) -> str:
        return assistant_uuid(obj.agent_id)

    @staticmethod
    def resolve_metadata(obj: Run) -> dict[str, Any]:
        return {
            **(obj.metadata or {}),
            "graph_id": obj.agent_id,
            "assistant_id": assistant_uuid(obj.agent_id),
        }

    @staticmethod
    def resolve_kwargs(obj: Run) -> dict[str, Any]:
        return obj.kwargs or {}

    @staticmethod
    def resolve_cancel_reason(obj: Run) -> str | None:
        return obj.cancel_reason or None


class RunsCancelIn(BodyIn):
    thread_id: UUID | None = None
    run_ids: list[UUID] | None = None
    status: Literal["pending", "running", "suspended", "all"] | None = None


# --- review API --------------------------------------------------------------------------------


class AgentRunsQuery(Schema):
    """Filters of an agent's run listings: snake_case, or Mastra's camelCase names.

    Dates stay strings here: `runs.api.dates.date_bound` reads a date-only `to_date` as the
    whole day, which a datetime type would have turned into midnight.
    """

    thread_id: UUID | None = None
    resource_id: str | None = None
    from_date: str | None = None
    to_date: str | None = None
    per_page: int | None = None
    page: int | None = None
    thread_id_camel: UUID | None = Field(None, alias="threadId")
    resource_id_camel: str | None = Field(None, alias="resourceId")
    from_date_camel: str | None = Field(None, alias="fromDate")
    to_date_camel: str | None = Field(None, alias="toDate")
    per_page_camel: int | None = Field(None, alias="perPage")

    def pick(self, name: str) -> tuple[str, Any]:
        """(the name the client used, its value) for a filter sent either way; 422 if both
        spellings are sent with different values."""
        snake, camel = getattr(self, name), getattr(self, f"{name}_camel", None)
        alias = type(self).model_fields[f"{name}_camel"].alias or name
        if camel is None:
            return name, snake
        if snake is not None and snake != camel:
            raise ValidationFailed.field(
                alias, f"conflicts with {name}", detail=f"{name} and {alias} disagree"
            )
        return alias, camel


class AgentRunsStatusQuery(AgentRunsQuery):
    status: list[str] | None = None


class ToolCallOut(Schema):
    tool_call_id: str
    tool_name: str
    args: Any = None
    requires_approval: bool
    suspend_payload: Any = None
    resume_schema: dict[str, Any] | None = None
    # Who reviews it ("" when nobody holds a live claim) and its review deadline, if any.
    claimed_by: str = ""
    claimed_until: datetime | None = None
    review_deadline_at: datetime | None = None

    @staticmethod
    def resolve_claimed_by(obj: ToolCall) -> str:
        return obj.claim_holder(timezone.now())

    @staticmethod
    def resolve_claimed_until(obj: ToolCall) -> datetime | None:
        return obj.claimed_until if obj.claim_holder(timezone.now()) else None


class ToolCallDetailOut(ToolCallOut):
    status: str
    original_args: Any = None
    resume_data: Any = None
    result: Any = None
    decided_by: str = ""
    decided_at: datetime | None = None
    decision_reason: str = ""
    decision_comment: str = ""
    child_run_id: UUID | None = None


class SuspendedRunOut(Schema):
    """A Run; `tool_calls` are its waiting calls (`selectors.waiting_tool_calls_prefetch`)."""

    run_id: UUID = Field(alias="id")
    status: str
    agent_id: str
    thread_id: UUID | None = None
    resource_id: str | None = None
    suspended_at: datetime | None = None
    tool_calls: list[ToolCallOut] = Field(alias="waiting_tool_calls")


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
    """A `selectors.RunDetail`: the run, all its tool calls, its latest checkpoint's values."""

    run_id: UUID = Field(alias="run.id")
    status: str = Field(alias="run.status")
    agent_id: str = Field(alias="run.agent_id")
    thread_id: UUID | None = Field(None, alias="run.thread_id")
    resource_id: str | None = Field(None, alias="run.resource_id")
    parent_run_id: UUID | None = Field(None, alias="run.parent_run_id")
    attempt: int = Field(alias="run.attempt")
    input: Any = Field(None, alias="run.input")
    output: Any = Field(None, alias="run.output")
    error: Any = Field(None, alias="run.error")
    metadata: dict[str, Any] = Field(alias="run.metadata")
    multitask_strategy: str = Field(alias="run.multitask_strategy")
    cancel_reason: str = Field("", alias="run.cancel_reason")
    created_at: datetime = Field(alias="run.created_at")
    started_at: datetime | None = Field(None, alias="run.started_at")
    suspended_at: datetime | None = Field(None, alias="run.suspended_at")
    finished_at: datetime | None = Field(None, alias="run.finished_at")
    updated_at: datetime = Field(alias="run.updated_at")
    tool_calls: list[ToolCallDetailOut]
    values: Any = Field(None, alias="checkpoint.values")
    checkpoint_id: UUID | None = Field(None, alias="checkpoint.id")


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
    # Stored with the decision; the model sees it when the tool shares review comments.
    comment: str | None = Field(None, max_length=10_000)
    force: bool = False  # decide a call another reviewer has claimed (else 409)


class DeclineIn(BodyIn):
    run_id: UUID
    tool_call_id: str | None = None
    reason: str | None = Field(None, max_length=10_000)
    force: bool = False


class Approval(Schema):
    """Mastra's answer to an approval: `{"approved": bool, "args"?, "reason"?, "comment"?}`
    (`comment` only with an approval: a decline gives a reason)."""

    approved: bool
    args: dict[str, Any] | None = None
    reason: str | None = Field(None, max_length=10_000)
    comment: str | None = Field(None, max_length=10_000)


class ResumeIn(BodyIn):
    """`resume_data` for a tool that asked for input; for a call awaiting approval,
    `{"approved": …}` either as `resume_data` (Mastra's resumeStream) or at the top level."""

    run_id: UUID
    tool_call_id: str | None = None
    resume_data: Any = None
    approved: bool | None = None
    args: dict[str, Any] | None = None
    reason: str | None = Field(None, max_length=10_000)
    comment: str | None = Field(None, max_length=10_000)
    force: bool = False

    def top_level_approval(self) -> Approval | None:
        if self.approved is None:
            for name in ("args", "reason", "comment"):
                if getattr(self, name) is not None:
                    raise ValidationFailed.field(name, "only allowed with approved")
            return None
        if self.resume_data is not None:
            raise ValidationFailed.field(
                "resume_data", "send either resume_data or approved, not both"
            )
        return Approval(
            approved=self.approved, args=self.args, reason=self.reason, comment=self.comment
        )

    def approval_in_resume_data(self) -> Approval | None:
        """`resume_data` read as an approval, when it has a boolean `approved`."""
        data = self.resume_data
        if not isinstance(data, dict) or not isinstance(data.get("approved"), bool):
            return None
        try:
            return Approval.model_validate(data)
        except ValueError as exc:  # pydantic's ValidationError
            first = exc.errors()[0] if hasattr(exc, "errors") else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise ValidationFailed.field(
                f"resume_data.{where}" if where else "resume_data",
                str(first.get("msg", "invalid")),
            ) from None


# Run-create fields kept on the run (its `kwargs`) as given.
KWARG_FIELDS = (
    "config",
    "context",
    "stream_subgraphs",
    "stream_resumable",
    "feedback_keys",
    "on_disconnect",
    "on_completion",
    "durability",
)
