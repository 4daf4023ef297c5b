"""API keys: x-api-key against hashed keys, pinned resources, RUNS_API_AUTH=off, createapikey."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from runs import services
from runs.models import ApiKey, AuditEntry, Run, RunStatus, Thread

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _auth_on(settings: Any) -> None:
    settings.RUNS_API_AUTH = True


@pytest.fixture
def api() -> Client:
    return Client()


@pytest.fixture
def alice_key() -> str:
    """A key pinned to resource "alice"."""
    return services.api_key_create(name="alice-bot", resource_id="alice")[1]


@pytest.fixture
def admin_key() -> str:
    """An unpinned key: sees every resource."""
    return services.api_key_create(name="ops")[1]


def call(api: Client, method: str, path: str, key: str | None, body: Any = None) -> Any:
    headers = {"HTTP_X_API_KEY": key} if key else {}
    data = json.dumps(body) if body is not None else ""
    return getattr(api, method)(f"/api{path}", data, content_type="application/json", **headers)


def thread_of(resource: str) -> Thread:
    return services.thread_create(metadata={"resource_id": resource})


# --- the key check ------------------------------------------------------------------------------


def test_it_answers_401_without_a_key(api: Client) -> None:
    r = call(api, "post", "/threads/search", None, {})
    assert r.status_code == 401
    assert r.json() == {
        "detail": "Missing or invalid API key (send it in the x-api-key header)",
        "code": "unauthorized",
    }


def test_it_answers_401_for_a_wrong_or_revoked_key(api: Client, admin_key: str) -> None:
    assert call(api, "post", "/threads/search", "rs_wrong", {}).status_code == 401
    key = ApiKey.objects.get(name="ops")
    services.api_key_revoke(key=key)
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 401


def test_a_key_revoked_here_is_refused_at_once_though_just_used(
    api: Client, admin_key: str
) -> None:
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 200
    services.api_key_revoke(key=ApiKey.objects.get(name="ops"))
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 401


def _key_reads(api: Client, key: str) -> int:
    """How many statements reading API keys one request made."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert call(api, "post", "/threads/search", key, {}).status_code == 200
    return sum(q["sql"].startswith("SELECT") and '"runs_apikey"' in q["sql"] for q in queries)


def test_a_key_just_read_is_not_read_again_for_a_while(api: Client, admin_key: str) -> None:
    assert _key_reads(api, admin_key) == 1
    assert _key_reads(api, admin_key) == 0


def test_a_key_revoked_by_another_process_is_refused_once_the_read_is_that_old(
    api: Client, admin_key: str, settings: Any
) -> None:
    """Another process revokes without this one knowing (here: the row changed without the
    model's signals): a key read less than RUNS_API_KEY_CACHE_SECONDS ago is still answered
    for, then read again and refused."""
    import time

    from django.utils import timezone

    settings.RUNS_API_KEY_CACHE_SECONDS = 0.3
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 200
    ApiKey.objects.filter(name="ops").update(revoked_at=timezone.now())
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 200
    time.sleep(0.35)
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 401


def test_with_no_time_to_keep_keys_each_request_reads_its_key(
    api: Client, admin_key: str, settings: Any
) -> None:
    from django.utils import timezone

    settings.RUNS_API_KEY_CACHE_SECONDS = 0
    assert _key_reads(api, admin_key) == 1
    assert _key_reads(api, admin_key) == 1
    ApiKey.objects.filter(name="ops").update(revoked_at=timezone.now())
    assert call(api, "post", "/threads/search", admin_key, {}).status_code == 401


def test_it_accepts_a_valid_key_and_records_its_use(api: Client, admin_key: str) -> None:
    r = call(api, "post", "/threads/search", admin_key, {})
    assert r.status_code == 200
    assert ApiKey.objects.get(name="ops").last_used_at is not None


def test_it_stores_keys_only_as_hashes(admin_key: str) -> None:
    key = ApiKey.objects.get(name="ops")
    assert admin_key not in key.key_hash
    assert key.key_hash == ApiKey.hash_key(admin_key)
    assert admin_key.startswith(key.prefix)


