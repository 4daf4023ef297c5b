"""The review API (snake_case, modelled on Mastra): list suspended runs, approve, decline, resume.

A run of another agent answers 404 on an agent's routes (no leak across agents); a key pinned to
a resource sees nothing outside it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router

from runs import selectors, services
from runs.api import presenters as p
from runs.api import streaming
from runs.api.auth import Caller, caller_of
from runs.api.langgraph import SSE_200
from runs.api.schemas import (
    AgentRunsOut,
    ApproveIn,
    DeclineIn,
    ResumeIn,
    ReviewRunOut,
    RunEventsOut,
    SuspendedRunsOut,
    errors,
)
from runs.engine.registry import get_agent
from runs.models import Run

review = Router(tags=["review"])

REVIEW_STREAM_MODES = ["values", "updates", "custom"]


@review.get("/agents/{agent_id}/suspended-runs", response={200: SuspendedRunsOut, **errors(404)})
def list_suspended_runs(
    request: HttpRequest,
    agent_id: str,
    thread_id: UUID | None = None,
    resource_id: str | None = None,
    from_date: datetime | None = None,
    to_date: datetime | None = None,
    per_page: int | None = None,
    page: int | None = None,
):
    caller = caller_of(request)
    get_agent(agent_id)
    found = selectors.suspended_runs_for_agent(
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        from_date=from_date,
        to_date=to_date,
        per_page=per_page,
        page=page,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {"runs": [p.suspended_run_out(r) for r in found.items], "total": found.total}


@review.get("/agents/{agent_id}/runs", response={200: AgentRunsOut, **errors(404)})
def list_agent_runs(
    request: HttpRequest,
    agent_id: str,
    status: list[str] | None = Query(None),  # noqa: B008 - ninja's way to declare a query list
    thread_id: UUID | None = None,
    resource_id: str | None = None,
    from_date: datetime | None = None,
    to_date: datetime | None = None,
    per_page: int | None = None,
    page: int | None = None,
):
    caller = caller_of(request)
    get_agent(agent_id)
    found = selectors.runs_for_agent(
        agent_id=agent_id,
        status=[s for value in status or [] for s in value.split(",") if s.strip()] or None,
        thread_id=thread_id,
        resource_id=resource_id,
        from_date=from_date,
        to_date=to_date,
        per_page=per_page,
        page=page,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {"runs": [p.suspended_run_out(r) for r in found.items], "total": found.total}


# --- decisions -------------------------------------------------------------------------------


def _approve(caller: Caller, agent_id: str, payload: ApproveIn) -> Run:
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    return services.tool_call_approve(
        run=run,
        actor=caller.actor,
        tool_call_id=payload.tool_call_id,
        args=payload.args,
        pinned_resource_id=caller.pinned_resource_id,
    )


def _decline(caller: Caller, agent_id: str, payload: DeclineIn) -> Run:
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    return services.tool_call_decline(
        run=run,
        actor=caller.actor,
        tool_call_id=payload.tool_call_id,
        reason=payload.reason or "",
        pinned_resource_id=caller.pinned_resource_id,
    )


def _resume(caller: Caller, agent_id: str, payload: ResumeIn) -> Run:
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    return services.tool_call_answer(
        run=run,
        actor=caller.actor,
        resume_data=payload.resume_data,
        tool_call_id=payload.tool_call_id,
        pinned_resource_id=caller.pinned_resource_id,
    )


def _decided(caller: Caller, run: Run) -> tuple[int, dict[str, Any]]:
    detail = selectors.run_detail(run.id, pinned_resource_id=caller.pinned_resource_id)
    return 202, p.review_run_out(detail)


@review.post(
    "/agents/{agent_id}/approve-tool-call", response={202: ReviewRunOut, **errors(404, 409)}
)
def approve_tool_call(request: HttpRequest, agent_id: str, payload: ApproveIn):
    caller = caller_of(request)
    return _decided(caller, _approve(caller, agent_id, payload))


@review.post(
    "/agents/{agent_id}/decline-tool-call", response={202: ReviewRunOut, **errors(404, 409)}
)
def decline_tool_call(request: HttpRequest, agent_id: str, payload: DeclineIn):
    caller = caller_of(request)
    return _decided(caller, _decline(caller, agent_id, payload))


@review.post("/agents/{agent_id}/resume", response={202: ReviewRunOut, **errors(404, 409)})
def resume_run(request: HttpRequest, agent_id: str, payload: ResumeIn):
    caller = caller_of(request)
    return _decided(caller, _resume(caller, agent_id, payload))


async def _decide_and_stream(
    request: HttpRequest, decide: Callable[[Caller, str, Any], Run], agent_id: str, payload: Any
) -> HttpResponse:
    caller = caller_of(request)
    run = await streaming.db(decide, caller, agent_id, payload)
    body = streaming.sse_events(
        run.id,
        modes=REVIEW_STREAM_MODES,
        after=run.last_seq,
        attempt=p.stream_attempt(run),
    )
    headers = {"Content-Location": f"/runs/{run.id}"}
    if run.thread_id:
        headers["Location"] = f"/threads/{run.thread_id}/runs/{run.id}/stream"
    return streaming.sse_response(body, headers)


@review.post(
    "/agents/{agent_id}/approve-tool-call/stream",
    response=errors(404, 409),
    openapi_extra=SSE_200,
)
async def approve_tool_call_stream(request: HttpRequest, agent_id: str, payload: ApproveIn):
    return await _decide_and_stream(request, _approve, agent_id, payload)


@review.post(
    "/agents/{agent_id}/decline-tool-call/stream",
    response=errors(404, 409),
    openapi_extra=SSE_200,
)
async def decline_tool_call_stream(request: HttpRequest, agent_id: str, payload: DeclineIn):
    return await _decide_and_stream(request, _decline, agent_id, payload)


@review.post("/agents/{agent_id}/resume-stream", response=errors(404, 409), openapi_extra=SSE_200)
async def resume_stream(request: HttpRequest, agent_id: str, payload: ResumeIn):
    return await _decide_and_stream(request, _resume, agent_id, payload)


# --- any run in scope ------------------------------------------------------------------------


@review.get("/runs/{run_id}", response={200: ReviewRunOut, **errors(404)})
def get_review_run(request: HttpRequest, run_id: UUID):
    caller = caller_of(request)
    return p.review_run_out(
        selectors.run_detail(run_id, pinned_resource_id=caller.pinned_resource_id)
    )


@review.get("/runs/{run_id}/events", response={200: RunEventsOut, **errors(404)})
def get_run_events(request: HttpRequest, run_id: UUID, after: int = 0, limit: int = 100):
    caller = caller_of(request)
    run = selectors.run_get(run_id, pinned_resource_id=caller.pinned_resource_id)
    events = selectors.run_events(run, after=max(0, after), limit=max(1, min(limit, 1000)))
    return {
        "events": [p.event_out(e) for e in events],
        "next_after": events[-1].seq if events else max(0, after),
    }
