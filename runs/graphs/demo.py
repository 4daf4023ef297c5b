"""A demo LangGraph graph (`make run` registers it with runs/graphs/demo.json): it drafts a
reply to a customer email and asks a reviewer, with an Agent Inbox request, before sending."""

from __future__ import annotations

from typing import Any, NotRequired

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from typing_extensions import TypedDict


class TriageState(TypedDict):
    sender: NotRequired[str]
    subject: NotRequired[str]
    body: NotRequired[str]
    draft: NotRequired[str]
    outcome: NotRequired[str]


def draft_reply(state: TriageState) -> dict[str, Any]:
    name = (state.get("sender") or "there").split("@")[0].title()
    return {
        "draft": f"Hi {name},\n\nThanks for writing about “{state.get('subject', 'your order')}”. "
        "We have refunded the duplicate charge; it shows up within 5 business days.\n\nBest, Support"
    }


def review(state: TriageState) -> dict[str, Any]:
    request = {
        "action_request": {
            "action": "send_email",
            "args": {"to": state.get("sender", ""), "body": state.get("draft", "")},
        },
        "config": {
            "allow_accept": True,
            "allow_edit": True,
            "allow_respond": True,
            "allow_ignore": True,
        },
        "description": (
            f"**{state.get('sender', 'A customer')}** wrote: _{state.get('subject', '')}_\n\n"
            f"> {state.get('body', '')}\n\nSend the drafted reply?"
        ),
    }
    response = interrupt([request])[0]
    kind = response.get("type") if isinstance(response, dict) else None
    if kind in ("accept", "edit"):
        args = (response.get("args") or {}).get("args") or {}
        return {"draft": args.get("body", state.get("draft", "")), "outcome": "sent"}
    if kind == "response":
        return {"outcome": f"not sent: {response.get('args')}"}
    return {"outcome": "ignored"}


_builder = StateGraph(TriageState)
_builder.add_node("draft_reply", draft_reply)
_builder.add_node("review", review)
_builder.add_edge(START, "draft_reply")
_builder.add_edge("draft_reply", "review")
_builder.add_edge("review", END)
graph = _builder.compile()
