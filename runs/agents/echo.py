from __future__ import annotations

from runs.engine import Agent, FinalAnswer, ScriptedModel

echo = Agent(
    id="echo",
    description="Finishes in one step with its input echoed back.",
    model=ScriptedModel(lambda state: FinalAnswer(output={"echo": state.input})),
)
