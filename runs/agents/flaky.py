from __future__ import annotations

from typing import Any

from runs.engine import Agent, FinalAnswer, ModelInput, ProposedCall, ScriptedModel, ToolCalls, tool


class FlakyFailure(RuntimeError):
    pass


@tool(description="Fails on the run's first attempt, works afterwards.")
def wobble(ctx: Any) -> dict[str, int]:
    if ctx.attempt == 1:
        raise FlakyFailure("first attempt fails on purpose")
    return {"attempt": ctx.attempt}


def _script(state: ModelInput) -> ToolCalls | FinalAnswer:
    result = state.last_result("wobble")
    if result is None:
        return ToolCalls([ProposedCall("wobble", {})])
    return FinalAnswer(output={"ok": True, "attempt": result.result["attempt"]})


flaky = Agent(
    id="flaky",
    description="Fails its first attempt with an exception and succeeds on retry.",
    tools=[wobble],
    model=ScriptedModel(_script),
)