def test_it_names_the_key_as_the_actor(api: Client, admin_key: str) -> None:
    thread = thread_of("x")
    run = services.run_create(agent_id="echo", thread_id=thread.id, actor="t")
    r = call(api, "post", "/runs/cancel", admin_key, {"run_ids": [str(run.id)]})
    assert r.status_code == 204
    assert AuditEntry.objects.get(action="cancel_interrupt").actor == "api:ops"


def test_the_health_route_needs_no_key(api: Client) -> None:
    assert api.get("/api/ok").json() == {"ok": True}


def test_openapi_declares_the_header(api: Client) -> None:
    schema = api.get("/api/openapi.json").json()
    assert schema["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
    }


# --- auth off -----------------------------------------------------------------------------------


def test_with_auth_off_no_key_is_needed_and_a_stray_key_is_ignored(
    api: Client, settings: Any
) -> None:
    settings.RUNS_API_AUTH = False
    assert call(api, "post", "/threads", None, {}).status_code == 200
    # langgraph_sdk sends LANGSMITH_API_KEY whenever it is set: that must not lock anyone out.
    assert call(api, "post", "/threads", "lsv2_something", {}).status_code == 200
    thread = thread_of("x")
    run = services.run_create(agent_id="echo", thread_id=thread.id, actor="t")
    call(api, "post", "/runs/cancel", None, {"run_ids": [str(run.id)]})
    assert AuditEntry.objects.get(action="cancel_interrupt").actor == "api:anonymous"


def test_with_auth_off_a_valid_pinned_key_still_pins(
    api: Client, settings: Any, alice_key: str
) -> None:
    settings.RUNS_API_AUTH = False
    thread_of("bob")
    assert call(api, "post", "/threads/search", alice_key, {}).json() == []


# --- a pinned resource always wins ---------------------------------------------------------------


def test_a_pinned_key_creates_threads_in_its_resource(api: Client, alice_key: str) -> None:
    r = call(api, "post", "/threads", alice_key, {"metadata": {"resource_id": "bob"}})
    assert r.status_code == 200
    thread = Thread.objects.get(id=r.json()["thread_id"])
    assert thread.resource_id == "alice"
    assert r.json()["metadata"]["resource_id"] == "alice"


def test_a_pinned_key_sees_only_its_threads(api: Client, alice_key: str, admin_key: str) -> None:
    mine = thread_of("alice")
    theirs = thread_of("bob")
    found = call(api, "post", "/threads/search", alice_key, {}).json()
    assert [t["thread_id"] for t in found] == [str(mine.id)]
    spoof = {"metadata": {"resource_id": "bob"}}
    assert call(api, "post", "/threads/search", alice_key, spoof).json() == []
    assert call(api, "post", "/threads/count", alice_key, {}).json() == 1
    assert call(api, "post", "/threads/count", admin_key, {}).json() == 2
    for method, path, body in [
        ("get", f"/threads/{theirs.id}", None),
        ("get", f"/threads/{theirs.id}/state", None),
        ("get", f"/threads/{theirs.id}/history", None),
        ("post", f"/threads/{theirs.id}/history", {}),
        ("patch", f"/threads/{theirs.id}", {"metadata": {"x": 1}}),
        ("post", f"/threads/{theirs.id}/state", {"values": {"x": 1}}),
        ("get", f"/threads/{theirs.id}/runs", None),
        ("post", f"/threads/{theirs.id}/runs", {"assistant_id": "echo"}),
        ("delete", f"/threads/{theirs.id}", None),
    ]:
        r = call(api, method, path, alice_key, body)
        assert r.status_code == 404, (method, path, r.status_code)
    assert Thread.objects.get(id=theirs.id).metadata == {"resource_id": "bob"}
    assert not Run.objects.filter(thread=theirs).exists()


