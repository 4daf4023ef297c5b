"""Graphs for Runsite's own tests: input interrupts, parallel interrupts, an Agent Inbox
request, a tool-calling agent on a fake chat model (no network), custom stream data."""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, NotRequired

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, AnyMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from typing_extensions import TypedDict


# --- ask: one interrupt that wants data --------------------------------------------------------
class AskState(TypedDict):
    name: NotRequired[str]
    greeting: NotRequired[str]


def _ask_name(state: AskState) -> dict[str, Any]:
    get_stream_writer()({"progress": "asking"})
    answer = interrupt({"question": "What is your name?"})
    return {"name": answer["name"]}


def _greet(state: AskState) -> dict[str, Any]:
    return {"greeting": f"Hello, {state['name']}!"}


_ask = StateGraph(AskState)
_ask.add_node("ask_name", _ask_name)
_ask.add_node("greet", _greet)
_ask.add_edge(START, "ask_name")
_ask.add_edge("ask_name", "greet")
_ask.add_edge("greet", END)
ask = _ask.compile()


# --- parallel: two branches interrupt in one super-step ------------------------------------------
class ParallelState(TypedDict):
    answers: Annotated[list[str], operator.add]


def _left(state: ParallelState) -> dict[str, Any]:
    return {"answers": [f"left={interrupt('left?')}"]}


def _right(state: ParallelState) -> dict[str, Any]:
    return {"answers": [f"right={interrupt('right?')}"]}


_parallel = StateGraph(ParallelState)
_parallel.add_node("left", _left)
_parallel.add_node("right", _right)
_parallel.add_edge(START, "left")
_parallel.add_edge(START, "right")
_parallel.add_edge("left", END)
_parallel.add_edge("right", END)
parallel = _parallel.compile()


# --- inbox: an Agent Inbox HumanInterrupt -------------------------------------------------------
class InboxState(TypedDict):
    to: NotRequired[str]
    response: NotRequired[Any]


def _review_email(state: InboxState) -> dict[str, Any]:
    request = {
        "action_request": {"action": "send_email", "args": {"to": state.get("to", "a@b.c")}},
        "config": {
            "allow_accept": True,
            "allow_edit": True,
            "allow_respond": True,
            "allow_ignore": True,
        },
        "description": "Send **this** email?",
    }
    return {"response": interrupt([request])[0]}


_inbox = StateGraph(InboxState)
_inbox.add_node("review_email", _review_email)
_inbox.add_edge(START, "review_email")
_inbox.add_edge("review_email", END)
inbox = _inbox.compile()


# --- tools: a tool-calling agent (StateGraph + ToolNode) on a fake chat model ------------------
@tool
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


class AgentState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel that also streams tool calls (the generic one drops them)."""

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any):
        message = next(self.messages)
        words = message.content.split(" ")
        for i, word in enumerate(words):
            text = word if i == len(words) - 1 else word + " "
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
            if run_manager is not None:
                run_manager.on_llm_new_token(text, chunk=chunk)
            yield chunk
        if message.tool_calls:
            calls = [
                {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                for i, c in enumerate(message.tool_calls)
            ]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=calls))


SCRIPT = [
    AIMessage(
        content="Refunding order A-7.",
        tool_calls=[
            {"id": "call_1", "name": "issue_refund", "args": {"order_id": "A-7", "amount": 12.5}}
        ],
    ),
    AIMessage(content="The refund is done."),
]


def _agent(state: AgentState) -> dict[str, Any]:
    # The script goes on from how far the conversation is: deterministic when a node re-runs.
    replies = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
    model = ScriptedChatModel(messages=iter(SCRIPT[replies:]))
    return {"messages": [model.invoke(state["messages"])]}


def _review(state: AgentState) -> dict[str, Any]:
    call = state["messages"][-1].tool_calls[0]
    decision = interrupt({"tool": call["name"], "args": call["args"]})
    if decision.get("approved"):
        return {}
    return {
        "messages": [
            AIMessage(content=f"Not refunded: {decision.get('reason') or 'declined'}", id="no")
        ]
    }


def _after_review(state: AgentState) -> str:
    last = state["messages"][-1]
    return "tools" if getattr(last, "tool_calls", None) else END


_tools = StateGraph(AgentState)
_tools.add_node("agent", _agent)
_tools.add_node("review", _review)
_tools.add_node("tools", ToolNode([issue_refund]))
_tools.add_edge(START, "agent")
_tools.add_conditional_edges("agent", tools_condition, {"tools": "review", END: END})
_tools.add_conditional_edges("review", _after_review, ["tools", END])
_tools.add_edge("tools", "agent")
tools = _tools.compile()
