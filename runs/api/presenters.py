"""Model → wire shapes the Out schemas cannot read off a model (assistants, ThreadState)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.utils import timezone

from runs import selectors
from runs.contracts import assistant_uuid
from runs.engine.agent import Agent
from runs.engine.registry import all_agents
from runs.exceptions import ValidationFailed
from runs.models import Checkpoint, Run, Thread, ThreadStatus

# Agents are code, not rows: their "created_at" is when this process loaded them.
LOADED_AT = timezone.now()


def find_agent(assistant_id: str) -> Agent | None:
    """An agent by id, or by its LangGraph system-assistant uuid."""
    agents = all_agents()
    if assistant_id in agents:
        return agents[assistant_id]
    wanted = assistant_id.strip().lower()
    for agent_id, agent in agents.items():
        if assistant_uuid(agent_id) == wanted:
            return agent
    return None


def agent_id_for_run(assistant_id: str) -> str:
    agent = find_agent(assistant_id)
    if agent is None:
        known = ", ".join(sorted(all_agents())) or "none"
        error = ValidationFailed.field(
            "assistant_id",
            "unknown assistant",
            detail=f"Assistant {assistant_id!r} not found; registered graphs: {known}",
        )
        error.code = "assistant_not_found"
        raise error
    return agent.id


def assistant_out(agent: Agent) -> dict[str, Any]:
    return {
        "assistant_id": assistant_uuid(agent.id),
        "graph_id": agent.id,
        "name": agent.id,
        "description": agent.description or None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": LOADED_AT,
        "updated_at": LOADED_AT,
    }


# --- LangGraph shapes ----------------------------------------------------------------------


def with_interrupts(
    thread: Thread, interrupts: dict[str, list[dict[str, Any]]] | None = None
) -> Thread:
    """The thread with what its suspended run waits on, for `ThreadOut.interrupts`.

    Without `interrupts` they are read for an interrupted thread (one query); a listing passes
    them in, read for the whole page at once.
    """
    if interrupts is None and thread.status == ThreadStatus.INTERRUPTED:
        interrupts = selectors.threads_interrupts([thread.id]).get(thread.id, {})
    thread.waiting_interrupts = interrupts or {}  # type: ignore[attr-defined]
    return thread


def _checkpoint_ref(thread_id: UUID | None, checkpoint_id: UUID | None) -> dict | None:
    if checkpoint_id is None:
        return None
    return {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}


def state_out(
    thread: Thread,
    checkpoint: Checkpoint | None,
    interrupts: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """A LangGraph ThreadState for one checkpoint (None: a thread that never ran)."""
    if checkpoint is None:
        return {
            "values": thread.values or {},
            "next": [],
            "tasks": [],
            "metadata": None,
            "created_at": None,
            "checkpoint": None,
            "parent_checkpoint": None,
            "interrupts": [],
            "checkpoint_id": None,
            "parent_checkpoint_id": None,
        }
    flat = [i for items in (interrupts or {}).values() for i in items]
    pending = bool(checkpoint.pending) or bool(flat)
    tasks = []
    if pending:
        tasks = [
            {
                "id": str(run_id),
                "name": "tools",
                "path": ["__pregel_pull", "tools"],
                "error": None,
                "interrupts": items,
                "checkpoint": None,
                "state": None,
                "result": None,
            }
            for run_id, items in (interrupts or {str(checkpoint.run_id): []}).items()
        ]
    return {
        "values": checkpoint.values,
        "next": ["tools"] if pending else [],
        "tasks": tasks,
        "metadata": {
            "source": "loop" if checkpoint.run_id else "update",
            "step": checkpoint.step,
            "run_id": str(checkpoint.run_id) if checkpoint.run_id else None,
            "thread_id": str(thread.id),
            "parents": {},
        },
        "created_at": checkpoint.created_at,
        "checkpoint": _checkpoint_ref(thread.id, checkpoint.id),
        "parent_checkpoint": _checkpoint_ref(thread.id, checkpoint.parent_id),
        "interrupts": flat,
        "checkpoint_id": checkpoint.id,
        "parent_checkpoint_id": checkpoint.parent_id,
    }


def checkpoint_id_from(value: Any) -> UUID | None:
    """A checkpoint id given as a string, {"checkpoint_id"} or {"configurable": {...}}."""
    if value in (None, "", {}):
        return None
    if isinstance(value, dict):
        value = value.get("checkpoint_id") or (value.get("configurable") or {}).get("checkpoint_id")
        if value is None:
            return None
    try:
        return UUID(str(value))
    except ValueError:
        raise ValidationFailed.field(
            "checkpoint_id", "must be a UUID", detail="Invalid checkpoint ID: must be a UUID"
        ) from None


def stream_attempt(run: Run) -> int:
    """The attempt a stream's metadata reports: the next one for a run still waiting to start."""
    if run.status == "pending":
        return run.attempt + 1
    return max(run.attempt, 1)


def as_bool(value: Any) -> bool:
    """LangGraph's query booleans: true/yes/1 (the SDK sends wait=0|1)."""
    return str(value).strip().lower() in ("true", "yes", "1", "on")
