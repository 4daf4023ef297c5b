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

__all__ = ["Agent", "Tool", "delegate", "flatten_agents", "schema_errors", "tool"]

logger = logging.getLogger(__name__)

ApprovalRule = bool | Callable[[dict[str, Any]], bool]


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

    def __post_init__(self) -> None:
        if hasattr(self.parameters, "model_json_schema"):  # a pydantic model class
            self.parameters = _pydantic_schema(self.parameters)

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

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.id}: duplicate tool names {sorted(duplicates)}")

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
