# A copy of ../shared/peers/lg_project/graphs.py (the peers' benchmark graphs), unchanged below.
"""Benchmark graphs shared by every peer server (LangGraph Agent Server API).

Three graphs, registered under the graph ids ``echo``, ``slow`` and
``approval`` (see langgraph.json / aegra.json beside this file):

* ``echo``     -- one node; returns {"output": <input text>} at once.
* ``slow``     -- loops ``steps`` times (default 20); each step is its own
                  super-step (so each writes a checkpoint), sleeps
                  ``delay_ms`` (default 100) with asyncio.sleep, and appends
                  the step index to ``items``.  Long enough for a cancel to
                  land mid-run.
* ``approval`` -- a node calls ``interrupt({"tool": "issue_refund", ...})``;
                  when resumed with ``Command(resume=...)`` it records the
                  decision in state.

Only langgraph itself is imported: no model, no network.

No ``from __future__ import annotations`` on purpose: Aegra 0.6.0 imports
graph files with importlib without registering them in sys.modules, so
string annotations in the state TypedDicts cannot be resolved there
("name 'NotRequired' is not defined" from get_state and every run).
"""

import asyncio
import operator
from typing import Annotated, Any

from typing_extensions import NotRequired, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt


# --------------------------------------------------------------------- echo
class EchoState(TypedDict):
    input: NotRequired[str]
    output: NotRequired[str]


def _echo(state: EchoState) -> dict[str, Any]:
    return {"output": state.get("input", "")}


_echo_builder = StateGraph(EchoState)
_echo_builder.add_node("echo", _echo)
_echo_builder.add_edge(START, "echo")
_echo_builder.add_edge("echo", END)
echo = _echo_builder.compile()
echo.name = "echo"


# --------------------------------------------------------------------- slow
class SlowState(TypedDict):
    steps: NotRequired[int]
    delay_ms: NotRequired[int]
    items: Annotated[list[int], operator.add]


async def _step(state: SlowState) -> dict[str, Any]:
    delay_ms = state.get("delay_ms", 100)
    await asyncio.sleep(max(0, int(delay_ms)) / 1000.0)
    return {"items": [len(state.get("items") or [])]}


def _more(state: SlowState) -> str:
    steps = state.get("steps", 20)
    return "step" if len(state.get("items") or []) < int(steps) else END


_slow_builder = StateGraph(SlowState)
_slow_builder.add_node("step", _step)
_slow_builder.add_edge(START, "step")
_slow_builder.add_conditional_edges("step", _more, ["step", END])
slow = _slow_builder.compile()
slow.name = "slow"


# ----------------------------------------------------------------- approval
class ApprovalState(TypedDict):
    amount: NotRequired[float]
    order_id: NotRequired[str]
    decision: NotRequired[Any]
    status: NotRequired[str]


def _prepare(state: ApprovalState) -> dict[str, Any]:
    return {"status": "awaiting_approval"}


def _ask(state: ApprovalState) -> dict[str, Any]:
    decision = interrupt(
        {
            "tool": "issue_refund",
            "args": {
                "order_id": state.get("order_id", "A-1"),
                "amount": state.get("amount", 10.0),
            },
        }
    )
    approved = isinstance(decision, dict) and bool(decision.get("approved"))
    return {"decision": decision, "status": "approved" if approved else "rejected"}


_approval_builder = StateGraph(ApprovalState)
_approval_builder.add_node("prepare", _prepare)
_approval_builder.add_node("ask", _ask)
_approval_builder.add_edge(START, "prepare")
_approval_builder.add_edge("prepare", "ask")
_approval_builder.add_edge("ask", END)
approval = _approval_builder.compile()
approval.name = "approval"
