"""What an agent is: an id, tools, a model (the policy) and limits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runs.validation import schema_errors

if TYPE_CHECKING:
    from runs.engine.context import ToolContext
    from runs.engine.model import Model

__all__ = ["Agent", "ReviewPolicy", "Tool", "delegate", "flatten_agents", "schema_errors", "tool"]

logger = logging.getLogger(__name__)

ApprovalRule = bool | Callable[[dict[str, Any]], bool]

REVIEW_TIMEOUT_ACTIONS = ("decline", "cancel")


@dataclass(frozen=True)
class ReviewPolicy:
    """How long a human may take over a waiting call, and what happens after (None: nothing
    but the overdue mark)."""

    seconds: float
    action: str | None = None  # "decline" (with `reason`) or "cancel" (interrupt the run)
    reason: str = ""


def _check_review_options(owner: str, seconds: float | None, action: str | None) -> None:
    # Fail at import: a misspelt action would otherwise silently never fire.
    if seconds is not None and (isinstance(seconds, bool) or not seconds >= 0):
        raise ValueError(f"{owner}: review_timeout_seconds must be a number >= 0, got {seconds!r}")
    if action is not None and action not in REVIEW_TIMEOUT_ACTIONS:
        raise ValueError(
            f"{owner}: on_review_timeout must be one of {REVIEW_TIMEOUT_ACTIONS} or None, "
            f"got {action!r}"
        )


def _pydantic_schema(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


@dataclass
class Tool:
    name: str
    execute: Callable[..., Any]  # execute(ctx, **args) -> JSON-serialisable result
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    requires_approval: ApprovalRule = False
    # Set on delegation tools: the id of the sub-agent this tool hands its input to.
    delegate_to: str | None = None
    # The model gets a reviewer's approval comment with this tool's result
    # ({"reviewer_comment": ...}); off by default, a comment may be meant for people only.
    share_review_comment: bool = False
    # Overrides of the agent's review deadline (None: the agent's; 0 seconds: no deadline).
    review_timeout_seconds: float | None = None
    on_review_timeout: str | None = None
    review_timeout_reason: str = ""
    # The tool changes nothing outside the run (a lookup, a search, a calculation): a crash
    # may run it again harmlessly, so a decision calling only such tools is written with their
    # results instead of before them (engine/loop.py). Refused with requires_approval=True.
    read_only: bool = False

    def __post_init__(self) -> None:
        if self.read_only and self.requires_approval is True:
            raise ValueError(
                f"tool {self.name}: read_only has no effect on a tool that always needs"
                " approval (its call is written before it waits); drop one of them"
            )
        if hasattr(self.parameters, "model_json_schema"):  # a pydantic model class
            self.parameters = _pydantic_schema(self.parameters)
        _check_review_options(
            f"tool {self.name}", self.review_timeout_seconds, self.on_review_timeout
        )

    def needs_approval(self, args: dict[str, Any]) -> bool:
        rule = self.requires_approval
        if not callable(rule):
            return bool(rule)
        try:
            return bool(rule(args))
        except Exception:
            # A rule that cannot decide must not let a call through unreviewed.
            logger.warning("approval rule of tool %s raised; requiring approval", self.name)
            return True

    def argument_errors(self, args: Any) -> list[dict[str, str]]:
        return schema_errors(self.parameters, args)

    def run(self, ctx: ToolContext, args: dict[str, Any]) -> Any:
        return self.execute(ctx, **args)


def tool(
    name: str | None = None,
    *,
    description: str = "",
    parameters: Any = None,
    requires_approval: ApprovalRule = False,
    share_review_comment: bool = False,
    review_timeout_seconds: float | None = None,
    on_review_timeout: str | None = None,
    review_timeout_reason: str = "",
    read_only: bool = False,
) -> Callable[[Callable[..., Any]], Tool]:
    """Decorator: `@tool(requires_approval=True) def issue_refund(ctx, order_id, amount): ...`."""

    def wrap(fn: Callable[..., Any]) -> Tool:
        return Tool(
            name=name or fn.__name__,
            execute=fn,
            description=description or (fn.__doc__ or "").strip(),
            parameters=parameters if parameters is not None else {"type": "object"},
            requires_approval=requires_approval,
            share_review_comment=share_review_comment,
            review_timeout_seconds=review_timeout_seconds,
            on_review_timeout=on_review_timeout,
            review_timeout_reason=review_timeout_reason,
            read_only=read_only,
        )

    return wrap


def delegate(
    agent_id: str, *, name: str | None = None, description: str = "", parameters: Any = None
) -> Tool:
    """A tool that runs another agent as a sub-agent with the tool's arguments as its input."""

    def execute(ctx: ToolContext, **args: Any) -> Any:
        return ctx.delegate(agent_id, args)

    return Tool(
        name=name or f"agent_{agent_id}",
        execute=execute,
        description=description or f"Delegate to the {agent_id} agent",
        parameters=parameters if parameters is not None else {"type": "object"},
        delegate_to=agent_id,
    )


@dataclass
class Agent:
    id: str
    model: Model
    tools: list[Tool] = field(default_factory=list)
    description: str = ""
    max_steps: int = 25
    time_limit: float | None = None  # seconds per attempt; None = RUNS_DEFAULT_TIME_LIMIT
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    # How long a review of any of its calls may take (a tool may override it), and what the
    # reaper does once it has passed: "decline" (with the reason), "cancel", or None.
    review_timeout_seconds: float | None = None
    on_review_timeout: str | None = None
    review_timeout_reason: str = ""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.id}: duplicate tool names {sorted(duplicates)}")
        _check_review_options(
            f"agent {self.id}", self.review_timeout_seconds, self.on_review_timeout
        )

    def review_policy(self, tool_name: str | None) -> ReviewPolicy | None:
        """The review deadline of a call to `tool_name`: the tool's settings over the agent's."""
        tool = self.get_tool(tool_name) if tool_name else None
        seconds = self.review_timeout_seconds
        action = self.on_review_timeout
        reason = self.review_timeout_reason
        if tool is not None:
            if tool.review_timeout_seconds is not None:
                seconds = tool.review_timeout_seconds
            action = tool.on_review_timeout or action
            reason = tool.review_timeout_reason or reason
        if not seconds:
            return None
        return ReviewPolicy(seconds=float(seconds), action=action, reason=reason)

    def get_tool(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def input_errors(self, value: Any) -> list[dict[str, str]]:
        return schema_errors(self.input_schema, value)


def flatten_agents(obj: Any) -> Iterable[Agent]:
    if isinstance(obj, Agent):
        yield obj
    elif isinstance(obj, dict):
        yield from obj.values()
    elif isinstance(obj, Iterable) and not isinstance(obj, str | bytes):
        for item in obj:
            yield from flatten_agents(item)
    else:
        raise TypeError(f"not an Agent or a collection of agents: {obj!r}")
