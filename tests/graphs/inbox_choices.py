"""Graphs for the dashboard's Agent Inbox choices (tests/test_graphs_dashboard.py and
tests/e2e/test_graphs_browser_inbox.py): the request is built from the run's input and the
HumanResponse the graph got is recorded in its state."""

from __future__ import annotations

from typing import Any, NotRequired

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict

ALL_CHOICES = ("accept", "edit", "respond", "ignore")
DEFAULT_ARGS = {"to": "ann@example.com", "subject": "Your refund", "copies": 1, "urgent": False}


class ChoiceState(TypedDict):
    allow: NotRequired[list[str]]  # which of ALL_CHOICES the config allows (default: all)
    as_list: NotRequired[bool]  # interrupt([request])[0] (default) or interrupt(request)
    args: NotRequired[dict[str, Any]]
    description: NotRequired[str]
    response: NotRequired[Any]  # the HumanResponse, as interrupt() returned it


def _review(state: ChoiceState) -> dict[str, Any]:
    allow = state.get("allow", list(ALL_CHOICES))
    request = {
        "action_request": {"action": "send_email", "args": state.get("args", DEFAULT_ARGS)},
        "config": {f"allow_{c}": c in allow for c in ALL_CHOICES},
        "description": state.get("description", "Send **this** email?"),
    }
    if state.get("as_list", True):
        return {"response": interrupt([request])}
    return {"response": interrupt(request)}


_choices = StateGraph(ChoiceState)
_choices.add_node("review", _review)
_choices.add_edge(START, "review")
_choices.add_edge("review", END)
graph = _choices.compile()


class AskState(TypedDict):
    answer: NotRequired[Any]


COUNT_SCHEMA = {
    "type": "object",
    "properties": {"count": {"type": "integer", "minimum": 1}, "note": {"type": "string"}},
    "required": ["count"],
}


def _ask(state: AskState) -> dict[str, Any]:
    return {"answer": interrupt({"question": "How many?"}, response_schema=COUNT_SCHEMA)}


_asked = StateGraph(AskState)
_asked.add_node("ask", _ask)
_asked.add_edge(START, "ask")
_asked.add_edge("ask", END)
asked = _asked.compile()
