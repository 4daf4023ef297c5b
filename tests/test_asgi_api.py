"""The API through the ASGI application a server runs (runsite/asgi.py → runsite/handlers.py):
a synchronous view's whole request on one thread, an asynchronous view's sync parts on the
handler's pool."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.core.signals import request_finished, request_started

from runs import services
from runs.models import Run, Thread
from runsite.asgi import application
from tests.helpers import asgi_request

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def key(settings: Any) -> str:
    settings.RUNS_API_AUTH = True
    return services.api_key_create(name="asgi")[1]


@pytest.fixture
def signal_threads() -> Iterator[dict[str, list[int]]]:
    """The threads `request_started` and `request_finished` were sent on."""
    seen: dict[str, list[int]] = {"started": [], "finished": []}

    def started(**_: Any) -> None:
        seen["started"].append(threading.get_ident())

    def finished(**_: Any) -> None:
        seen["finished"].append(threading.get_ident())

    request_started.connect(started, weak=False)
    request_finished.connect(finished, weak=False)
    yield seen
    request_started.disconnect(started)
    request_finished.disconnect(finished)


def client(key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),
        base_url="http://127.0.0.1",
        headers={"x-api-key": key},
    )


async def test_a_synchronous_view_is_served_on_one_thread_off_the_event_loop(
    key, signal_threads
) -> None:
    async with client(key) as api:
        response = await api.post("/api/threads", json={"metadata": {"team": "ops"}})
    assert response.status_code == 200, response.text
    thread_id = response.json()["thread_id"]
    assert (await sync_to_async(Thread.objects.get)(id=thread_id)).metadata["team"] == "ops"
    # request_started, the view and request_finished (which hands the database connection
    # back) ran on one thread, not on the event loop's.
    assert len(signal_threads["started"]) == 1
    assert signal_threads["started"] == signal_threads["finished"]
    assert signal_threads["started"][0] != threading.get_ident()


async def test_errors_keep_their_answers_on_the_one_thread_path(key) -> None:
    async with client(key) as api:
        bad_json = await api.post(
            "/api/threads", content=b"{not json", headers={"content-type": "application/json"}
        )
        missing = await api.get("/api/threads/00000000-0000-0000-0000-000000000000")
        no_route = await api.get("/api/no-such-thing")
        no_key = await api.get(
            "/api/threads/00000000-0000-0000-0000-000000000000", headers={"x-api-key": "wrong"}
        )
    assert bad_json.status_code in (400, 422), bad_json.text
    assert missing.status_code == 404 and missing.json()["code"] == "thread_not_found"
    assert no_route.status_code == 404
    assert no_key.status_code == 401


async def test_each_request_resolves_its_url_once(key, drain, monkeypatch) -> None:
    """The match that chose the sync or async path is the one the view is called with."""
    from django.urls.resolvers import URLResolver

    resolved: list[str] = []
    resolve = URLResolver.resolve

    def counting(self: URLResolver, path: str) -> Any:
        if self.pattern.regex.pattern in ("^/", ""):  # the root resolver, not the includes
            resolved.append(path)
        return resolve(self, path)

    def finished_run() -> tuple[str, str]:
        thread = services.thread_create()
        run = services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")
        drain()
        return str(thread.id), str(run.id)

    thread_id, run_id = await sync_to_async(finished_run)()
    monkeypatch.setattr(URLResolver, "resolve", counting)
    async with client(key) as api:
        got = await api.get(f"/api/threads/{thread_id}")  # a sync view
        joined = await api.get(f"/api/threads/{thread_id}/runs/{run_id}/join")  # an async one
    assert got.status_code == 200 and got.json()["thread_id"] == thread_id
    assert joined.status_code == 200 and json.loads(joined.content)["output"] == {"echo": {}}
    assert resolved == [f"/api/threads/{thread_id}", f"/api/threads/{thread_id}/runs/{run_id}/join"]


async def test_requests_in_parallel_are_served_side_by_side(key) -> None:
    async with client(key) as api:
        responses = await asyncio.gather(*(api.post("/api/threads", json={}) for _ in range(12)))
    assert [r.status_code for r in responses] == [200] * 12
    assert len({r.json()["thread_id"] for r in responses}) == 12


async def test_a_view_on_the_pool_builds_its_links_under_the_servers_root_path() -> None:
    """The handler's pool runs a view in its thread's own context, not a copy of the event
    loop's: the request's script prefix (a server's root path, behind a proxy that strips it)
    is carried over, for the synchronous view and an asynchronous view's database calls."""
    from runs.api import streaming
    from runsite.handlers import ApiHandler

    transport = httpx.ASGITransport(app=application, root_path="/base")
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as api:
        # More requests than the pool has threads: each thread serves one under the prefix.
        pages = await asyncio.gather(*(api.get("/api/docs") for _ in range(12)))
    for page in pages:
        assert page.status_code == 200
        assert '"/base/api/openapi.json"' in page.text
        assert '"/api/openapi.json"' not in page.text

    from django.urls import get_script_prefix, set_script_prefix

    handler = ApiHandler(threads=2)
    token = streaming.API_EXECUTOR.set(handler._pool)
    set_script_prefix("/elsewhere/")
    try:
        prefixes = [await streaming.db(get_script_prefix) for _ in range(4)]
    finally:
        streaming.API_EXECUTOR.reset(token)
        set_script_prefix("/")
        handler._pool.shutdown()
    assert prefixes == ["/elsewhere/"] * 4


@pytest.mark.parametrize("key_kept", [False, True])
async def test_an_asynchronous_view_runs_its_sync_parts_on_the_pool(
    key, drain, monkeypatch, settings, key_kept
) -> None:
    """A /wait: request_started and the request on the event loop, as the view; the API key's
    read, when the process does not hold the key, and request_finished on the handler's pool;
    no thread of its own. A key the process read a moment ago is not read again, and nothing
    hops to a thread before the view."""
    from runs import selectors

    # 0: the key is read by every request.
    settings.RUNS_API_KEY_CACHE_SECONDS = 60 if key_kept else 0

    seen: list[tuple[str, str]] = []

    def note(what: str) -> None:
        seen.append((what, threading.current_thread().name))

    def started(**_: Any) -> None:
        note("started")

    def finished(**_: Any) -> None:
        note("finished")

    real_lookup = selectors.api_key_for_raw

    def lookup(raw: str) -> Any:
        note("key")
        return real_lookup(raw)

    monkeypatch.setattr(selectors, "api_key_for_raw", lookup)
    async with client(key) as api:
        thread_id = (await api.post("/api/threads", json={})).json()["thread_id"]
        seen.clear()
        request_started.connect(started, weak=False)
        request_finished.connect(finished, weak=False)
        try:
            waiting = asyncio.ensure_future(
                api.post(
                    f"/api/threads/{thread_id}/runs/wait",
                    json={"assistant_id": "echo", "input": {"n": 1}},
                )
            )
            for _ in range(100):
                if await sync_to_async(lambda: Thread.objects.get(id=thread_id).runs.exists())():
                    break
                await asyncio.sleep(0.05)
            await sync_to_async(drain)()
            response = await asyncio.wait_for(waiting, timeout=10)
        finally:
            request_started.disconnect(started)
            request_finished.disconnect(finished)
    assert response.status_code == 200
    assert json.loads(response.content)["output"] == {"echo": {"n": 1}}
    on_pool = [name.startswith("api") for _, name in seen]
    if key_kept:  # read by the POST /api/threads before
        assert [what for what, _ in seen] == ["started", "finished"]
        assert on_pool == [False, True], seen
    else:
        assert [what for what, _ in seen] == ["started", "key", "finished"]
        assert on_pool == [False, True, True], seen


async def test_an_asynchronous_view_records_a_kept_keys_use_when_it_is_due(key, settings) -> None:
    """A key this process holds is answered for from memory on the event loop, except when its
    use is due to be recorded (a minute since the last record): then the view's auth records
    it, as every sync view does."""
    from datetime import timedelta

    from django.utils import timezone

    from runs.api import auth
    from runs.models import ApiKey

    settings.RUNS_API_KEY_CACHE_SECONDS = 60
    unknown = f"/api/threads/{uuid.uuid4()}/runs/{uuid.uuid4()}/join"
    async with client(key) as api:
        assert (await api.post("/api/threads", json={})).status_code == 200  # read and kept
        kept = auth._recent_keys.get(ApiKey.hash_key(key))
        assert kept is not None
        long_ago = timezone.now() - timedelta(minutes=5)
        kept.last_used_at = long_ago
        await sync_to_async(
            lambda: ApiKey.objects.filter(id=kept.id).update(last_used_at=long_ago)
        )()
        assert (await api.get(unknown)).status_code == 404
        recorded = await sync_to_async(lambda: ApiKey.objects.get(id=kept.id).last_used_at)()
        assert recorded is not None and recorded > long_ago
        # Recorded just now: the next request is answered for from memory, nothing written.
        assert (await api.get(unknown)).status_code == 404
        assert await sync_to_async(lambda: ApiKey.objects.get(id=kept.id).last_used_at)() == (
            recorded
        )


async def test_an_asynchronous_view_refuses_a_wrong_key(key) -> None:
    async with client(key) as api:
        thread_id = (await api.post("/api/threads", json={})).json()["thread_id"]
        wrong = await api.post(
            f"/api/threads/{thread_id}/runs/wait",
            json={"assistant_id": "echo", "input": {}},
            headers={"x-api-key": "wrong"},
        )
        missing = await api.post(
            f"/api/threads/{thread_id}/runs/wait",
            json={"assistant_id": "echo", "input": {}},
            headers={"x-api-key": ""},
        )
    assert wrong.status_code == 401 and missing.status_code == 401
    assert not await sync_to_async(lambda: Thread.objects.get(id=thread_id).runs.exists())()


async def test_security_middleware_runs_inline_for_an_asynchronous_view(
    key, drain, monkeypatch
) -> None:
    """runsite.middleware.SecurityMiddleware: Django's checks and headers, without the two hops
    to a thread Django's MiddlewareMixin makes for an async request."""
    from runsite.middleware import SecurityMiddleware

    seen: list[int] = []
    original = SecurityMiddleware.process_response

    def spy(self: Any, request: Any, response: Any) -> Any:
        seen.append(threading.get_ident())
        return original(self, request, response)

    monkeypatch.setattr(SecurityMiddleware, "process_response", spy)
    async with client(key) as api:
        thread_id = (await api.post("/api/threads", json={})).json()["thread_id"]
        created = await api.post(
            f"/api/threads/{thread_id}/runs", json={"assistant_id": "echo", "input": {"n": 2}}
        )
        await sync_to_async(drain)()
        joined = await api.get(f"/api/threads/{thread_id}/runs/{created.json()['run_id']}/join")
    assert joined.status_code == 200 and joined.json()["output"] == {"echo": {"n": 2}}
    for response in (created, joined):  # a synchronous view and an asynchronous one
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "same-origin"
    loop_thread = threading.get_ident()
    assert len(seen) == 3 and seen[-1] == loop_thread  # the join: on the event loop
    assert seen[0] != loop_thread  # threads.create: on its one-hop thread


async def test_security_middleware_still_redirects_an_asynchronous_request(settings) -> None:
    from django.http import HttpResponse
    from django.test import RequestFactory

    from runsite.middleware import SecurityMiddleware

    settings.SECURE_SSL_REDIRECT = True  # read when the middleware is built, as at start-up

    async def view(request: Any) -> HttpResponse:
        return HttpResponse("reached")

    middleware = SecurityMiddleware(view)
    plain = await middleware(RequestFactory().get("/api/ok"))
    secure = await middleware(RequestFactory().get("/api/ok", secure=True))
    assert plain.status_code == 301 and plain["Location"] == "https://testserver/api/ok"
    assert secure.status_code == 200 and secure.content == b"reached"
    assert secure["X-Content-Type-Options"] == "nosniff"


def test_no_api_path_mixes_sync_and_async_operations() -> None:
    """The handler serves a path whose view is async on the event loop with no thread of its
    own; a sync operation on such a path would make ninja hop to asgiref's one shared thread
    (and keep a database connection there). Give each path operations of one kind."""
    from asgiref.sync import iscoroutinefunction
    from django.urls import URLResolver, get_resolver

    def walk(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for pattern in resolver.url_patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), pattern.callback

    async_paths = 0
    for path, view in walk(get_resolver()):
        if not (path.startswith("api/") and iscoroutinefunction(view)):
            continue
        async_paths += 1
        path_view = view.__closure__[0].cell_contents  # ninja's PathView behind the view
        kinds = {(method, op.is_async) for op in path_view.operations for method in op.methods}
        assert all(is_async for _, is_async in kinds), (path, sorted(kinds))
    assert async_paths >= 6  # wait, stream and join, stateless and on a thread


async def test_a_lost_database_during_an_async_views_key_check_is_a_503(
    key, monkeypatch, settings
) -> None:
    """The key's read (by the view's auth, on the pool: the process does not hold the key)
    fails inside the middleware chain, which answers 503, not a 500 from the server."""
    from django.db import OperationalError

    from runs import selectors

    settings.RUNS_API_KEY_CACHE_SECONDS = 0  # the key is read by every request

    async with client(key) as api:
        thread_id = (await api.post("/api/threads", json={})).json()["thread_id"]

        def broken(raw: str) -> Any:
            raise OperationalError("terminating connection due to administrator command")

        monkeypatch.setattr(selectors, "api_key_for_raw", broken)
        response = await api.post(
            f"/api/threads/{thread_id}/runs/wait", json={"assistant_id": "echo", "input": {}}
        )
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "database_unavailable"
    assert not await sync_to_async(lambda: Thread.objects.get(id=thread_id).runs.exists())()


async def served(
    method: str, path: str, key: str, order: list[tuple[str, Any]], query: bytes = b""
) -> int:
    """One request through the ASGI application as a server calls it, each message it sends
    noted in `order` as ("sent", type) when sent; returns the answer's status."""
    return await asgi_request(
        method, path, key, query=query, on_send=lambda m: order.append(("sent", m["type"]))
    )


async def test_a_synchronous_views_committed_change_is_published_after_its_answer(
    key, monkeypatch
) -> None:
    """What a request committed (a cancel's end of its run) goes to the channel layer once its
    answer has been sent, not before it on the event loop; it still goes out, and at once for
    a request that fails after committing."""
    from runs import live

    order: list[tuple[str, Any]] = []
    send_to_layer = live._send

    async def recorded(changes: list[live.RunChange]) -> bool:
        order.append(("published", sorted(change.run_id for change in changes)))
        return await send_to_layer(changes)

    monkeypatch.setattr(live, "_send", recorded)

    def pending_run() -> tuple[str, str]:
        thread = services.thread_create()
        run = services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")
        return str(thread.id), str(run.id)

    thread_id, run_id = await sync_to_async(pending_run)()
    await asyncio.sleep(0.05)  # the create's own publish is out of the way
    order.clear()
    await served("POST", f"/api/threads/{thread_id}/runs/{run_id}/cancel", key, order, b"wait=1")
    for _ in range(100):
        if any(what == "published" for what, _ in order):
            break
        await asyncio.sleep(0.01)
    assert order[:2] == [("sent", "http.response.start"), ("sent", "http.response.body")]
    assert order[2:] == [("published", [run_id])], order
    assert (await sync_to_async(Run.objects.get)(id=run_id)).status == "interrupted"


@pytest.mark.parametrize("sync_view", [True, False])
async def test_a_key_in_use_is_read_again_after_an_answer_not_before_one(
    key, settings, monkeypatch, sync_view
) -> None:
    """A key used past half of RUNS_API_KEY_CACHE_SECONDS is read again once that answer has
    gone, so a key in steady use is never read on a request's path; a key found revoked then
    is dropped and refused."""
    from django.utils import timezone

    from runs import selectors
    from runs.models import ApiKey

    settings.RUNS_API_KEY_CACHE_SECONDS = 1.0
    order: list[tuple[str, Any]] = []
    real_read = selectors.api_key_for_hash

    def read(key_hash: str) -> Any:
        order.append(("read", None))
        return real_read(key_hash)

    monkeypatch.setattr(selectors, "api_key_for_hash", read)
    thread_id = await sync_to_async(lambda: str(services.thread_create().id))()
    path = (
        f"/api/threads/{thread_id}"
        if sync_view
        else f"/api/threads/{uuid.uuid4()}/runs/{uuid.uuid4()}/join"
    )
    expected = 200 if sync_view else 404
    assert await served("GET", path, key, order) == expected
    assert ("read", None) in order  # the first request reads it
    await asyncio.sleep(0.55)  # past half its time
    order.clear()
    assert await served("GET", path, key, order) == expected
    # Answered from memory; read again after the answer.
    assert order[-1] == ("read", None) and order.count(("read", None)) == 1, order
    await asyncio.sleep(0.55)  # 1.1 s since the first read, 0.55 since the second
    order.clear()
    assert await served("GET", path, key, order) == expected
    # Expired since the first read, but read again since: no read before the answer.
    assert order[:2] == [("sent", "http.response.start"), ("sent", "http.response.body")]
    # Revoked elsewhere (the row changed without the model's signals): the read after the
    # next answer finds it so, and the request after that is refused.
    await sync_to_async(
        lambda: ApiKey.objects.filter(key_hash=ApiKey.hash_key(key)).update(
            revoked_at=timezone.now()
        )
    )()
    await asyncio.sleep(0.55)
    assert await served("GET", path, key, order) == expected
    assert await served("GET", path, key, order) == 401
