"""What a reviewer reads before deciding: the tool's description, what the waiting call asks
(the `description` of its suspend payload), and the conversation so far as chat turns.

Messages come in the shapes Runsite's engine writes (`{"role", "content", "tool_calls"}`),
LangChain message dicts as runs/graphs/jsonable.py projects them (`{"type": "human"|"ai"|
"tool", ...}`), LangChain's serialised form (`{"lc": 1, "id": [..., "AIMessage"], "kwargs":
{...}}`) and OpenAI's tool calls (`{"function": {"name", "arguments": "<json>"}}`). Anything
else is shown as it is, never dropped: a turn of an unknown kind keeps its raw value.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from runs.engine.registry import tool_description
from runs.models import Run, ToolCall

__all__ = [
    "CHAT_TURNS",
    "MAX_CHAT_TURNS",
    "CallContext",
    "ChatToolCall",
    "ChatTurn",
    "Conversation",
    "call_context",
    "conversation",
    "request_description",
]

CHAT_TURNS = 40  # turns a page region shows (the newest); the rest is a link away
MAX_CHAT_TURNS = 2000  # turns the conversation page shows at most (the raw JSON has them all)
MAX_DESCRIPTION = 20_000

_ROLES = {
    "human": "user",
    "user": "user",
    "humanmessage": "user",
    "ai": "assistant",
    "assistant": "assistant",
    "aimessage": "assistant",
    "aimessagechunk": "assistant",
    "tool": "tool",
    "toolmessage": "tool",
    "function": "tool",
    "system": "system",
    "systemmessage": "system",
    "developer": "system",
}


@dataclass
class CallContext:
    """What the card of a waiting (or decided) tool call explains, as untrusted Markdown."""

    tool_description: str
    request_description: str


def request_description(payload: Any) -> str:
    """The `description` a suspend payload (or a graph's interrupt value, alone or as the only
    item of a list) gives the reviewer; "" when it has none."""
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]
    if isinstance(payload, dict) and isinstance(payload.get("description"), str):
        return payload["description"][:MAX_DESCRIPTION]
    return ""


def call_context(run: Run, tc: ToolCall) -> CallContext:
    return CallContext(
        tool_description=tool_description(run.agent_id, tc.tool_name),
        request_description=request_description(tc.suspend_payload),
    )


@dataclass
class ChatToolCall:
    name: str
    args: Any
    id: str = ""


@dataclass
class ChatTurn:
    role: str  # user, assistant, tool, system, or other (an unknown shape, kept raw)
    text: str = ""  # the message's text
    data: Any = None  # content that is not text (a tool's JSON result, an unknown message)
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    tool_name: str = ""  # a tool turn: the tool that answered
    tool_call_id: str = ""
    index: int = 0  # position in the whole conversation (0-based)


@dataclass
class Conversation:
    turns: list[ChatTurn]  # the newest `limit` turns, oldest first
    total: int  # turns in the whole conversation

    @property
    def hidden(self) -> int:
        return self.total - len(self.turns)


def _role_of(message: dict[str, Any]) -> str:
    raw = message.get("type") or message.get("role") or ""
    return _ROLES.get(str(raw).lower(), "other")


def _unwrap(message: Any) -> Any:
    """LangChain's serialised form `{"lc": 1, "id": [..., "AIMessage"], "kwargs": {...}}`."""
    if isinstance(message, dict) and "lc" in message and isinstance(message.get("kwargs"), dict):
        names = message.get("id")
        kind = names[-1] if isinstance(names, list) and names else ""
        return {"type": str(kind), **message["kwargs"]}
    return message


def _text_and_data(content: Any) -> tuple[str, Any]:
    """Text blocks joined as text; anything else kept as data (shown as JSON)."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    if isinstance(content, list) and all(
        isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text") for b in content
    ):
        return "\n\n".join(
            b if isinstance(b, str) else str(b.get("text", "")) for b in content
        ), None
    return "", content


def _args_of(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _tool_calls(message: dict[str, Any]) -> list[ChatToolCall]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    out = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else None
        if function is not None:  # OpenAI: {"id", "type": "function", "function": {...}}
            name, args = function.get("name"), _args_of(function.get("arguments"))
        else:
            name, args = call.get("name"), call.get("args", call.get("arguments"))
        out.append(ChatToolCall(name=str(name or "?"), args=args, id=str(call.get("id") or "")))
    return out


def _turn(message: Any, index: int, names: dict[str, str]) -> ChatTurn:
    message = _unwrap(message)
    if not isinstance(message, dict):
        if isinstance(message, str):  # a bare string is what a person typed
            return ChatTurn(role="user", text=message, index=index)
        return ChatTurn(role="other", data=message, index=index)
    role = _role_of(message)
    if role == "other":
        return ChatTurn(role="other", data=message, index=index)
    text, data = _text_and_data(message.get("content"))
    turn = ChatTurn(role=role, text=text, data=data, index=index)
    if role == "assistant":
        turn.tool_calls = _tool_calls(message)
        for call in turn.tool_calls:
            if call.id:
                names[call.id] = call.name
    elif role == "tool":
        turn.tool_call_id = str(message.get("tool_call_id") or "")
        turn.tool_name = str(message.get("name") or names.get(turn.tool_call_id) or "tool")
        if data is None and text.lstrip()[:1] in ("{", "["):
            # A tool's result is often JSON in a string (OpenAI, LangChain): show it as JSON.
            with contextlib.suppress(ValueError):
                turn.text, turn.data = "", json.loads(text)
    return turn


def conversation(values: Any, *, limit: int = CHAT_TURNS) -> Conversation | None:
    """The `messages` of a state as chat turns (the newest `limit`); None when the state has
    no messages list (the page then shows the raw JSON only)."""
    messages = values.get("messages") if isinstance(values, dict) else None
    if not isinstance(messages, list):
        return None
    limit = max(1, min(limit, MAX_CHAT_TURNS))
    start = max(0, len(messages) - limit)
    names: dict[str, str] = {}
    # Tool names come from the assistant turns that called them, which may be older than the
    # window: read the calls of the hidden part too (names only, cheap).
    for message in messages[:start]:
        unwrapped = _unwrap(message)
        if isinstance(unwrapped, dict) and _role_of(unwrapped) == "assistant":
            for call in _tool_calls(unwrapped):
                if call.id:
                    names[call.id] = call.name
    turns = [_turn(m, start + i, names) for i, m in enumerate(messages[start:])]
    return Conversation(turns=turns, total=len(messages))
