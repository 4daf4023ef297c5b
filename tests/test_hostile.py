"""Hostile and bad input: every API route refuses callers without a valid key, pinned keys see
only their resource, and malformed input is a clear 4xx that writes nothing."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from django.test import Client, override_settings

from runs import services
from runs.models import ApiKey, AuditEntry, Checkpoint, Run, RunEvent, Thread, ToolCall
from runsite.api import api as ninja_api
from tests import reliability

pytestmark = pytest.mark.django_db

PUBLIC_API = {("get", "/api/ok")}


def operations() -> list[tuple[str, str]]:
    """Every (method, path) the API serves, from its own OpenAPI document."""
    schema = ninja_api.get_openapi_schema()
    ops = []
    for path, methods in schema["paths"].items():
        for method in methods:
            if method in ("get", "post", "put", "patch", "delete"):
                ops.append((method, path))
    return sorted(ops)


def fill(path: str, *, thread_id: Any, run_id: Any, agent_id: str = "refund") -> str:
    values = {
        "thread_id": thread_id,
        "run_id": run_id,
        "assistant_id": agent_id,
        "agent_id": agent_id,
    }
    return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), uuid.uuid4())), path)


def call(
    client: Client,
    method: str,
    path: str,
    *,
    key: str | None = None,
    body: Any = None,
    **extra: Any,
) -> Any:
    headers = {"HTTP_X_API_KEY": key} if key else {}
    data = json.dumps(body if body is not None else {}) if method != "get" else None
    kwargs = {"content_type": "application/json"} if method != "get" else {}
    return getattr(client, method)(path, data, **kwargs, **headers, **extra)


def snapshot() -> dict[str, int]:
    return {
        m.__name__: m.objects.count()
        for m in (Thread, Run, Checkpoint, ToolCall, RunEvent, AuditEntry)
    }


@pytest.fixture
def globex_run(drain) -> Run:
    thread = services.thread_create(metadata={"resource_id": "globex"})
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "G", "amount": 3}, actor="t"
    )
    drain()
    run.refresh_from_db()
    return run


def test_the_api_is_not_empty() -> None:
    assert len(operations()) > 30


@pytest.mark.parametrize(("method", "path"), operations())
def test_every_api_route_refuses_a_missing_and_a_revoked_key(
    client, globex_run, method, path
) -> None:
    url = fill(path, thread_id=globex_run.thread_id, run_id=globex_run.id)
    before = snapshot()
    if (method, path) in PUBLIC_API:
        assert call(client, method, url).status_code == 200
        return
    assert call(client, method, url).status_code == 401
    key, raw = services.api_key_create(name="old")
    services.api_key_revoke(key=key)
    assert call(client, method, url, key=raw).status_code == 401
    assert call(client, method, url, key="rs_" + "x" * 43).status_code == 401
    assert snapshot() == before


def _scoped_body(method: str, path: str, run: Run) -> Any:
    if any(verb in path for verb in ("approve-", "decline-", "claim-", "release-")):
        return {"run_id": str(run.id)}
    if path.endswith("/resume") or path.endswith("/resume-stream"):
        return {"run_id": str(run.id), "resume_data": {"city": "x"}}
    if path.endswith("/runs") or path.endswith("/runs/wait") or path.endswith("/runs/stream"):
        return {"assistant_id": "echo", "input": {}}
    if path.endswith("/state"):
        return {"values": {"x": 1}}
    return {}


SCOPED = [
    # Streaming handlers read the database from another thread: they need committed data.
    pytest.param(m, p, marks=pytest.mark.django_db(transaction=True))
    if p.endswith(("/stream", "/wait", "/join", "-stream"))
    else (m, p)
    for m, p in operations()
    if "{thread_id}" in p or "{run_id}" in p or p.startswith("/api/agents/{agent_id}/")
]


@pytest.mark.parametrize(("method", "path"), SCOPED)
def test_a_key_pinned_to_another_resource_sees_nothing_of_it(
    client, globex_run, method, path
) -> None:
    _, raw = services.api_key_create(name="acme-key", resource_id="acme")
    url = fill(path, thread_id=globex_run.thread_id, run_id=globex_run.id)
    before = snapshot()
    response = call(client, method, url, key=raw, body=_scoped_body(method, path, globex_run))
    if path.startswith("/api/agents/{agent_id}/") and method == "get":
        # listings answer 200 but must not contain the other resource's runs
        assert response.status_code == 200, response.content
        assert str(globex_run.id) not in response.content.decode()
    else:
        assert response.status_code == 404, (response.status_code, response.content[:200])
    after = snapshot()
    assert after == before
    assert Run.objects.get(id=globex_run.id).status == "suspended"


BAD_BODIES = [
    ("deeply nested JSON", "post", "/api/threads", "[" * 50_000 + "]" * 50_000, 422),
    ("invalid UTF-8", "post", "/api/threads", b'{"metadata": {"a": "\xff\xfe"}}', 422),
    (
        "oversized body",
        "post",
        "/api/threads",
        json.dumps({"metadata": {"a": "x" * 2_000_000}}),
        413,
    ),
    (
        "NUL in a JSON string",
        "post",
        "/api/threads",
        json.dumps({"metadata": {"a": "x\u0000y"}}),
        422,
    ),
    ("NaN in input", "post", "/api/runs", '{"assistant_id":"echo","input":NaN}', 422),
    ("Infinity in input", "post", "/api/runs", '{"assistant_id":"echo","input":1e999}', 422),
    (
        "5000-digit integer",
        "post",
        "/api/runs",
        '{"assistant_id":"echo","input":' + "9" * 5000 + "}",
        422,
    ),
    (
        "unknown enum value",
        "post",
        "/api/runs",
        '{"assistant_id":"echo","multitask_strategy":"yolo"}',
        422,
    ),
    ("unknown agent", "post", "/api/runs", '{"assistant_id":"nope"}', 422),
    (
        "absurd after_seconds",
        "post",
        "/api/runs",
        '{"assistant_id":"echo","after_seconds":1e308}',
        422,
    ),
    ("not JSON at all", "post", "/api/runs", "assistant_id=echo", 422),
    ("a JSON list where an object is expected", "post", "/api/threads/search", "[1,2,3]", 422),
    ("huge page size", "post", "/api/threads/search", '{"limit": 1000000000000}', 422),
    ("negative offset", "post", "/api/threads/search", '{"offset": -5}', 422),
    ("invalid UUID", "post", "/api/threads", '{"thread_id": "not-a-uuid"}', 422),
    ("unknown thread status", "post", "/api/threads/search", '{"status": "idle\' --"}', 422),
]

BAD_QUERIES = [
    ("huge per_page", "/api/agents/refund/suspended-runs?per_page=999999999999&page=0"),
    ("float per_page", "/api/agents/refund/suspended-runs?per_page=1e9&page=0"),
    ("negative page", "/api/agents/refund/suspended-runs?per_page=10&page=-1"),
    ("negative date", "/api/agents/refund/suspended-runs?from_date=-1"),
    ("year 99999", "/api/agents/refund/suspended-runs?from_date=99999-01-01"),
    ("year 1", "/api/agents/refund/suspended-runs?to_date=0001-01-01T00:00:00-23:59"),
    ("dates reversed", "/api/agents/refund/suspended-runs?from_date=2030-01-01&to_date=2020-01-01"),
    ("unknown status", "/api/agents/refund/runs?status=sleeping"),
    ("NUL in a filter", "/api/agents/refund/suspended-runs?resource_id=a%00b"),
    ("invalid UUID filter", "/api/agents/refund/suspended-runs?thread_id=x' OR 1=1 --"),
    (
        "huge event limit",
        "/api/runs/00000000-0000-0000-0000-000000000000/events?limit=99999999999999999999",
    ),
]


@override_settings(RUNS_API_AUTH=False)
@pytest.mark.parametrize(
    ("label", "method", "path", "body", "status"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES]
)
def test_bad_bodies_are_clear_4xx_and_write_nothing(
    client, label, method, path, body, status
) -> None:
    before = snapshot()
    response = getattr(client, method)(path, body, content_type="application/json")
    assert response.status_code == status, response.content[:300]
    detail = response.json()
    assert detail["detail"] and detail["code"]
    assert snapshot() == before


@override_settings(RUNS_API_AUTH=False)
@pytest.mark.parametrize(("label", "url"), BAD_QUERIES, ids=[q[0] for q in BAD_QUERIES])
def test_bad_query_parameters_are_clear_4xx(client, label, url) -> None:
    response = client.get(url)
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response.json()["detail"]


SQL_META = [
    "' OR 1=1 --",
    '"; DROP TABLE runs_run; --',
    "%",
    "_",
    "\\",
    "' UNION SELECT * FROM runs_apikey --",
]


@override_settings(RUNS_API_AUTH=False)
@pytest.mark.parametrize("payload", SQL_META)
def test_sql_metacharacters_in_every_filter_match_nothing_and_break_nothing(
    client, globex_run, payload
) -> None:
    before = snapshot()
    listing = client.get(
        "/api/agents/refund/suspended-runs", {"resource_id": payload, "per_page": 10, "page": 0}
    )
    assert listing.status_code == 200 and listing.json()["total"] == 0
    runs = client.get("/api/agents/refund/runs", {"resource_id": payload})
    assert runs.status_code == 200 and runs.json()["total"] == 0
    agent = client.get(f"/api/agents/{payload}/suspended-runs")
    assert agent.status_code in (200, 404)
    search = client.post(
        "/api/threads/search",
        json.dumps({"metadata": {payload: payload}, "limit": 10}),
        content_type="application/json",
    )
    assert search.status_code == 200 and search.json() == []
    assistants = client.post(
        "/api/assistants/search", json.dumps({"name": payload}), content_type="application/json"
    )
    assert assistants.status_code == 200
    count = client.post(
        "/api/threads/count",
        json.dumps({"metadata": {"resource_id": payload}}),
        content_type="application/json",
    )
    assert count.status_code == 200 and count.json() == 0
    assert snapshot() == before
    assert Run.objects.filter(id=globex_run.id).exists()


def test_record_the_bad_input_classes() -> None:
    reliability.record(
        "hostile API input: " + ", ".join(label for label, *_ in BAD_BODIES + BAD_QUERIES),
        runs="n/a",
        observed=f"{len(BAD_BODIES) + len(BAD_QUERIES)} classes, each a 4xx with detail and code; nothing written",
    )
    reliability.record(
        "SQL metacharacters in every filter (" + ", ".join(repr(p) for p in SQL_META) + ")",
        runs=1,
        observed="listings and searches match nothing, no 5xx, nothing written",
    )
    reliability.record(
        "API routes without a key, with a revoked or forged key, with a key pinned to another resource",
        runs=1,
        observed=f"all {len(operations())} API operations from the OpenAPI document answer 401 (404 for a foreign resource); nothing written",
    )
    assert ApiKey.objects.count() == 0
