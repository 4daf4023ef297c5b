from __future__ import annotations

from typing import Any

from runs.engine import Agent, FinalAnswer, ModelInput, ProposedCall, ScriptedModel, ToolCalls, tool

INPUT_SCHEMA = {
    "type": ["object", "null"],
    "properties": {
        "steps": {"type": "integer", "minimum": 0, "maximum": 100_000},
        "delay_ms": {"type": "integer", "minimum": 0, "maximum": 600_000},
    },
}


@tool(
    description="Wait delay_ms milliseconds (wakes at once when the run is cancelled).",
    parameters={
        "type": "object",
        "properties": {"i": {"type": "integer"}, "delay_ms": {"type": "integer", "minimum": 0}},
        "required": ["i", "delay_ms"],
    },
)
def tick(ctx: Any, i: int, delay_ms: int) -> dict[str, int]:
    ctx.sleep(delay_ms / 1000)
    return {"tick": i}


def _script(state: ModelInput) -> ToolCalls | FinalAnswer:
    params = state.input or {}
    steps = params.get("steps", 20)
    delay_ms = params.get("delay_ms", 100)
    done = sum(1 for r in state.results if r.name == "tick")
    if done >= steps:
        return FinalAnswer(output={"steps": done})
    return ToolCalls([ProposedCall("tick", {"i": done + 1, "delay_ms": delay_ms})])


slow = Agent(
    id="slow",
    description="Takes `steps` steps of `delay_ms` each, checkpointing every step.",
    tools=[tick],
    model=ScriptedModel(_script),
    max_steps=100_001,
    input_schema=INPUT_SCHEMA,
)
