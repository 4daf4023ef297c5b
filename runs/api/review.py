"""The review API (snake_case, modelled on Mastra): list suspended runs, approve, decline, resume.

A run of another agent answers 404 on an agent's routes (no leak across agents); a key pinned to
a resource sees nothing outside it. The listings also take Mastra's camelCase filter names, and
every GET refuses a query parameter it does not know (a misspelt filter would match everything).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query, Router, Status

from runs import selectors, services
from runs.api import presenters as p
from runs.api import streaming
from runs.api.auth import Caller, caller_of
from runs.api.claim_schemas import ClaimIn, ClaimOut, ReleaseIn
from runs.api.dates import date_bound
from runs.api.langgraph import SSE_200
from runs.api.schemas import (
    AgentRunsOut,
    AgentRunsQuery,
    AgentRunsStatusQuery,
    Approval,
    ApproveIn,
    ClampedLimit,
    DeclineIn,
    ResumeIn,
    ReviewRunOut,
    RunEventsOut,
    SuspendedRunsOut,
    errors,
)
from runs.engine.registry import get_agent
from runs.exceptions import ValidationFailed
from runs.models import PENDING_DECISION_STATUSES, Run, ToolCall, ToolCallStatus

review = Router(tags=["review"])

REVIEW_STREAM_MODES = ["values", "updates", "custom"]


def _query_names(schema: type[AgentRunsQuery]) -> tuple[str, ...]:
    return tuple(field.alias or name for name, field in schema.model_fields.items())


SUSPENDED_RUNS_PARAMS = _query_names(AgentRunsQuery)
AGENT_RUNS_PARAMS = _query_names(AgentRunsStatusQuery)
EVENTS_PARAMS = ("after", "limit")


def _refuse_unknown_query(request: HttpRequest, known: Sequence[str]) -> None:
    unknown = [name for name in request.GET if name not in known]
    if unknown:
        listed = ", ".join(known) or "none"
        names = ", ".join(map(repr, unknown))
        raise ValidationFailed.field(
            unknown[0],
            f"unknown query parameter; known: {listed}",
            detail=f"unknown query parameter {names}; known: {listed}",
        )


def _listing_filters(filters: AgentRunsQuery) -> dict[str, Any]:
    """The selector's filters: either spelling, dates as aware UTC bounds."""
    from_name, from_raw = filters.pick("from_date")
    to_name, to_raw = filters.pick("to_date")
    return {
        "thread_id": filters.pick("thread_id")[1],
        "resource_id": filters.pick("resource_id")[1],
        "from_date": date_bound(from_raw, field=from_name, end=False),
        "to_date": date_bound(to_raw, field=to_name, end=True),
        "per_page": filters.pick("per_page")[1],
        "page": filters.page,
    }


@review.get("/agents/{agent_id}/suspended-runs", response={200: SuspendedRunsOut, **errors(404)})
def list_suspended_runs(
    request: HttpRequest, agent_id: str, filters: Query[AgentRunsQuery]
) -> dict[str, Any]:
    _refuse_unknown_query(request, SUSPENDED_RUNS_PARAMS)
    caller = caller_of(request)
    get_agent(agent_id)
    found = selectors.suspended_runs_for_agent(
        agent_id=agent_id,
        **_listing_filters(filters),
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {"runs": found.items, "total": found.total}


@review.get("/agents/{agent_id}/runs", response={200: AgentRunsOut, **errors(404)})
def list_agent_runs(
    request: HttpRequest, agent_id: str, filters: Query[AgentRunsStatusQuery]
) -> dict[str, Any]:
    _refuse_unknown_query(request, AGENT_RUNS_PARAMS)
    caller = caller_of(request)
    get_agent(agent_id)
    status = [s for value in filters.status or [] for s in value.split(",") if s.strip()]
    found = selectors.runs_for_agent(
        agent_id=agent_id,
        status=status or None,
        **_listing_filters(filters),
        pinned_resource_id=caller.pinned_resource_id,
    )
    return {"runs": found.items, "total": found.total}


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
        comment=payload.comment or "",
        pinned_resource_id=caller.pinned_resource_id,
        take_over=payload.force,
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
        take_over=payload.force,
    )


