"""Agents with review deadlines of a second or two, for worker processes started by tests
(`RUNS_AGENTS=runs.agents.BUILTIN_AGENTS,tests.e2e.deadline_agents.AGENTS`)."""

from __future__ import annotations

from typing import Any

from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls, tool


@tool(requires_approval=True, parameters={"type": "object"})
def pay(ctx: Any, amount: int = 1) -> dict[str, Any]:
    return {"paid": amount}


def _pay_once(state: Any) -> ToolCalls | FinalAnswer:
    result = state.last_result("pay")
    if result is None:
        return ToolCalls([ProposedCall("pay", {"amount": 7})])
    if result.declined:
        return FinalAnswer(output={"paid": False, "reason": result.result["reason"]})
    return FinalAnswer(output={"paid": True})


def _agent(agent_id: str, **policy: Any) -> Agent:
    return Agent(id=agent_id, tools=[pay], model=ScriptedModel(_pay_once), **policy)


AGENTS = [
    _agent(
        "deadline_decline",
        review_timeout_seconds=1.5,
        on_review_timeout="decline",
        review_timeout_reason="Nobody approved the payment in time.",
    ),
    _agent("deadline_cancel", review_timeout_seconds=1.5, on_review_timeout="cancel"),
    _agent("deadline_mark", review_timeout_seconds=1.5),
]
