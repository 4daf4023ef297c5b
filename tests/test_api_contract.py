"""The API fails closed: a LangGraph request or thread field Runsite cannot honour answers 422
`unsupported` naming the field and changes nothing; null, empty and SDK-default values pass."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from runs.api.dates import date_bound
from runs.exceptions import ValidationFailed
from runs.models import Checkpoint, Run, RunStatus, Thread, ToolCallStatus

pytestmark = pytest.mark.django_db

SOME_CHECKPOINT = "1ef4a9b8-e6fb-67b1-8001-abd5184439d1"


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.fixture
def api() -> Client:
    return Client()


def post(api: Client, path: str, body: Any = None) -> Any:
    return api.post(f"/api{path}", json.dumps(body), content_type="application/json")


def new_thread(api: Client) -> str:
    r = post(api, "/threads", {})
    assert r.status_code == 200
    return r.json()["thread_id"]


def assert_unsupported(response: Any, field: str) -> None:
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "unsupported"
    assert body["field"] == field
    assert body["errors"] == [{"field": field, "message": "not supported"}]
    assert field in body["detail"]


# --- runs -------------------------------------------------------------------------------------

REFUSED_RUN_FIELDS = [
    ({"interrupt_before": "*"}, "interrupt_before"),
    ({"interrupt_before": ["tools"]}, "interrupt_before"),
    ({"interrupt_after": ["agent"]}, "interrupt_after"),
    ({"checkpoint": {"checkpoint_id": SOME_CHECKPOINT}}, "checkpoint"),
    ({"checkpoint": {"checkpoint_ns": "child"}}, "checkpoint"),
    ({"checkpoint_id": SOME_CHECKPOINT}, "checkpoint_id"),
    ({"command": {"resume": 1, "update": {"x": 1}}}, "command.update"),
    ({"command": {"goto": "agent"}}, "command.goto"),
    ({"command": {"resume": 1, "graph": "__parent__"}}, "command.graph"),
    ({"config": {"recursion_limit": 5}}, "config.recursion_limit"),
    (
        {"config": {"configurable": {"checkpoint_id": SOME_CHECKPOINT}}},
        "config.configurable.checkpoint_id",
    ),
]


@pytest.mark.parametrize("endpoint", ["/runs", "/runs/stream", "/runs/wait"])
@pytest.mark.parametrize(("extra", "field"), REFUSED_RUN_FIELDS)
def test_it_refuses_run_fields_it_cannot_honour_on_a_thread(
    api: Client, endpoint: str, extra: dict[str, Any], field: str
) -> None:
    tid = new_thread(api)
    r = post(api, f"/threads/{tid}{endpoint}", {"assistant_id": "echo", "input": "a", **extra})
    assert_unsupported(r, field)
    assert not Run.objects.exists()


@pytest.mark.parametrize("endpoint", ["/runs", "/runs/stream", "/runs/wait"])
def test_it_refuses_them_on_stateless_runs_without_creating_a_thread(
    api: Client, endpoint: str
) -> None:
    r = post(api, endpoint, {"assistant_id": "echo", "interrupt_before": "*"})
    assert_unsupported(r, "interrupt_before")
    assert not Run.objects.exists() and not Thread.objects.exists()


def test_a_batch_with_one_refused_run_creates_none(api: Client) -> None:
    good = {"assistant_id": "echo", "input": 1}
    r = post(api, "/runs/batch", [good, {**good, "interrupt_after": "*"}])
    assert_unsupported(r, "interrupt_after")
    assert not Run.objects.exists()


def test_a_refused_command_leaves_the_suspended_run_waiting(api: Client, drain) -> None:
    tid = new_thread(api)
    post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "A-1", "amount": 25.0}},
    )
    drain()
    run = Run.objects.get(thread_id=tid)
    assert run.status == RunStatus.SUSPENDED
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "command": {"resume": {"approved": True}, "goto": "tools"}},
    )
    assert_unsupported(r, "command.goto")
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert run.tool_calls.get(tool_name="issue_refund").status == ToolCallStatus.AWAITING_APPROVAL


def test_it_accepts_null_empty_and_sdk_default_values(api: Client) -> None:
    tid = new_thread(api)
    body = {
        "assistant_id": "echo",
        "input": "a",
        # What langgraph_sdk sends by default, or null/empty forms of refused fields.
        "stream_mode": "values",
        "stream_subgraphs": False,
        "stream_resumable": False,
        "webhook": None,
        "interrupt_before": [],
        "interrupt_after": None,
        "checkpoint": {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": None},
        "checkpoint_id": "",
        "command": {"update": None, "goto": None},
        "config": {"configurable": {"user": "u1"}, "tags": ["t"], "recursion_limit": None},
        # Client hints, accepted and ignored.
        "feedback_keys": ["score"],
        "langsmith_tracer": {"project_name": "p"},
        "strict_resume": True,
        "durability": "exit",
        "checkpoint_during": True,
    }
    r = post(api, f"/threads/{tid}/runs", body)
    assert r.status_code == 200, r.content
    run = Run.objects.get(id=r.json()["run_id"])
    assert run.kwargs["config"]["configurable"] == {"user": "u1"}
    assert "command" not in run.kwargs  # an all-null command is no command


def test_it_merges_config_metadata_into_the_run_metadata(api: Client) -> None:
    tid = new_thread(api)
    r = post(
        api,
        f"/threads/{tid}/runs",
        {
            "assistant_id": "echo",
            "metadata": {"a": 1, "b": 1},
            "config": {"metadata": {"b": 2, "c": 2}},
        },
    )
    assert r.status_code == 200
    assert Run.objects.get(id=r.json()["run_id"]).metadata == {"b": 1, "c": 2, "a": 1}


# --- threads ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"ttl": {"ttl": 60, "strategy": "keep_latest"}}, "ttl.strategy"),
        ({"supersteps": [{"updates": [{"values": {"x": 1}, "as_node": "agent"}]}]}, "supersteps"),
    ],
)
def test_it_refuses_thread_create_fields(api: Client, body: dict[str, Any], field: str) -> None:
    assert_unsupported(post(api, "/threads", body), field)
    assert not Thread.objects.exists()
    assert post(api, "/threads", {"ttl": None, "supersteps": []}).status_code == 200


def test_it_refuses_a_thread_ttl_keep_latest_on_patch_and_keeps_the_metadata(
    api: Client,
) -> None:
    tid = new_thread(api)
    r = api.patch(
        f"/api/threads/{tid}",
        json.dumps({"metadata": {"x": 1}, "ttl": {"ttl": 60, "strategy": "keep_latest"}}),
        content_type="application/json",
    )
    assert_unsupported(r, "ttl.strategy")
    assert Thread.objects.get(id=tid).metadata == {}
    assert Thread.objects.get(id=tid).ttl_minutes is None


def test_it_refuses_extract_on_thread_search(api: Client) -> None:
    r = post(api, "/threads/search", {"extract": {"last": "values.messages[-1]"}})
    assert_unsupported(r, "extract")
    ok = post(api, "/threads/search", {"select": ["thread_id"], "extract": {}})
    assert ok.status_code == 200  # select is a hint: every field comes back


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"as_node": "agent"}, "as_node"),
        ({"checkpoint": {"checkpoint_id": SOME_CHECKPOINT}}, "checkpoint"),
        ({"checkpoint_id": SOME_CHECKPOINT}, "checkpoint_id"),
    ],
)
def test_it_refuses_state_update_fields_it_would_ignore(
    api: Client, extra: dict[str, Any], field: str
) -> None:
    tid = new_thread(api)
    r = post(api, f"/threads/{tid}/state", {"values": {"x": 1}, **extra})
    assert_unsupported(r, field)
    assert not Checkpoint.objects.filter(thread_id=tid).exists()


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"metadata": {"source": "loop"}}, "metadata"),
        ({"checkpoint": {"checkpoint_ns": "child"}}, "checkpoint"),
    ],
)
def test_it_refuses_history_filters_it_cannot_apply(
    api: Client, extra: dict[str, Any], field: str
) -> None:
    tid = new_thread(api)
    assert_unsupported(post(api, f"/threads/{tid}/history", {"limit": 5, **extra}), field)
    ok = post(api, f"/threads/{tid}/history", {"limit": 5, "checkpoint": {"checkpoint_ns": ""}})
    assert ok.status_code == 200


# --- date bounds (the review API's from_date / to_date) ---------------------------------------


def test_a_date_only_bound_covers_the_whole_utc_day() -> None:
    assert date_bound("2026-11-30", field="from_date", end=False) == datetime(
        2026, 11, 30, tzinfo=UTC
    )
    last = date_bound("2026-11-30", field="to_date", end=True)
    assert last is not None
    assert datetime(2026, 11, 30, 23, 59, 59, 999_999, tzinfo=UTC) == last
    assert date_bound("2026-11-30T10:00:00", field="to_date", end=True) == datetime(
        2026, 11, 30, 10, tzinfo=UTC
    )  # naive is UTC
    offset = date_bound("2026-11-30T10:00:00+02:00", field="to_date", end=True)
    assert offset == datetime(2026, 11, 30, 8, tzinfo=UTC)
    assert date_bound("2026-11-30T10:00:00.123Z", field="x", end=False) == datetime(
        2026, 11, 30, 10, 0, 0, 123_000, tzinfo=UTC
    )
    assert date_bound(" ", field="x", end=False) is None
    with pytest.raises(ValidationFailed) as bad:
        date_bound("30/11/2026", field="toDate", end=True)
    assert bad.value.errors[0]["field"] == "toDate"
    with pytest.raises(ValidationFailed):
        date_bound("9999-12-31", field="to_date", end=True)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/threads/search", {"offset": 9223372036854775807}),
        ("post", "/assistants/search", {"offset": 9223372036854775000}),
    ],
)
def test_an_offset_past_any_list_is_refused_not_a_database_error(
    api: Client, method: str, path: str, body: dict[str, Any]
) -> None:
    r = getattr(api, method)(f"/api{path}", json.dumps(body), content_type="application/json")
    assert r.status_code == 422
    assert r.json()["detail"]


def test_a_huge_offset_in_a_query_is_clamped(api: Client) -> None:
    tid = api.post("/api/threads", "{}", content_type="application/json").json()["thread_id"]
    r = api.get(f"/api/threads/{tid}/runs?offset=9223372036854775807")
    assert r.status_code == 200 and r.json() == []
