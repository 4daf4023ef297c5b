"""Runsite's agent runtime: Agent/Tool/Model protocols, the step loop and the worker.

Import the pieces an agent definition needs from here; the loop and the worker import the
service layer and are loaded only where runs execute.
"""

from runs.engine.agent import Agent, Tool, delegate, tool
from runs.engine.context import ToolContext
from runs.engine.model import (
    FinalAnswer,
    ModelInput,
    OpenAIChatModel,
    ProposedCall,
    ScriptedModel,
    ToolCalls,
    ToolResult,
)

__all__ = [
    "Agent",
    "FinalAnswer",
    "ModelInput",
    "OpenAIChatModel",
    "ProposedCall",
    "ScriptedModel",
    "Tool",
    "ToolCalls",
    "ToolContext",
    "ToolResult",
    "delegate",
    "tool",
]
