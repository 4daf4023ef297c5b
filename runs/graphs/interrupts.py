"""LangGraph interrupts ↔ Runsite's waiting tool calls, and decisions → Command(resume=…).

Each pending interrupt becomes one ToolCall row: tool_call_id = the interrupt id,
suspend_payload = the interrupt value exactly as the graph gave it. An interrupt that asks for
an approval (Agent Inbox `HumanInterrupt` with allow_accept, LangChain's `tool_approval`, or a
`{"tool", "args"}` request) waits as `awaiting_approval`, so approve / edit / decline work as on
agents; anything else waits as `awaiting_input` and is answered with a value.
"""

from __future__ import annotations

from typing import Any

from runs.graphs.jsonable import to_json
from runs.models import ToolCall, ToolCallStatus

BREAKPOINT_PREFIX = "breakpoint-"


def _inbox_request(value: Any) -> dict[str, Any] | None:
    """The Agent Inbox HumanInterrupt in `value` (itself, or the only item of a list)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if (
        isinstance(value, dict)
        and isinstance(value.get("action_request"), dict)
        and isinstance(value.get("config"), dict)
    ):
        return value
    return None


def approval_request(value: Any) -> tuple[str, dict[str, Any]] | None:
    """(tool name, args) when the interrupt asks to approve a tool call, else None."""
    inbox = _inbox_request(value)
    if inbox is not None:
        if not inbox["config"].get("allow_accept"):
            return None
        request = inbox["action_request"]
        args = request.get("args")
        return str(request.get("action") or "action"), args if isinstance(args, dict) else {}
    if not isinstance(value, dict):
        return None
    if value.get("type") == "tool_approval" and value.get("name"):
        args = value.get("args")
        return str(value["name"]), args if isinstance(args, dict) else {}
    if isinstance(value.get("tool"), str) and isinstance(value.get("args"), dict):
        return value["tool"], value["args"]
    return None


def _resume_schema(schema: Any) -> dict[str, Any] | None:
    if schema is None:
        return None
    if isinstance(schema, dict):
        return schema
    try:
        from pydantic import TypeAdapter

        return TypeAdapter(schema).json_schema()
    except Exception:
        return None


def waiting_for(interrupts: Any, *, step: int = 0) -> list[dict[str, Any]]:
    """The waiting tool calls (runs/services/graphs.graph_run_suspend) for pending interrupts."""
    waiting = []
    for task in interrupts:
        for interrupt in task.interrupts:
            value = to_json(interrupt.value)
            approval = approval_request(value)
            waiting.append(
                {
                    "tool_call_id": interrupt.id,
                    "tool_name": approval[0] if approval else task.name,
                    "args": approval[1] if approval else {},
                    "status": ToolCallStatus.AWAITING_APPROVAL
                    if approval
                    else ToolCallStatus.AWAITING_INPUT,
                    "suspend_payload": value,
                    "resume_schema": _resume_schema(getattr(interrupt, "response_schema", None)),
                    "step": max(0, step),
                }
            )
    return waiting


def breakpoint_waiting(checkpoint_id: str, next_nodes: list[str], step: int) -> dict[str, Any]:
    """A static breakpoint (interrupt_before/after): approve (or answer) continues the graph."""
    return {
        "tool_call_id": f"{BREAKPOINT_PREFIX}{checkpoint_id}",
        "tool_name": "breakpoint",
        "args": {"next": next_nodes},
        "status": ToolCallStatus.AWAITING_APPROVAL,
        "suspend_payload": {"type": "breakpoint", "next": next_nodes},
        "resume_schema": None,
        "step": max(0, step),
    }


def resume_value(tc: ToolCall) -> Any:
    """What the graph's interrupt() returns for a decided tool call."""
    payload = tc.suspend_payload
    if tc.status == ToolCallStatus.ANSWERED:
        return tc.resume_data
    inbox = _inbox_request(payload)
    as_list = isinstance(payload, list)
    if inbox is not None:
        request = inbox["action_request"]
        if tc.status == ToolCallStatus.APPROVED:
            edited = tc.original_args is not None
            response: dict[str, Any] = {
                "type": "edit" if edited else "accept",
                "args": {"action": request.get("action"), "args": tc.args},
            }
        elif tc.decision_reason and inbox["config"].get("allow_respond"):
            response = {"type": "response", "args": tc.decision_reason}
        else:
            response = {"type": "ignore", "args": None}
        return [response] if as_list else response
    if isinstance(payload, dict) and payload.get("type") == "tool_approval":
        if tc.status == ToolCallStatus.APPROVED:
            if tc.original_args is not None:
                return {"type": "edit", "edited_action": {"name": tc.tool_name, "args": tc.args}}
            return {"type": "approve"}
        return {"type": "reject", "message": tc.decision_reason or None}
    if tc.status == ToolCallStatus.APPROVED:
        value: dict[str, Any] = {"approved": True}
        if tc.original_args is not None:
            value["args"] = tc.args
        return value
    return {"approved": False, "reason": tc.decision_reason}
