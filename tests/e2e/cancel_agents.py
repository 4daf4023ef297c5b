"""An agent whose tool ignores cancellation, for worker processes started by tests
(`RUNS_AGENTS=runs.agents.BUILTIN_AGENTS,tests.e2e.cancel_agents.AGENTS`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls, tool

# A file the tool writes as it starts, when the test names one: the record says `running` as
# soon as the decision is written, a moment before the tool itself starts.
STARTED_FILE = "RUNS_TEST_TOOL_STARTED_FILE"


@tool(parameters={"type": "object"})
def charge(ctx: Any, amount: int = 1) -> dict[str, Any]:
    if os.environ.get(STARTED_FILE):
        Path(os.environ[STARTED_FILE]).write_text(ctx.tool_call_id)
    time.sleep(1.5)  # an external call that cannot be interrupted half-way
    return {"charged": amount}


def _charge_twice(state: Any) -> ToolCalls | FinalAnswer:
    done = sum(1 for r in state.results if r.name == "charge")
    if done >= 2:
        return FinalAnswer(output={"charged": done})
    return ToolCalls([ProposedCall("charge", {"amount": 5})])


AGENTS = [Agent(id="stubborn", tools=[charge], model=ScriptedModel(_charge_twice))]