@pytest.mark.django_db(transaction=True)  # join/stream/cancel read from other threads
def test_a_pinned_key_cannot_touch_runs_of_another_resource(
    api: Client, alice_key: str, admin_key: str
) -> None:
    theirs = thread_of("bob")
    run = services.run_create(agent_id="echo", thread_id=theirs.id, actor="t")
    base = f"/threads/{theirs.id}/runs/{run.id}"
    assert call(api, "get", base, alice_key).status_code == 404
    assert call(api, "delete", base, alice_key).status_code == 404
    assert call(api, "post", f"{base}/cancel", alice_key).status_code == 404
    assert call(api, "get", f"{base}/join", alice_key).status_code == 404
    assert call(api, "get", f"{base}/stream", alice_key).status_code == 404
    assert call(api, "post", "/runs/cancel", alice_key, {"status": "all"}).status_code == 204
    assert (
        call(api, "post", "/runs/cancel", alice_key, {"run_ids": [str(run.id)]}).status_code == 204
    )
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING  # untouched
    resume = {"assistant_id": "echo", "command": {"resume": 1}}
    assert call(api, "post", f"/threads/{theirs.id}/runs", alice_key, resume).status_code == 404
    # The same calls with an unpinned key reach the run (so the 404s above were the scope).
    assert call(api, "get", base, admin_key).status_code == 200
    assert call(api, "post", f"{base}/cancel", admin_key).status_code == 202


def test_a_pinned_key_can_cancel_its_own_runs_in_bulk(api: Client, alice_key: str) -> None:
    mine = services.run_create(agent_id="echo", thread_id=thread_of("alice").id, actor="t")
    theirs = services.run_create(agent_id="echo", thread_id=thread_of("bob").id, actor="t")
    assert call(api, "post", "/runs/cancel", alice_key, {"status": "pending"}).status_code == 204
    assert Run.objects.get(id=mine.id).status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=theirs.id).status == RunStatus.PENDING


def test_a_pinned_key_runs_stateless_runs_in_its_resource(api: Client, alice_key: str) -> None:
    r = call(api, "post", "/runs", alice_key, {"assistant_id": "echo"})
    assert r.status_code == 200
    assert Run.objects.get(id=r.json()["run_id"]).resource_id == "alice"


# --- createapikey ------------------------------------------------------------------------------


def test_createapikey_prints_the_raw_key_alone_on_the_last_line(api: Client) -> None:
    out, err = StringIO(), StringIO()
    call_command("createapikey", "ci", "--resource", "acme", stdout=out, stderr=err)
    raw = out.getvalue().strip().splitlines()[-1]
    assert raw.startswith("rs_") and " " not in raw
    key = ApiKey.objects.get(name="ci")
    assert key.resource_id == "acme" and key.key_hash == ApiKey.hash_key(raw)
    assert call(api, "post", "/threads/search", raw, {}).status_code == 200


def test_a_key_being_read_again_is_not_marked_again_by_the_requests_meanwhile(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of requests past half a key's time reads it again once: the requests answered
    while that read is under way do not mark it again."""
    import threading
    import time

    from runs import selectors
    from runs.api.auth import _RecentKeys

    settings.RUNS_API_KEY_CACHE_SECONDS = 60
    services.api_key_create(name="burst")
    key = ApiKey.objects.get(name="burst")
    kept = _RecentKeys()
    kept.put(key)
    kept._found[key.key_hash] = (time.monotonic() - 31, key)  # past half its time
    reading, release = threading.Event(), threading.Event()
    reads: list[str] = []

    def slow_read(key_hash: str) -> Any:
        reads.append(key_hash)
        reading.set()
        release.wait(5)
        return key

    monkeypatch.setattr(selectors, "api_key_for_hash", slow_read)
    assert kept.get(key.key_hash) == key and kept.refresh_due()
    refresher = threading.Thread(target=kept.refresh)
    refresher.start()
    assert reading.wait(5)
    for _ in range(5):  # answered meanwhile, the key still as old
        assert kept.get(key.key_hash) == key
    assert not kept.refresh_due()
    release.set()
    refresher.join(5)
    assert reads == [key.key_hash]
    assert kept.get(key.key_hash) == key and not kept.refresh_due()  # kept from the new read
