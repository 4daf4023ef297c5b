"""The LangGraph-compatible surface through Django's test client: shapes, headers, quirks, errors.

Runs are executed in-process with `drain`; the streaming endpoints follow runs from other
threads, so those tests commit for real (transaction=True). The end-to-end suite with the real
server and langgraph_sdk lives in tests/e2e/test_sdk.py.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from runs import selectors, services
from runs.models import Run, RunStatus, Thread

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.fixture
def api() -> Client:
    return Client()


def post(api: Client, path: str, body: Any = None, **extra: Any) -> Any:
    data = "" if body is None else json.dumps(body)
    return api.post(f"/api{path}", data, content_type="application/json", **extra)


def new_thread(api: Client, **metadata: Any) -> str:
    r = post(api, "/threads", {"metadata": metadata})
    assert r.status_code == 200
    return r.json()["thread_id"]


def read(response: Any) -> bytes:
    """The whole body of an (async) streaming response."""

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(collect)()


def sse_events(response: Any) -> list[tuple[str, Any, str | None]]:
    body = read(response).decode()
    assert "\r\n" in body  # CRLF frames, as LangGraph writes them
    events = []
    for block in body.split("\r\n\r\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\r\n") if line and ": " in line)
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"]), fields.get("id")))
    return events


def body_of(response: Any) -> Any:
    return json.loads(read(response))


# --- threads -----------------------------------------------------------------------------------


def test_it_creates_a_thread_with_the_langgraph_shape(api: Client) -> None:
    r = post(api, "/threads", {"metadata": {"user": "u1"}, "unknown_key": 1})
    assert r.status_code == 200
    body = r.json()
    assert set(body) >= {"thread_id", "created_at", "updated_at", "metadata", "status", "values"}
    assert body["status"] == "idle" and body["values"] is None and body["interrupts"] == {}
    assert Thread.objects.get(id=body["thread_id"]).metadata == {"user": "u1"}


def test_it_refuses_a_duplicate_thread_unless_do_nothing(api: Client) -> None:
    tid = str(uuid.uuid4())
    assert post(api, "/threads", {"thread_id": tid}).status_code == 200
    r = post(api, "/threads", {"thread_id": tid})
    assert r.status_code == 409
    assert r.json() == {"detail": f"Thread with ID {tid} already exists", "code": "thread_exists"}
    assert post(api, "/threads", {"thread_id": tid, "if_exists": "do_nothing"}).status_code == 200


def test_it_merges_metadata_on_patch_and_answers_204_for_return_minimal(api: Client) -> None:
    tid = new_thread(api, a=1)
    r = api.patch(
        f"/api/threads/{tid}", json.dumps({"metadata": {"b": 2}}), content_type="application/json"
    )
    assert r.status_code == 200
    assert r.json()["metadata"] == {"a": 1, "b": 2}
    r = api.patch(
        f"/api/threads/{tid}",
        json.dumps({"metadata": {"c": 3}}),
        content_type="application/json",
        HTTP_PREFER="return=minimal",
    )
    assert r.status_code == 204
    assert Thread.objects.get(id=tid).metadata == {"a": 1, "b": 2, "c": 3}


def test_it_deletes_a_thread(api: Client) -> None:
    tid = new_thread(api)
    assert api.delete(f"/api/threads/{tid}").status_code == 204
    assert not Thread.objects.filter(id=tid).exists()
    assert api.get(f"/api/threads/{tid}").status_code == 404


def test_it_searches_threads_with_pagination_headers(api: Client) -> None:
    ids = [new_thread(api, team="x", i=i) for i in range(3)]
    new_thread(api, team="y")
    r = post(api, "/threads/search", {"metadata": {"team": "x"}, "limit": 2, "offset": 0})
    assert r.status_code == 200
    assert [t["thread_id"] for t in r.json()] == ids[::-1][:2]  # newest first
    assert r["X-Pagination-Total"] == "3"
    assert r["X-Pagination-Next"] == "2"
    r = post(api, "/threads/search", {"metadata": {"team": "x"}, "limit": 2, "offset": 2})
    assert len(r.json()) == 1 and "X-Pagination-Next" not in r
    r = post(api, "/threads/search", {"ids": ids[:2], "sort_by": "created_at", "sort_order": "asc"})
    assert [t["thread_id"] for t in r.json()] == ids[:2]
    assert post(api, "/threads/search", {"status": "nope"}).status_code == 422
    assert post(api, "/threads/count", {"metadata": {"team": "x"}}).json() == 3
    assert post(api, "/threads/count", {}).json() == 4


def test_it_lists_the_interrupts_of_a_thread_waiting_on_a_human(api: Client, drain) -> None:
    tid = new_thread(api, case=1)
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "A", "amount": 5}},
    )
    run_id = r.json()["run_id"]
    drain()
    thread = api.get(f"/api/threads/{tid}").json()
    assert thread["status"] == "interrupted"
    (interrupt,) = thread["interrupts"][run_id]
    assert interrupt["value"]["type"] == "approval"
    assert interrupt["value"]["tool_name"] == "issue_refund"
    found = post(api, "/threads/search", {"status": "interrupted"}).json()
    assert found[0]["interrupts"] == thread["interrupts"]
    state = api.get(f"/api/threads/{tid}/state").json()
    assert state["next"] == ["tools"]
    assert state["interrupts"] == [interrupt]
    assert state["tasks"][0]["id"] == run_id


def test_it_reads_state_and_history_and_writes_state(api: Client, drain) -> None:
    tid = new_thread(api)
    empty = api.get(f"/api/threads/{tid}/state").json()
    assert empty["values"] == {} and empty["checkpoint"] is None
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": "a"})
    drain()
    history = post(api, f"/threads/{tid}/history", {"limit": 10}).json()
    assert [h["metadata"]["step"] for h in history] == [1, 0]  # newest first
    assert history[0]["parent_checkpoint"]["checkpoint_id"] == history[1]["checkpoint_id"]
    assert api.get(f"/api/threads/{tid}/history?limit=1").json() == history[:1]
    before = post(
        api, f"/threads/{tid}/history", {"before": {"checkpoint_id": history[0]["checkpoint_id"]}}
    ).json()
    assert [h["checkpoint_id"] for h in before] == [history[1]["checkpoint_id"]]
    bad = post(api, f"/threads/{tid}/history", {"before": "not-a-uuid"})
    assert bad.status_code == 422

    r = post(api, f"/threads/{tid}/state", {"values": {"note": 1}, "as_node": None})
    assert r.status_code == 200
    assert r.json()["checkpoint"]["checkpoint_id"] == r.json()["checkpoint_id"]
    state = api.get(f"/api/threads/{tid}/state").json()
    assert state["values"]["note"] == 1 and state["metadata"]["source"] == "update"
    at = api.get(f"/api/threads/{tid}/state/{history[1]['checkpoint_id']}").json()
    assert at["values"] == history[1]["values"]


def test_it_refuses_to_write_state_while_a_run_is_in_flight(api: Client) -> None:
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": "a"})
    r = post(api, f"/threads/{tid}/state", {"values": {"x": 1}})
    assert r.status_code == 409
    assert r.json()["detail"] == f"Thread {tid} has in-flight runs"


# --- runs --------------------------------------------------------------------------------------


def test_it_creates_a_run_with_the_langgraph_shape_and_content_location(api: Client) -> None:
    tid = new_thread(api)
    r = post(
        api,
        f"/threads/{tid}/runs",
        {
            "assistant_id": "echo",
            "input": {"q": 1},
            "metadata": {"m": 1},
            "stream_mode": "values",
            "stream_subgraphs": False,
            "raise_error": True,  # unknown keys (SDK 0.4.3 sends this one) are ignored
            "langsmith_tracer": {"project_name": "p"},
            "strict_resume": True,
        },
    )
    assert r.status_code == 200
    run = r.json()
    assert r["Content-Location"] == f"/threads/{tid}/runs/{run['run_id']}"
    assert run["status"] == "pending"
    assert run["multitask_strategy"] == "enqueue"
    assert run["assistant_id"] == str(
        uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "echo")
    )
    assert run["metadata"] == {"m": 1, "graph_id": "echo", "assistant_id": run["assistant_id"]}
    assert run["kwargs"]["stream_mode"] == ["values"]
    stored = Run.objects.get(id=run["run_id"])
    assert stored.agent_id == "echo" and stored.input == {"q": 1}


def test_it_accepts_the_assistant_uuid_and_rejects_unknown_assistants(api: Client) -> None:
    tid = new_thread(api)
    aid = str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "echo"))
    assert post(api, f"/threads/{tid}/runs", {"assistant_id": aid}).status_code == 200
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "ghost"})
    assert r.status_code == 422
    assert "registered graphs" in r.json()["detail"]


def test_it_rejects_a_second_run_with_the_reference_message(api: Client) -> None:
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"})
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "multitask_strategy": "reject"})
    assert r.status_code == 409
    assert r.json()["detail"] == (
        "Thread is already running a task. Wait for it to finish or choose a different "
        "multitask strategy."
    )
    assert Run.objects.filter(thread_id=tid).count() == 1


def test_it_answers_404_for_a_missing_thread_unless_if_not_exists_create(api: Client) -> None:
    tid = str(uuid.uuid4())
    assert post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).status_code == 404
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "if_not_exists": "create"})
    assert r.status_code == 200
    assert Thread.objects.get(id=tid).metadata["graph_id"] == "echo"


def test_it_resumes_the_suspended_run_with_command_resume(api: Client, drain) -> None:
    tid = new_thread(api)
    first = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "A", "amount": 5}},
    ).json()
    drain()
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": "ignored", "command": {"resume": {"approved": True}}},
    )
    assert r.status_code == 200
    assert r.json()["run_id"] == first["run_id"]  # the same run continues
    assert r.json()["status"] == "pending"
    drain()
    assert Run.objects.get(id=first["run_id"]).status == RunStatus.SUCCESS
    again = post(api, f"/threads/{tid}/runs", {"assistant_id": "refund", "command": {"resume": 1}})
    assert again.status_code == 409
    assert again.json()["code"] == "nothing_to_resume"


def test_it_lists_gets_and_deletes_runs(api: Client, drain) -> None:
    tid = new_thread(api)
    ids = [
        post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": i}).json()["run_id"]
        for i in range(3)
    ]
    r = api.get(f"/api/threads/{tid}/runs?limit=2&offset=0&select=run_id&select=status")
    assert [x["run_id"] for x in r.json()] == ids[::-1][:2]
    assert api.get(f"/api/threads/{tid}/runs?status=pending").json()[0]["status"] == "pending"
    assert api.get(f"/api/threads/{tid}/runs?status=bogus").status_code == 422
    assert api.delete(f"/api/threads/{tid}/runs/{ids[0]}").status_code == 409  # still pending
    drain()
    assert api.get(f"/api/threads/{tid}/runs/{ids[0]}").json()["status"] == "success"
    assert api.delete(f"/api/threads/{tid}/runs/{ids[0]}").status_code == 204
    assert api.get(f"/api/threads/{tid}/runs/{ids[0]}").status_code == 404
    other = new_thread(api)
    assert api.get(f"/api/threads/{other}/runs/{ids[1]}").status_code == 404  # wrong thread


def test_it_creates_stateless_and_batch_runs(api: Client) -> None:
    r = post(api, "/runs", {"assistant_id": "echo", "input": 1})
    assert r.status_code == 200
    run = r.json()
    assert r["Content-Location"] == f"/threads/{run['thread_id']}/runs/{run['run_id']}"
    batch = post(api, "/runs/batch", [{"assistant_id": "echo", "input": i} for i in range(2)])
    assert batch.status_code == 200 and len(batch.json()) == 2
    assert post(api, "/runs/batch", []).status_code == 422
    resume = post(api, "/runs", {"assistant_id": "echo", "command": {"resume": 1}})
    assert resume.status_code == 422


def test_it_validates_stream_mode(api: Client) -> None:
    tid = new_thread(api)
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "stream_mode": ["nope"]})
    assert r.status_code == 422
    assert "stream_mode" in r.json()["detail"]


# --- bulk cancel (sync) ------------------------------------------------------------------------


def test_it_cancels_many_by_ids_or_by_status_and_answers_204(api: Client) -> None:
    tid = new_thread(api)
    a = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()["run_id"]
    b = post(api, "/runs", {"assistant_id": "echo"}).json()["run_id"]
    r = post(api, "/runs/cancel?action=interrupt", {"thread_id": tid, "run_ids": [a]})
    assert r.status_code == 204
    assert Run.objects.get(id=a).status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=b).status == RunStatus.PENDING
    assert post(api, "/runs/cancel?action=rollback", {"status": "pending"}).status_code == 204
    assert not Run.objects.filter(id=b).exists()
    both = post(api, "/runs/cancel", {"status": "all", "thread_id": tid})
    assert both.status_code == 422
    assert "'thread_id' and 'run_ids' must be omitted" in both.json()["detail"]


# --- edges: bad ids, bodies, sizes ---------------------------------------------------------------


def test_it_answers_422_for_malformed_ids_and_json(api: Client) -> None:
    r = api.get("/api/threads/not-a-uuid")
    assert r.status_code == 422
    assert r.json()["detail"] == "Invalid thread ID: must be a UUID"
    tid = new_thread(api)
    r = api.get(f"/api/threads/{tid}/runs/zzz")
    assert r.json()["detail"] == "Invalid run ID: must be a UUID"
    r = api.post("/api/threads", "{not json", content_type="application/json")
    assert r.status_code == 422
    assert r.json()["code"] == "invalid_json"
    assert r.json()["detail"].startswith("Malformed JSON body")
    r = post(api, "/threads/search", {"limit": "many"})
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "limit"


def test_it_answers_413_for_a_body_over_the_limit(api: Client, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    r = post(api, "/threads", {"metadata": {"blob": "x" * 4096}})
    assert r.status_code == 413
    assert r.json() == {"detail": "Request body is too large", "code": "payload_too_large"}


def test_it_serves_assistants(api: Client) -> None:
    r = post(api, "/assistants/search", {"limit": 2, "offset": 0})
    assert r.status_code == 200 and len(r.json()) == 2
    assert int(r["X-Pagination-Total"]) >= 5 and r["X-Pagination-Next"] == "2"
    assert [
        a["graph_id"] for a in post(api, "/assistants/search", {"graph_id": "echo"}).json()
    ] == ["echo"]
    assert api.get("/api/assistants/echo").json()["metadata"] == {"created_by": "system"}
    assert api.get("/api/assistants/ghost").status_code == 404
    assert api.get("/api/assistants/weather/schemas").json()["graph_id"] == "weather"
    assert api.get("/api/assistants/weather/graph").json()["edges"]


def test_it_publishes_openapi_and_docs(api: Client) -> None:
    schema = api.get("/api/openapi.json").json()
    assert "/api/threads/{thread_id}/runs/stream" in schema["paths"]
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"]["name"] == "x-api-key"
    docs = api.get("/api/docs")
    assert docs.status_code == 200
    # Served from this server's static files (django-ninja's bundled Swagger UI), no CDN.
    page = docs.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in page
    assert "cdn." not in page and "https://" not in page
    from django.contrib.staticfiles import finders

    assert finders.find("ninja/swagger-ui-bundle.js")  # collected with the rest


# --- streaming endpoints on finished runs (they follow runs from other threads) ----------------

stream_db = pytest.mark.django_db(transaction=True)


@stream_db
def test_it_joins_a_finished_run_with_its_final_values(api: Client, drain) -> None:
    tid = new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": "j"}).json()
    drain()
    r = api.get(f"/api/threads/{tid}/runs/{run['run_id']}/join")
    assert r.status_code == 200
    assert r["Location"] == f"/threads/{tid}/runs/{run['run_id']}/join"
    assert r["Content-Location"] == f"/threads/{tid}/runs/{run['run_id']}"
    assert body_of(r)["output"] == {"echo": "j"}


@stream_db
def test_a_join_under_another_threads_path_is_not_found(api: Client, drain) -> None:
    tid, other = new_thread(api), new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": "j"}).json()
    drain()
    r = api.get(f"/api/threads/{other}/runs/{run['run_id']}/join")
    assert r.status_code == 404
    assert r.json()["code"] == "run_not_found"
    assert api.get(f"/api/threads/{tid}/runs/{run['run_id']}/join").status_code == 200


@stream_db
def test_it_joins_a_suspended_run_with_its_interrupts(api: Client, drain) -> None:
    tid = new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "weather", "input": {}}).json()
    drain()
    body = body_of(api.get(f"/api/threads/{tid}/runs/{run['run_id']}/join"))
    (interrupt,) = body["__interrupt__"]
    assert interrupt["value"]["type"] == "input"
    assert interrupt["value"]["payload"] == {"message": "Which city?"}


@stream_db
def test_it_replays_a_run_stream_after_last_event_id(api: Client, drain) -> None:
    tid = new_thread(api)
    run = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "echo", "input": 1, "stream_mode": ["values", "updates"]},
    ).json()
    drain()
    path = f"/api/threads/{tid}/runs/{run['run_id']}/stream"
    everything = sse_events(api.get(path, HTTP_LAST_EVENT_ID="-1"))
    names = [e[0] for e in everything]
    assert names[0] == "metadata" and names[-2:] == ["values", "end"]
    assert sorted(names[1:-1]) == ["updates", "values", "values"]
    assert everything[0][1] == {"run_id": run["run_id"], "attempt": 1}
    assert everything[-1][1] == {"run_id": run["run_id"], "status": "success"}
    ids = [int(e[2]) for e in everything[1:-1]]
    assert ids == sorted(ids)
    after = everything[1][2]
    tail = sse_events(api.get(f"{path}?stream_mode=", HTTP_LAST_EVENT_ID=after))
    assert [e[:2] for e in tail[1:]] == [e[:2] for e in everything[2:]]
    only = sse_events(api.get(f"{path}?stream_mode=updates", HTTP_LAST_EVENT_ID="-1"))
    assert [e[0] for e in only] == ["metadata", "updates", "end"]
    as_json = sse_events(api.get(f'{path}?stream_mode=["values"]', HTTP_LAST_EVENT_ID="-1"))
    assert [e[0] for e in as_json] == ["metadata", "values", "values", "end"]
    live = sse_events(api.get(path))  # no Last-Event-ID on a finished run: nothing to replay
    assert [e[0] for e in live] == ["metadata", "end"]


@stream_db
def test_it_sends_errors_before_streaming_starts(api: Client) -> None:
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"})
    r = post(
        api, f"/threads/{tid}/runs/stream", {"assistant_id": "echo", "multitask_strategy": "reject"}
    )
    assert r.status_code == 409
    assert r["Content-Type"] == "application/json; charset=utf-8"
    missing = str(uuid.uuid4())
    assert post(api, f"/threads/{missing}/runs/wait", {"assistant_id": "echo"}).status_code == 404
    assert post(api, f"/threads/{tid}/runs/stream", {"assistant_id": "ghost"}).status_code == 422
    assert api.get(f"/api/threads/{tid}/runs/{uuid.uuid4()}/join").status_code == 404


@stream_db
def test_it_cancels_with_an_empty_body_and_refuses_finished_runs(api: Client, drain) -> None:
    tid = new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()
    r = api.post(f"/api/threads/{tid}/runs/{run['run_id']}/cancel?wait=0&action=interrupt")
    assert r.status_code == 202
    assert r.content == b""
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.INTERRUPTED
    assert Thread.objects.get(id=tid).status == "idle"  # deliberate difference: not interrupted
    again = api.post(f"/api/threads/{tid}/runs/{run['run_id']}/cancel")
    assert again.status_code == 409
    assert again.json()["code"] == "run_not_active"

    doomed = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()
    r = api.post(f"/api/threads/{tid}/runs/{doomed['run_id']}/cancel?wait=1&action=rollback")
    assert r.status_code == 200
    assert r["Location"] == f"/threads/{tid}/runs/{doomed['run_id']}/join"
    assert r["Content-Type"] == "application/json"
    assert json.loads(r.content) == {}  # the thread's values, reverted: it had none
    assert not Run.objects.filter(id=doomed["run_id"]).exists()
    odd = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()
    r = api.post(f"/api/threads/{tid}/runs/{odd['run_id']}/cancel?action=explode")
    assert r.status_code == 202  # any other action is an interrupt, as in LangGraph
    assert Run.objects.get(id=odd["run_id"]).status == RunStatus.INTERRUPTED


@stream_db
def test_a_cancel_names_its_run_by_the_thread_it_is_on(api: Client) -> None:
    """The run is found by the lock itself, on the thread the path names: under another
    thread it is not found (LangGraph's code), and nothing changes."""
    tid, other = new_thread(api), new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()
    for wait in ("0", "1"):
        r = api.post(f"/api/threads/{other}/runs/{run['run_id']}/cancel?wait={wait}")
        assert r.status_code == 404
        assert r.json()["code"] == "run_not_found"
    missing = uuid.uuid4()
    assert api.post(f"/api/threads/{tid}/runs/{missing}/cancel").json()["code"] == "run_not_found"
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.PENDING
    assert not Run.objects.get(id=run["run_id"]).events.filter(kind="cancelled").exists()


@pytest.mark.postgres
@stream_db
def test_a_cancel_with_wait_is_one_statement_on_postgresql(api: Client) -> None:
    """The thread and the run locked (by the path's ids), checked, ended and the result read in
    one statement that commits alone: no read of the run before it, none after."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    tid = new_thread(api)
    run = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo"}).json()
    with CaptureQueriesContext(connection) as queries:
        r = api.post(f"/api/threads/{tid}/runs/{run['run_id']}/cancel?wait=1")
    assert r.status_code == 200
    assert r["Location"] == f"/threads/{tid}/runs/{run['run_id']}/join"
    statements = [q["sql"] for q in queries]
    assert len(statements) == 1, [sql[:80] for sql in statements]
    assert statements[0].startswith("WITH t AS MATERIALIZED")  # the thread's lock, the run's
    assert Run.objects.get(id=run["run_id"]).status == RunStatus.INTERRUPTED


@stream_db
@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_a_cancel_with_wait_answers_what_a_join_answers_afterwards(
    api: Client, drain: Any, action: str
) -> None:
    """The body a cancel with wait reads in its own statement is the one a join of the run
    (or LangGraph's answer for a run that is gone) gives once the cancel is committed: the
    run's newest checkpoint when interrupted, the thread's state from before it when rolled
    back. On a thread with state of its own and a run with checkpoints, so each differs."""
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"first": 1}})
    drain()
    before = api.get(f"/api/threads/{tid}/state").json()["values"]
    refund = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "C3", "amount": 9}},
    ).json()
    drain()  # suspended, with checkpoints of its own
    assert Run.objects.get(id=refund["run_id"]).checkpoints.exists()

    r = api.post(f"/api/threads/{tid}/runs/{refund['run_id']}/cancel?wait=1&action={action}")
    assert r.status_code == 200
    answered = json.loads(r.content)
    afterwards = selectors.run_result(uuid.UUID(refund["run_id"]), thread_id=uuid.UUID(tid))
    assert answered == afterwards
    if action == "rollback":
        assert answered == before
        assert api.get(f"/api/threads/{tid}/runs/{refund['run_id']}/join").status_code == 404
    else:
        assert answered != before
        join = api.get(f"/api/threads/{tid}/runs/{refund['run_id']}/join")
        assert json.loads(read(join)) == answered


@stream_db
def test_a_cancel_with_wait_of_a_run_without_checkpoints_answers_its_threads_state(
    api: Client, drain: Any
) -> None:
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"kept": 1}})
    drain()
    state = api.get(f"/api/threads/{tid}/state").json()["values"]
    pending = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"x": 2}}).json()
    r = api.post(f"/api/threads/{tid}/runs/{pending['run_id']}/cancel?wait=1")
    assert json.loads(r.content) == state
    assert json.loads(r.content) == selectors.run_result(
        uuid.UUID(pending["run_id"]), thread_id=uuid.UUID(tid)
    )


@stream_db
def test_it_records_the_api_actor_on_cancel(api: Client) -> None:
    thread = services.thread_create()
    run = services.run_create(agent_id="echo", thread_id=thread.id, actor="t")
    api.post(f"/api/threads/{thread.id}/runs/{run.id}/cancel")
    assert run.events.get(kind="cancelled").actor == "api:anonymous"


@stream_db
def test_it_sends_heartbeats_and_keep_alives_while_a_run_waits(monkeypatch: Any) -> None:
    from runs.api import streaming

    monkeypatch.setattr(streaming, "HEARTBEAT_SECONDS", 0.05)
    thread = services.thread_create()
    run = services.run_create(agent_id="echo", thread_id=thread.id, actor="t")  # no worker

    async def first(chunks: Any, n: int) -> list[bytes]:
        out = []
        async for chunk in chunks:
            out.append(chunk)
            if len(out) == n:
                break
        await chunks.aclose()
        return out

    sse = async_to_sync(first)(
        streaming.sse_events(run.id, modes=["values"], after=0, attempt=1), 3
    )
    assert sse[0] == (
        f'event: metadata\r\ndata: {{"run_id":"{run.id}","attempt":1}}\r\n\r\n'.encode()
    )
    assert sse[1:] == [b": heartbeat\r\n\r\n"] * 2
    body = async_to_sync(first)(streaming.result_body(run.id, thread_id=thread.id), 2)
    assert body == [b"\n", b"\n"]  # leading whitespace a JSON parser ignores
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING  # no disconnect cancel asked


@stream_db
@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_a_cancel_with_wait_of_a_supervisor_answers_what_a_join_answers_afterwards(
    api: Client, drain: Any, action: str
) -> None:
    """A run with a sub-agent run in flight is cancelled statement by statement (its children
    with it): its join body is read once that is committed, and is the same answer."""
    tid = new_thread(api)
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"first": 1}})
    drain()
    supervisor = post(
        api,
        f"/threads/{tid}/runs",
        {
            "assistant_id": "support",
            "input": {"message": "charged twice", "order_id": "A-9", "amount": 40.0},
        },
    ).json()
    drain()
    child = Run.objects.get(parent_run_id=supervisor["run_id"])
    assert child.status == RunStatus.SUSPENDED

    r = api.post(f"/api/threads/{tid}/runs/{supervisor['run_id']}/cancel?wait=1&action={action}")
    assert r.status_code == 200
    afterwards = selectors.run_result(uuid.UUID(supervisor["run_id"]), thread_id=uuid.UUID(tid))
    assert json.loads(r.content) == afterwards
    assert not Run.objects.filter(id=child.id, status=RunStatus.SUSPENDED).exists()
