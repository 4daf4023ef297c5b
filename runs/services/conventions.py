"""Resume values in the ecosystem's human-in-the-loop conventions, read as Runsite decisions.

Two conventions besides Runsite's own (`{"approved": …}`, resume data, or a map by id):

- the Agent Inbox app's list of `HumanResponse`, one per waiting call in order:
  `[{"type": "accept" | "edit" | "response" | "ignore", "args": …}]`;
- LangChain's human-in-the-loop middleware: `{"decisions": [{"type": "approve" | "edit" |
  "reject" | "respond", …}]}`, one per waiting call in order.

This module only parses (no writes): `runs/services/decisions.py` carries the decisions out
under the run's lock.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from runs.exceptions import ValidationFailed
from runs.models import ToolCall, ToolCallStatus

Kind = Literal["approve", "decline", "answer", "ignore"]

INBOX_TYPES = ("accept", "edit", "response", "ignore")
MIDDLEWARE_TYPES = ("approve", "edit", "reject", "respond")
IGNORED_REASON = "ignored in review"


@dataclass(frozen=True)
class Decision:
    tool_call: ToolCall
    kind: Kind
    args: dict[str, Any] | None = None  # edited arguments (approve)
    reason: str = ""  # decline
    data: Any = None  # answer
    via: str = ""  # "agent_inbox:accept", "hitl_middleware:reject": written to the audit log


def parse(
    waiting: list[ToolCall], resume: Any, tool_parameters: dict[str, dict[str, Any] | None]
) -> list[Decision] | None:
    """Decisions for `waiting` when `resume` is in one of the two conventions, else None.

    `tool_parameters` maps tool names to their argument schemas (to read edited arguments
    that arrive as strings). Wrong shapes raise ValidationFailed naming what was expected.
    """
    if _is_inbox_list(resume):
        items, convention = resume, "agent_inbox"
    elif isinstance(resume, dict) and set(resume) == {"decisions"}:
        items, convention = resume["decisions"], "hitl_middleware"
        if not isinstance(items, list) or not all(isinstance(d, dict) for d in items):
            raise ValidationFailed.field(
                "resume.decisions",
                'expected a list of {"type": "approve"|"edit"|"reject"|"respond", …}',
            )
    else:
        return None
    if len(items) != len(waiting):
        ids = ", ".join(tc.tool_call_id for tc in waiting)
        raise ValidationFailed.field(
            "resume",
            f"expected {len(waiting)} response(s), one per waiting tool call in order ({ids}); "
            f"got {len(items)}",
        )
    reader = _inbox_decision if convention == "agent_inbox" else _middleware_decision
    return [
        reader(tc, item, f"resume[{i}]", tool_parameters.get(tc.tool_name))
        for i, (tc, item) in enumerate(zip(waiting, items, strict=True))
    ]


def _is_inbox_list(resume: Any) -> bool:
    return (
        isinstance(resume, list)
        and bool(resume)
        and all(isinstance(r, dict) and r.get("type") in INBOX_TYPES for r in resume)
    )


def _inbox_decision(
    tc: ToolCall, item: dict[str, Any], where: str, parameters: dict[str, Any] | None
) -> Decision:
    kind, args = item["type"], item.get("args")
    via = f"agent_inbox:{kind}"
    approval = tc.status == ToolCallStatus.AWAITING_APPROVAL
    if kind == "ignore":
        return Decision(tc, "ignore", via=via)
    if kind == "response":
        if not isinstance(args, str):
            raise ValidationFailed.field(f"{where}.args", "a response is a string")
        if approval:
            return Decision(tc, "decline", reason=args, via=via)
        return Decision(tc, "answer", data=_answer_from_text(tc, args, where), via=via)
    if not approval:
        raise ValidationFailed.field(
            f"{where}.type",
            f"tool call {tc.tool_call_id} asks for input: answer it with 'response' or 'ignore'",
        )
    if kind == "accept":
        return Decision(tc, "approve", via=via)
    # edit: args is an ActionRequest {"action", "args"}; the app sends edited values as strings.
    edited = args.get("args") if isinstance(args, dict) else None
    if not isinstance(edited, dict):
        raise ValidationFailed.field(f"{where}.args", 'an edit is {"action": …, "args": {…}}')
    return Decision(tc, "approve", args=_typed_args(edited, parameters), via=via)


def _middleware_decision(
    tc: ToolCall, item: dict[str, Any], where: str, parameters: dict[str, Any] | None
) -> Decision:
    kind = item.get("type")
    via = f"hitl_middleware:{kind}"
    approval = tc.status == ToolCallStatus.AWAITING_APPROVAL
    if kind not in MIDDLEWARE_TYPES:
        raise ValidationFailed.field(
            f"{where}.type", f"expected one of {', '.join(MIDDLEWARE_TYPES)}; got {kind!r}"
        )
    message = item.get("message")
    if message is not None and not isinstance(message, str):
        raise ValidationFailed.field(f"{where}.message", "a message is a string")
    if kind == "reject":
        return Decision(tc, "decline", reason=message or "", via=via)
    if kind == "respond":
        if message is None:
            raise ValidationFailed.field(f"{where}.message", "respond needs a message")
        if approval:
            return Decision(tc, "decline", reason=message, via=via)
        return Decision(tc, "answer", data=_answer_from_text(tc, message, where), via=via)
    if not approval:
        raise ValidationFailed.field(
            f"{where}.type",
            f"tool call {tc.tool_call_id} asks for input: answer it with 'respond' or 'reject'",
        )
    if kind == "approve":
        return Decision(tc, "approve", via=via)
    action = item.get("edited_action")
    edited = action.get("args") if isinstance(action, dict) else None
    if not isinstance(edited, dict):
        raise ValidationFailed.field(
            f"{where}.edited_action", 'an edit is {"edited_action": {"name": …, "args": {…}}}'
        )
    return Decision(tc, "approve", args=_typed_args(edited, parameters), via=via)


def _answer_from_text(tc: ToolCall, text: str, where: str) -> Any:
    """A text answer for a tool that asked for input.

    With a resume schema of one string field the text fills it; otherwise the text must be
    JSON (checked against the schema by the caller); without a schema the text is the answer.
    """
    schema = tc.resume_schema or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(properties, dict) and len(properties) == 1:
        ((name, prop),) = properties.items()
        if isinstance(prop, dict) and prop.get("type") == "string":
            return {name: text}
    if not schema:
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise ValidationFailed.field(
            f"{where}.args",
            "the tool asks for structured data: answer with JSON matching its resume_schema",
        ) from None


def _typed_args(edited: dict[str, Any], parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Edited arguments with string values read as the JSON type the tool declares."""
    properties = (parameters or {}).get("properties") or {}
    typed = {}
    for key, value in edited.items():
        declared = (properties.get(key) or {}).get("type")
        if isinstance(value, str) and declared in (
            "number",
            "integer",
            "boolean",
            "object",
            "array",
        ):
            # Left as typed when it is not JSON: the tool's schema check names the field.
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        typed[key] = value
    return typed
