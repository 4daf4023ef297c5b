"""Types the engine and the service layer share, and the shape of an interrupt.

A leaf module: it imports nothing from Runsite, so services, selectors, the engine and the API
presenters can all depend on it without import cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID

from runs.models import Run, ToolCallStatus

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser


# Who did something: a dashboard user, a string such as "api:ci-key", or None for the system.
# A plain alias rather than a `type` statement: tools that parse this tree may run on 3.11.
Actor: TypeAlias = "AbstractBaseUser | AnonymousUser | str | None"  # noqa: UP040


def actor_name(actor: Actor) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    return str(actor.get_username())


@dataclass(frozen=True)
class Lease:
    """What a worker holds on a run it claimed; every write it makes is fenced by it."""

    run_id: UUID
    owner: str
    attempt: int
    # Known at claim time; lets fenced writes lock the thread and publish without a lookup.
    thread_id: UUID | None = None
    agent_id: str = ""
    parent_run_id: UUID | None = None


@dataclass
class StepWrite:
    """One checkpoint the step loop wants written (ids are chosen up front so steps can chain)."""

    id: UUID
    step: int
    values: dict[str, Any]
    pending: list[str]
    parent_id: UUID | None


@dataclass
class ClaimedRun:
    run: Run
    lease: Lease


@dataclass
class FenceResult:
    last_seq: int
    cancel_action: str | None


@dataclass
class BulkCancelResult:
    interrupted: list[UUID] = field(default_factory=list)  # done at once (pending/suspended)
    deleted: list[UUID] = field(default_factory=list)  # rolled back at once
    requested: list[UUID] = field(default_factory=list)  # running: the worker finishes it

    @property
    def count(self) -> int:
        return len(self.interrupted) + len(self.deleted) + len(self.requested)


@dataclass
class SuspendPlan:
    """One run to park: its waiting tool calls and the state they wait in."""

    lease: Lease
    waiting: list[dict[str, Any]]  # {tool_call_id, status, suspend_payload, resume_schema, ...}


def interrupt_of(w: dict[str, Any]) -> dict[str, Any]:
    """The LangGraph-style interrupt a waiting tool call shows to clients."""
    if w["status"] == ToolCallStatus.AWAITING_APPROVAL:
        value = {
            "type": "approval",
            "tool_call_id": w["tool_call_id"],
            "tool_name": w.get("tool_name"),
            "args": w.get("args"),
        }
        if w.get("suspend_payload") is not None:
            value["payload"] = w["suspend_payload"]
    else:
        value = {
            "type": "input",
            "tool_call_id": w["tool_call_id"],
            "tool_name": w.get("tool_name"),
            "payload": w.get("suspend_payload"),
            "resume_schema": w.get("resume_schema"),
        }
    return {"id": w["tool_call_id"], "value": value}
