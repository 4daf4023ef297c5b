"""The registered agents, loaded once from settings.RUNS_AGENTS (dotted paths)."""

from __future__ import annotations

import logging
import threading
from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from runs.engine.agent import Agent, ReviewPolicy, flatten_agents
from runs.exceptions import NotFound

logger = logging.getLogger("runs.engine")
_lock = threading.Lock()
_extra: dict[str, Agent] = {}


@cache
def _configured() -> dict[str, Agent]:
    agents: dict[str, Agent] = {}
    for path in settings.RUNS_AGENTS:
        try:
            obj = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"RUNS_AGENTS: cannot import {path!r}: {exc}") from exc
        for agent in flatten_agents(obj):
            if agent.id in agents and agents[agent.id] is not agent:
                raise ImproperlyConfigured(f"RUNS_AGENTS: agent id {agent.id!r} is defined twice")
            agents[agent.id] = agent
    from runs.graphs.loader import configured_graphs  # RUNS_GRAPHS: LangGraph graphs as agents

    for graph_id, graph in configured_graphs().items():
        if graph_id in agents:  # the user's graph wins over a built-in agent of the same id
            logger.warning("RUNS_GRAPHS: graph %r replaces the agent of that id", graph_id)
        agents[graph_id] = graph
    return agents


def all_agents() -> dict[str, Agent]:
    return {**_configured(), **_extra}


def get_agent(agent_id: str) -> Agent:
    agent = all_agents().get(agent_id)
    if agent is None:
        known = ", ".join(sorted(all_agents())) or "none"
        raise NotFound(
            f"Agent {agent_id!r} not found (registered: {known})", code="agent_not_found"
        )
    return agent


def tool_description(agent_id: str, tool_name: str | None) -> str:
    """What a tool says it does ("" for an unknown agent or tool): shown to reviewers."""
    agent = all_agents().get(agent_id)
    tool = agent.get_tool(tool_name) if agent is not None and tool_name else None
    return tool.description if tool is not None else ""


def review_policy(agent_id: str, tool_name: str | None) -> ReviewPolicy | None:
    """The review deadline a waiting call of `agent_id` gets (None: no deadline, or a graph)."""
    agent = all_agents().get(agent_id)
    return agent.review_policy(tool_name) if agent is not None else None


def register(agent: Agent) -> Agent:
    """Add an agent at run time (tests, plugins). Replaces one with the same id."""
    with _lock:
        _extra[agent.id] = agent
    return agent


def unregister(agent_id: str) -> None:
    with _lock:
        _extra.pop(agent_id, None)