def _awaits_approval(caller: Caller, run: Run, tool_call_id: str | None) -> bool:
    """Whether the call a resume addresses waits for an approval (not for input).

    Only picks the service to call: the service checks the call's status again under its lock.
    """
    if tool_call_id is not None:
        # `run` was read through the key's pin already: no dashboard scope applies here.
        tc = selectors.tool_call_get(run.id, tool_call_id, user=selectors.UNSCOPED)
        return tc.status == (ToolCallStatus.AWAITING_APPROVAL)
    detail = selectors.run_detail(run.id, pinned_resource_id=caller.pinned_resource_id)
    waiting = [tc for tc in detail.tool_calls if tc.status in PENDING_DECISION_STATUSES]
    return len(waiting) == 1 and waiting[0].status == ToolCallStatus.AWAITING_APPROVAL


def _resume(caller: Caller, agent_id: str, payload: ResumeIn) -> Run:
    """Answer a tool that asked for input, or (Mastra's resumeStream({approved})) an approval."""
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    approval: Approval | None = payload.top_level_approval()
    if approval is None and _awaits_approval(caller, run, payload.tool_call_id):
        approval = payload.approval_in_resume_data()
        if approval is None:
            raise ValidationFailed.field(
                "resume_data.approved",
                "expected a boolean: the tool call awaits approval",
                detail='The tool call awaits approval: resume with {"approved": true} '
                '(optionally "args") or {"approved": false, "reason": "..."}',
            )
    if approval is None:
        return services.tool_call_answer(
            run=run,
            actor=caller.actor,
            resume_data=payload.resume_data,
            tool_call_id=payload.tool_call_id,
            pinned_resource_id=caller.pinned_resource_id,
            take_over=payload.force,
        )
    if approval.approved:
        return services.tool_call_approve(
            run=run,
            actor=caller.actor,
            tool_call_id=payload.tool_call_id,
            args=approval.args,
            comment=approval.comment or "",
            pinned_resource_id=caller.pinned_resource_id,
            take_over=payload.force,
        )
    if approval.comment:
        where = "comment" if payload.approved is not None else "resume_data.comment"
        raise ValidationFailed.field(where, "only with an approval (a decline gives a reason)")
    return services.tool_call_decline(
        run=run,
        actor=caller.actor,
        tool_call_id=payload.tool_call_id,
        reason=approval.reason or "",
        pinned_resource_id=caller.pinned_resource_id,
        take_over=payload.force,
    )


def _decided(caller: Caller, run: Run) -> Status[selectors.RunDetail]:
    return Status(202, selectors.run_detail(run.id, pinned_resource_id=caller.pinned_resource_id))


@review.post(
    "/agents/{agent_id}/approve-tool-call", response={202: ReviewRunOut, **errors(404, 409)}
)
def approve_tool_call(
    request: HttpRequest, agent_id: str, payload: ApproveIn
) -> Status[selectors.RunDetail]:
    caller = caller_of(request)
    return _decided(caller, _approve(caller, agent_id, payload))


@review.post(
    "/agents/{agent_id}/decline-tool-call", response={202: ReviewRunOut, **errors(404, 409)}
)
def decline_tool_call(
    request: HttpRequest, agent_id: str, payload: DeclineIn
) -> Status[selectors.RunDetail]:
    caller = caller_of(request)
    return _decided(caller, _decline(caller, agent_id, payload))


@review.post("/agents/{agent_id}/resume", response={202: ReviewRunOut, **errors(404, 409)})
def resume_run(
    request: HttpRequest, agent_id: str, payload: ResumeIn
) -> Status[selectors.RunDetail]:
    caller = caller_of(request)
    return _decided(caller, _resume(caller, agent_id, payload))


