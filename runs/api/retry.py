"""Retry over the API: one ended run (`POST /runs/{run_id}/retry`) or many (`POST /runs/retry`).

A key pinned to a resource retries only its resource's runs (others answer 404, or are not
selected by a filter). Unknown body fields are refused (422), never ignored.
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Field, Router, Schema, Status
from pydantic import ConfigDict

from runs import selectors, services
from runs.api.auth import caller_of
from runs.api.schemas import BodyIn, errors
from runs.exceptions import ValidationFailed
from runs.models import Run
from runs.selectors import retry as retry_reads

retry = Router(tags=["retry"])

EndedStatus = Literal["success", "error", "timeout", "interrupted"]


class RetryIn(BodyIn):
    model_config = ConfigDict(extra="forbid")

    # Omitted: the original run's input. Given (even null): the new input, checked against the
    # agent's input schema.
    input: Any = None
    new_thread: bool = False
    reason: str = Field("", max_length=2000)


class RetryManyIn(BodyIn):
    model_config = ConfigDict(extra="forbid")

    run_ids: list[UUID] | None = Field(None, max_length=services.RETRY_MANY_LIMIT)
    status: EndedStatus | None = None
    agent_id: str | None = None
    new_thread: bool = False
    reason: str = Field("", max_length=2000)


class RetriedRunOut(Schema):
    run_id: UUID = Field(alias="id")
    thread_id: UUID | None
    agent_id: str
    status: str
    retry_of: UUID | None = Field(alias="retry_of_id")


class RetriedPairOut(Schema):
    run_id: UUID
    retried_as: UUID


class SkippedOut(Schema):
    run_id: UUID
    reason: str


class RetryManyOut(Schema):
    retried: list[RetriedPairOut]
    skipped: list[SkippedOut]


@retry.post("/runs/retry", response={200: RetryManyOut, **errors()})
def retry_runs(request: HttpRequest, payload: RetryManyIn) -> dict[str, Any]:
    caller = caller_of(request)
    by_filter = payload.status is not None or payload.agent_id is not None
    if (payload.run_ids is not None) == by_filter:
        raise ValidationFailed.field(
            "run_ids",
            "give run_ids or a filter (status, agent_id), not both",
            detail="Give either run_ids or a filter (status and optionally agent_id)",
        )
    if by_filter and payload.status is None:
        raise ValidationFailed.field("status", "required with agent_id")
    queryset = None
    if by_filter:
        queryset = retry_reads.runs_for_retry(
            status=payload.status, agent_id=payload.agent_id, scope=caller.pinned_resource_id
        )
    result = services.runs_retry_many(
        actor=caller.actor,
        run_ids=payload.run_ids,
        queryset=queryset,
        new_thread=payload.new_thread,
        reason=payload.reason,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {
        "retried": [{"run_id": a, "retried_as": b} for a, b in result.retried],
        "skipped": [{"run_id": a, "reason": why} for a, why in result.skipped],
    }


@retry.post("/runs/{run_id}/retry", response={201: RetriedRunOut, **errors(404, 409)})
def retry_run(request: HttpRequest, run_id: UUID, payload: RetryIn) -> Status[Run]:
    caller = caller_of(request)
    run = selectors.run_get(run_id, pinned_resource_id=caller.pinned_resource_id)
    extra: dict[str, Any] = {"input": payload.input} if "input" in payload.model_fields_set else {}
    new = services.run_retry(
        run=run,
        actor=caller.actor,
        new_thread=payload.new_thread,
        reason=payload.reason,
        pinned_resource_id=caller.pinned_resource_id,
        **extra,
    )
    return Status(201, new)
