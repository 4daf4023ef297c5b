"""The review API over plain HTTP (httpx against the WSGI app in this process): listings, approve,
decline, resume, their streaming variants, run detail and timeline, every error, and scope."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.utils import timezone

from runs import services
from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls
from runs.engine.worker import start_embedded_worker
from runs.models import AuditEntry, Run, RunStatus, ToolCall, ToolCallStatus
from tests.helpers import wait_for

pytestmark = pytest.mark.django_db

REFUND = {"order_id": "A-1", "amount": 25.0}


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    # As Django's own test client does: a finished request must not close the test's connection
    # (it holds the test transaction).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    transport = httpx.WSGITransport(app=get_wsgi_application())
    try:
        with httpx.Client(transport=transport, base_url="http://testserver/api") as client:
            yield client
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def suspended(drain: Callable[..., int], agent_id: str = "refund", **kw: Any) -> Run:
    thread = services.thread_create(metadata={"resource_id": kw.pop("resource", "acme")})
    run = services.run_create(
        agent_id=agent_id, thread_id=thread.id, input=kw.pop("input", REFUND), actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def waiting_call(run: Run) -> ToolCall:
    return run.tool_calls.get(status__in=["awaiting_approval", "awaiting_input"])


def _twin_script(state: Any) -> ToolCalls | FinalAnswer:
    if not state.results:
        return ToolCalls(
            [
                ProposedCall("issue_refund", {"order_id": "T-1", "amount": 1}),
                ProposedCall("issue_refund", {"order_id": "T-2", "amount": 2}),
            ]
        )
    return FinalAnswer(output={"done": len(state.results)})


@pytest.fixture
def twin(register_agent: Callable[[Any], Any]) -> Agent:
    from runs.agents.refund import issue_refund

    return register_agent(Agent(id="twin", tools=[issue_refund], model=ScriptedModel(_twin_script)))


# --- listings ----------------------------------------------------------------------------------


def test_it_lists_suspended_runs_in_the_mastra_shape(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    tc = waiting_call(run)
    r = http.get("/agents/refund/suspended-runs")
    assert r.status_code == 200
    body = r.json()
    assert body["total"] == 1
    (row,) = body["runs"]
    assert row["run_id"] == str(run.id)
    assert row["status"] == "suspended"
    assert row["agent_id"] == "refund"
    assert row["thread_id"] == str(run.thread_id)
    assert row["resource_id"] == "acme"
    assert row["suspended_at"].startswith(str(run.suspended_at.year))
    assert row["tool_calls"] == [
        {
            "tool_call_id": tc.tool_call_id,
            "tool_name": "issue_refund",
            "args": {"order_id": "A-1", "amount": 25.0},
            "requires_approval": True,
            "suspend_payload": None,
            "resume_schema": None,
            # Nobody claimed it; the refund agent's 30-minute review deadline.
            "claimed_by": "",
            "claimed_until": None,
            "review_deadline_at": row["tool_calls"][0]["review_deadline_at"],
        }
    ]
    deadline = datetime.fromisoformat(row["tool_calls"][0]["review_deadline_at"])
    assert abs(deadline - (tc.suspended_at + timedelta(minutes=30))) < timedelta(milliseconds=1)


def test_it_filters_and_paginates_suspended_runs(http: httpx.Client, drain) -> None:
    runs = [suspended(drain, resource="acme") for _ in range(3)]
    other = suspended(drain, resource="globex")
    assert http.get("/agents/refund/suspended-runs").json()["total"] == 4
    acme = http.get("/agents/refund/suspended-runs", params={"resource_id": "acme"}).json()
    assert acme["total"] == 3
    by_thread = http.get(
        "/agents/refund/suspended-runs", params={"thread_id": str(other.thread_id)}
    ).json()
    assert [r["run_id"] for r in by_thread["runs"]] == [str(other.id)]
    page = http.get("/agents/refund/suspended-runs", params={"per_page": 2, "page": 1}).json()
    assert page["total"] == 4 and len(page["runs"]) == 2
    newest_first = [r["run_id"] for r in http.get("/agents/refund/suspended-runs").json()["runs"]]
    assert newest_first == [str(r.id) for r in [other, *runs[::-1]]]
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    none = http.get("/agents/refund/suspended-runs", params={"from_date": future}).json()
    assert none == {"runs": [], "total": 0}
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    assert http.get("/agents/refund/suspended-runs", params={"from_date": past}).json()["total"]


@pytest.mark.parametrize(
    "params",
    [
        {"per_page": 0, "page": 0},
        {"per_page": 5, "page": -1},
        {"per_page": "x"},
        {"from_date": "yesterday"},
        {"from_date": "2025-01-02T00:00:00Z", "to_date": "2025-01-01T00:00:00Z"},
        {"thread_id": "nope"},
    ],
)
def test_it_answers_422_for_bad_filters(http: httpx.Client, params: dict[str, Any]) -> None:
    r = http.get("/agents/refund/suspended-runs", params=params)
    assert r.status_code == 422
    assert r.json()["detail"]


def test_it_takes_mastras_camelcase_filter_names(http: httpx.Client, drain) -> None:
    runs = [suspended(drain, resource="acme") for _ in range(3)]
    other = suspended(drain, resource="globex")
    by_resource = http.get("/agents/refund/suspended-runs", params={"resourceId": "acme"})
    assert by_resource.status_code == 200
    assert by_resource.json()["total"] == 3
    by_thread = http.get(
        "/agents/refund/suspended-runs", params={"threadId": str(other.thread_id)}
    ).json()
    assert [r["run_id"] for r in by_thread["runs"]] == [str(other.id)]
    page = http.get("/agents/refund/suspended-runs", params={"perPage": 2, "page": 1}).json()
    assert page["total"] == 4
    assert [r["run_id"] for r in page["runs"]] == [str(r.id) for r in runs[1::-1]]
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert http.get("/agents/refund/suspended-runs", params={"fromDate": future}).json() == {
        "runs": [],
        "total": 0,
    }
    past = (timezone.now() - timedelta(hours=1)).isoformat()
    assert http.get("/agents/refund/suspended-runs", params={"toDate": past}).json()["total"] == 0
    agent_runs = http.get(
        "/agents/refund/runs", params={"status": "suspended", "resourceId": "globex"}
    ).json()
    assert [r["run_id"] for r in agent_runs["runs"]] == [str(other.id)]
    same = http.get(
        "/agents/refund/suspended-runs", params={"resource_id": "acme", "resourceId": "acme"}
    )
    assert same.json()["total"] == 3
    clash = http.get(
        "/agents/refund/suspended-runs", params={"resource_id": "acme", "resourceId": "globex"}
    )
    assert clash.status_code == 422
    assert clash.json()["errors"][0]["field"] == "resourceId"


@pytest.mark.parametrize(
    "path",
    [
        "/agents/refund/suspended-runs",
        "/agents/refund/runs",
        "/runs/01a22b8e-ef11-71c5-a71f-86cd380e179b",
        "/runs/01a22b8e-ef11-71c5-a71f-86cd380e179b/events",
    ],
)
def test_it_refuses_an_unknown_query_parameter_naming_the_known_ones(
    http: httpx.Client, path: str
) -> None:
    r = http.get(path, params={"foo": "1"})
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "validation_error"
    assert body["errors"][0]["field"] == "foo"
    assert body["detail"].startswith("unknown query parameter 'foo'; known: ")
    if "agents" in path:
        for name in ("thread_id", "threadId", "per_page", "perPage", "page", "from_date"):
            assert name in body["detail"]
    if path.endswith("/events"):
        assert body["detail"].endswith("known: after, limit")


def test_a_date_only_to_date_covers_the_whole_utc_day(http: httpx.Client, drain) -> None:
    late, next_day, day_before = (suspended(drain) for _ in range(3))
    for run, at in (
        (late, "2026-11-30T23:59:59.500000+00:00"),
        (next_day, "2026-12-01T00:00:00+00:00"),
        (day_before, "2026-11-29T23:59:59+00:00"),
    ):
        Run.objects.filter(id=run.id).update(created_at=datetime.fromisoformat(at))

    def listed(**params: str) -> set[str]:
        r = http.get("/agents/refund/suspended-runs", params=params)
        assert r.status_code == 200, r.text
        return {row["run_id"] for row in r.json()["runs"]}

    assert listed(to_date="2026-11-30") == {str(late.id), str(day_before.id)}
    assert listed(toDate="2026-11-30") == {str(late.id), str(day_before.id)}
    assert listed(from_date="2026-11-30") == {str(late.id), str(next_day.id)}
    assert listed(from_date="2026-11-30", to_date="2026-11-30") == {str(late.id)}
    # A naive date-time is UTC; an offset is honoured.
    assert listed(to_date="2026-11-30T23:59:59") == {str(day_before.id)}
    assert listed(from_date="2026-12-01T00:30:00+01:00") == {str(late.id), str(next_day.id)}
    bad = http.get("/agents/refund/suspended-runs", params={"toDate": "30/11/2026"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "toDate"


def test_it_scopes_listings_to_the_agent(http: httpx.Client, drain) -> None:
    refund = suspended(drain)
    weather = suspended(drain, "weather", input={})
    supervisor = suspended(drain, "support", input={**REFUND, "message": "hi"})
    assert [r["run_id"] for r in http.get("/agents/weather/suspended-runs").json()["runs"]] == [
        str(weather.id)
    ]
    assert str(refund.id) not in str(http.get("/agents/weather/suspended-runs").json())
    (outer,) = http.get("/agents/support/suspended-runs").json()["runs"]
    assert outer["run_id"] == str(supervisor.id)
    assert outer["tool_calls"][0]["tool_name"] == "ask_billing"
    (inner,) = http.get("/agents/billing/suspended-runs").json()["runs"]
    assert inner["tool_calls"][0]["tool_name"] == "issue_refund"
    assert http.get("/agents/ghost/suspended-runs").status_code == 404


def test_it_lists_an_agents_runs_by_status(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    thread = services.thread_create()
    pending = services.run_create(agent_id="refund", thread_id=thread.id, input=REFUND, actor="t")
    both = http.get("/agents/refund/runs", params={"status": "suspended,pending"}).json()
    assert {r["run_id"] for r in both["runs"]} == {str(run.id), str(pending.id)}
    only = http.get("/agents/refund/runs", params={"status": "pending"}).json()
    assert [r["run_id"] for r in only["runs"]] == [str(pending.id)]
    assert only["runs"][0]["tool_calls"] == []
    assert http.get("/agents/refund/runs", params={"status": "sleeping"}).status_code == 422


# --- decisions ---------------------------------------------------------------------------------


def test_it_approves_with_edited_args_and_answers_202_with_the_run(
    http: httpx.Client, drain
) -> None:
    run = suspended(drain)
    tc = waiting_call(run)
    r = http.post(
        "/agents/refund/approve-tool-call",
        json={"run_id": str(run.id), "args": {"order_id": "A-1", "amount": 20}},
    )
    assert r.status_code == 202
    body = r.json()
    assert body["run_id"] == str(run.id) and body["status"] == "pending"
    (call,) = [c for c in body["tool_calls"] if c["tool_call_id"] == tc.tool_call_id]
    assert call["status"] == "approved"
    assert call["args"] == {"order_id": "A-1", "amount": 20}
    assert call["original_args"] == {"order_id": "A-1", "amount": 25.0}
    assert call["decided_by"] == "api:anonymous"
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"refunded": True, "order_id": "A-1", "amount": 20}
    audit = AuditEntry.objects.get(action="approve", run_id=run.id)
    assert audit.actor == "api:anonymous"
    assert audit.before["args"] == {"order_id": "A-1", "amount": 25.0}


def test_it_refuses_edited_args_that_break_the_tool_schema(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    r = http.post(
        "/agents/refund/approve-tool-call",
        json={"run_id": str(run.id), "args": {"order_id": "A-1", "amount": -5}},
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "args.amount"
    assert waiting_call(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_declines_with_a_reason(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    r = http.post(
        "/agents/refund/decline-tool-call", json={"run_id": str(run.id), "reason": "fraud"}
    )
    assert r.status_code == 202
    drain()
    run.refresh_from_db()
    assert run.output == {"refunded": False, "reason": "fraud"}
    tc = run.tool_calls.get(tool_name="issue_refund")
    assert tc.status == ToolCallStatus.DECLINED and tc.decision_reason == "fraud"


def test_it_resumes_a_tool_that_asked_for_input(http: httpx.Client, drain) -> None:
    run = suspended(drain, "weather", input={})
    tc = waiting_call(run)
    listed = http.get("/agents/weather/suspended-runs").json()["runs"][0]["tool_calls"][0]
    assert listed["requires_approval"] is False
    assert listed["suspend_payload"] == {"message": "Which city?"}
    assert listed["resume_schema"]["required"] == ["city"]
    bad = http.post(
        "/agents/weather/resume", json={"run_id": str(run.id), "resume_data": {"town": "x"}}
    )
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "resume_data.city"
    assert "city" in bad.json()["detail"]
    r = http.post(
        "/agents/weather/resume",
        json={
            "run_id": str(run.id),
            "tool_call_id": tc.tool_call_id,
            "resume_data": {"city": "Oslo"},
        },
    )
    assert r.status_code == 202
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS and "Oslo" in json.dumps(run.output)


def test_it_resumes_an_approval_with_mastras_approved_form(http: httpx.Client, drain) -> None:
    approve = suspended(drain)
    r = http.post(
        "/agents/refund/resume",
        json={
            "run_id": str(approve.id),
            "resume_data": {"approved": True, "args": {"order_id": "A-1", "amount": 20}},
        },
    )
    assert r.status_code == 202
    (call,) = [c for c in r.json()["tool_calls"] if c["tool_name"] == "issue_refund"]
    assert call["status"] == "approved" and call["args"]["amount"] == 20
    decline = suspended(drain)
    tc = waiting_call(decline)
    r = http.post(
        "/agents/refund/resume",
        json={
            "run_id": str(decline.id),
            "tool_call_id": tc.tool_call_id,
            "resume_data": {"approved": False, "reason": "fraud"},
        },
    )
    assert r.status_code == 202
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.DECLINED and tc.decision_reason == "fraud"
    top_level = suspended(drain)
    r = http.post(
        "/agents/refund/resume",
        json={"run_id": str(top_level.id), "approved": False, "reason": "dup"},
    )
    assert r.status_code == 202
    assert top_level.tool_calls.get(tool_name="issue_refund").decision_reason == "dup"
    drain()
    for run, output in (
        (approve, {"refunded": True, "order_id": "A-1", "amount": 20}),
        (decline, {"refunded": False, "reason": "fraud"}),
    ):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCESS and run.output == output


def test_it_refuses_a_resume_of_an_approval_without_approved(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    for body in ({"resume_data": {"city": "Oslo"}}, {"resume_data": {"approved": "yes"}}):
        r = http.post("/agents/refund/resume", json={"run_id": str(run.id), **body})
        assert r.status_code == 422
        assert r.json()["errors"][0]["field"] == "resume_data.approved"
    both = http.post(
        "/agents/refund/resume",
        json={"run_id": str(run.id), "approved": True, "resume_data": {"approved": True}},
    )
    assert both.status_code == 422
    assert waiting_call(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_needs_a_tool_call_id_when_several_calls_wait(http: httpx.Client, drain, twin) -> None:
    run = suspended(drain, "twin", input=None)
    ids = sorted(run.tool_calls.values_list("tool_call_id", flat=True))
    r = http.post("/agents/twin/approve-tool-call", json={"run_id": str(run.id)})
    assert r.status_code == 409
    assert sorted(r.json()["pending_tool_call_ids"]) == ids
    assert all(i in r.json()["detail"] for i in ids)
    first = http.post(
        "/agents/twin/approve-tool-call", json={"run_id": str(run.id), "tool_call_id": ids[0]}
    )
    assert first.status_code == 202 and first.json()["status"] == "suspended"
    again = http.post(
        "/agents/twin/decline-tool-call", json={"run_id": str(run.id), "tool_call_id": ids[0]}
    )
    assert again.status_code == 409
    assert again.json()["code"] == "already_decided"
    assert again.json()["decided_by"] == "api:anonymous"
    assert "api:anonymous" in again.json()["detail"]
    missing = http.post(
        "/agents/twin/approve-tool-call", json={"run_id": str(run.id), "tool_call_id": "nope"}
    )
    assert missing.status_code == 404


def test_it_hides_runs_of_other_agents_and_refuses_runs_not_suspended(
    http: httpx.Client, drain
) -> None:
    run = suspended(drain)
    r = http.post("/agents/weather/approve-tool-call", json={"run_id": str(run.id)})
    assert r.status_code == 404
    assert waiting_call(run).status == ToolCallStatus.AWAITING_APPROVAL
    http.post("/agents/refund/approve-tool-call", json={"run_id": str(run.id)})
    r = http.post("/agents/refund/decline-tool-call", json={"run_id": str(run.id)})
    assert r.status_code == 409
    assert r.json()["status"] == "pending"
    assert "pending" in r.json()["detail"]
    import uuid

    assert http.post("/agents/refund/resume", json={"run_id": str(uuid.uuid4())}).status_code == 404
    assert http.post("/agents/refund/resume", json={"run_id": "bad"}).status_code == 422


# --- run detail and timeline --------------------------------------------------------------------


def test_it_shows_a_run_with_tool_calls_and_values(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    r = http.get(f"/runs/{run.id}")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "suspended" and body["agent_id"] == "refund"
    assert [c["tool_name"] for c in body["tool_calls"]] == ["lookup_order", "issue_refund"]
    assert body["tool_calls"][0]["status"] == "succeeded"
    assert body["values"]["messages"][0] == {"role": "user", "content": REFUND}
    assert http.get("/runs/01a22b8e-ef11-71c5-a71f-86cd380e179b").status_code == 404


def test_it_pages_through_a_runs_timeline(http: httpx.Client, drain) -> None:
    run = suspended(drain)
    everything = http.get(f"/runs/{run.id}/events", params={"limit": 1000}).json()
    kinds = [e["kind"] for e in everything["events"]]
    assert kinds[0] == "created" and kinds[-1] == "suspended"
    assert everything["next_after"] == everything["events"][-1]["seq"]
    first = http.get(f"/runs/{run.id}/events", params={"limit": 2}).json()
    assert [e["seq"] for e in first["events"]] == [1, 2]
    rest = http.get(f"/runs/{run.id}/events", params={"after": first["next_after"]}).json()
    assert [e["kind"] for e in first["events"] + rest["events"]] == kinds
    end = http.get(f"/runs/{run.id}/events", params={"after": 10_000}).json()
    assert end == {"events": [], "next_after": 10_000}


# --- pinned keys -------------------------------------------------------------------------------


def test_a_pinned_key_sees_and_decides_only_its_resource(
    http: httpx.Client, drain, settings: Any
) -> None:
    settings.RUNS_API_AUTH = True
    _key, raw = services.api_key_create(name="acme-bot", resource_id="acme")
    mine = suspended(drain, resource="acme")
    theirs = suspended(drain, resource="globex")
    headers = {"x-api-key": raw}
    listed = http.get("/agents/refund/suspended-runs", headers=headers).json()
    assert [r["run_id"] for r in listed["runs"]] == [str(mine.id)]
    spoofed = http.get(
        "/agents/refund/suspended-runs", params={"resource_id": "globex"}, headers=headers
    ).json()
    assert spoofed == {"runs": [], "total": 0}  # the pinned resource wins
    for path in ("/agents/refund/approve-tool-call", "/agents/refund/decline-tool-call"):
        assert http.post(path, json={"run_id": str(theirs.id)}, headers=headers).status_code == 404
    assert http.get(f"/runs/{theirs.id}", headers=headers).status_code == 404
    assert http.get(f"/runs/{theirs.id}/events", headers=headers).status_code == 404
    assert waiting_call(theirs).status == ToolCallStatus.AWAITING_APPROVAL
    ok = http.post(
        "/agents/refund/approve-tool-call", json={"run_id": str(mine.id)}, headers=headers
    )
    assert ok.status_code == 202
    assert waiting_call_or_none(mine) is None
    assert mine.tool_calls.get(tool_name="issue_refund").decided_by == "api:acme-bot"
    assert http.get("/agents/refund/suspended-runs").status_code == 401


def waiting_call_or_none(run: Run) -> ToolCall | None:
    return run.tool_calls.filter(status__in=["awaiting_approval", "awaiting_input"]).first()


# --- the streaming variants (a worker thread executes the continued run) -----------------------


@pytest.fixture
def worker(transactional_db: Any) -> Iterator[Any]:
    w = start_embedded_worker(concurrency=2, poll_seconds=0.05)
    yield w
    w.stop()
    w.wait_stopped(10)


def sse(response: httpx.Response) -> list[tuple[str, Any]]:
    assert response.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in response.text.split("\r\n\r\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\r\n") if ": " in line)
        if "event" in fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


@pytest.mark.django_db(transaction=True)
def test_it_streams_the_continued_run_after_a_decision(http: httpx.Client, worker: Any) -> None:
    def parked(agent_id: str, input: Any) -> Run:
        run = services.run_create(agent_id=agent_id, thread_id=None, input=input, actor="t")
        wait_for(lambda: Run.objects.get(id=run.id).status == RunStatus.SUSPENDED, timeout=15)
        return run

    approve = parked("refund", REFUND)
    events = sse(
        http.post("/agents/refund/approve-tool-call/stream", json={"run_id": str(approve.id)})
    )
    assert events[0] == ("metadata", {"run_id": str(approve.id), "attempt": 2})
    assert events[-1] == ("end", {"run_id": str(approve.id), "status": "success"})
    assert [d for e, d in events if e == "values"][-1]["output"]["refunded"] is True

    decline = parked("refund", REFUND)
    events = sse(
        http.post(
            "/agents/refund/decline-tool-call/stream",
            json={"run_id": str(decline.id), "reason": "no"},
        )
    )
    assert [d for e, d in events if e == "values"][-1]["output"] == {
        "refunded": False,
        "reason": "no",
    }

    answer = parked("weather", {})
    events = sse(
        http.post(
            "/agents/weather/resume-stream",
            json={"run_id": str(answer.id), "resume_data": {"city": "Rome"}},
        )
    )
    assert events[-1][1]["status"] == "success"
    approved = parked("refund", REFUND)
    events = sse(
        http.post(
            "/agents/refund/resume-stream",
            json={"run_id": str(approved.id), "resume_data": {"approved": True}},
        )
    )
    assert events[-1] == ("end", {"run_id": str(approved.id), "status": "success"})
    assert [d for e, d in events if e == "values"][-1]["output"]["refunded"] is True

    declined = parked("refund", REFUND)
    events = sse(
        http.post(
            "/agents/refund/resume-stream",
            json={"run_id": str(declined.id), "resume_data": {"approved": False, "reason": "no"}},
        )
    )
    assert [d for e, d in events if e == "values"][-1]["output"] == {
        "refunded": False,
        "reason": "no",
    }

    conflict = http.post("/agents/weather/resume-stream", json={"run_id": str(answer.id)})
    assert conflict.status_code == 409  # errors come back as JSON, never inside a stream
    assert conflict.headers["content-type"].startswith("application/json")