async def _decide_and_stream(
    request: HttpRequest, decide: Callable[[Caller, str, Any], Run], agent_id: str, payload: Any
) -> StreamingHttpResponse:
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
async def approve_tool_call_stream(
    request: HttpRequest, agent_id: str, payload: ApproveIn
) -> StreamingHttpResponse:
    return await _decide_and_stream(request, _approve, agent_id, payload)


@review.post(
    "/agents/{agent_id}/decline-tool-call/stream",
    response=errors(404, 409),
    openapi_extra=SSE_200,
)
async def decline_tool_call_stream(
    request: HttpRequest, agent_id: str, payload: DeclineIn
) -> StreamingHttpResponse:
    return await _decide_and_stream(request, _decline, agent_id, payload)


@review.post("/agents/{agent_id}/resume-stream", response=errors(404, 409), openapi_extra=SSE_200)
async def resume_stream(
    request: HttpRequest, agent_id: str, payload: ResumeIn
) -> StreamingHttpResponse:
    return await _decide_and_stream(request, _resume, agent_id, payload)


# --- claims ----------------------------------------------------------------------------------


def _claim_out(tc: ToolCall) -> dict[str, Any]:
    return {
        "run_id": tc.run_id,
        "tool_call_id": tc.tool_call_id,
        "tool_name": tc.tool_name,
        "claimed_by": tc.claimed_by,
        "claimed_until": tc.claimed_until,
        "review_deadline_at": tc.review_deadline_at,
    }


@review.post(
    "/agents/{agent_id}/claim-tool-call", response={200: ClaimOut, **errors(404, 409, 422)}
)
def claim_tool_call(request: HttpRequest, agent_id: str, payload: ClaimIn) -> dict[str, Any]:
    """Claim a waiting call ("I'm on it") for `minutes`, renew one's claim, or assign it to a
    reviewer (`assignee`). 409 `claimed_by_other` names the holder of a live claim."""
    caller = caller_of(request)
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    tc = selectors.reviews.waiting_call(run, payload.tool_call_id)
    claimed = services.tool_call_claim(
        actor=caller.actor,
        tool_call=tc,
        minutes=payload.minutes,
        assignee=payload.assignee,
        pinned_resource_id=caller.pinned_resource_id,
    )
    return _claim_out(claimed)


@review.post("/agents/{agent_id}/release-tool-call", response={200: ClaimOut, **errors(404, 409)})
def release_tool_call(request: HttpRequest, agent_id: str, payload: ReleaseIn) -> dict[str, Any]:
    """Give up one's claim (releasing an unclaimed call is a no-op; another's: 409)."""
    caller = caller_of(request)
    run = selectors.run_for_agent(
        payload.run_id, agent_id=agent_id, pinned_resource_id=caller.pinned_resource_id
    )
    tc = selectors.reviews.waiting_call(run, payload.tool_call_id)
    released = services.tool_call_release(
        actor=caller.actor, tool_call=tc, pinned_resource_id=caller.pinned_resource_id
    )
    return _claim_out(released)


# --- any run in scope ------------------------------------------------------------------------


@review.get("/runs/{run_id}", response={200: ReviewRunOut, **errors(404)})
def get_review_run(request: HttpRequest, run_id: UUID) -> selectors.RunDetail:
    _refuse_unknown_query(request, ())
    caller = caller_of(request)
    return selectors.run_detail(run_id, pinned_resource_id=caller.pinned_resource_id)


@review.get("/runs/{run_id}/events", response={200: RunEventsOut, **errors(404)})
def get_run_events(
    request: HttpRequest, run_id: UUID, after: int = 0, limit: ClampedLimit = 100
) -> dict[str, Any]:
    _refuse_unknown_query(request, EVENTS_PARAMS)
    caller = caller_of(request)
    run = selectors.run_get(run_id, pinned_resource_id=caller.pinned_resource_id)
    events = selectors.run_events(run, after=max(0, after), limit=limit)
    return {"events": events, "next_after": events[-1].seq if events else max(0, after)}
