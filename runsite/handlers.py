"""The ASGI handler for /api/: Django's, with the API's own middleware chain, and its requests
served on a long-lived thread pool instead of a thread started per request.

Django's ASGI handler serves a synchronous view in three hops between the event loop and a
thread (the `request_started` receivers, the view, `response.close()` with `request_finished`),
each on a thread created for the request, plus a task listening for a disconnect the view
cannot act on. Here a synchronous view's whole request (signals, middleware, view, close) runs in
one call on the pool; the event loop only reads the body and writes the answer, and then
publishes what the request committed (`live.publishes_held`) and sends the cancel notices its
commits kept for workers (`services.cancel_notices_held`), so that the answer goes first.

An asynchronous view (wait, join, stream) runs on the event loop as under Django, with the same
disconnect handling. `request_started` and the request's creation stay on the loop, with its
API-key check when the process knows the key (`_begin`); its synchronous parts go to the pool:
the key's read otherwise (ninja's auth), the view's database calls (`runs/api/streaming.db`), and
the close with `request_finished`. Django would start a thread for the request and hop to it for
each.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import connection
from django.urls import (
    Resolver404,
    ResolverMatch,
    URLResolver,
    get_resolver,
    set_script_prefix,
)

from runs import live, services
from runs.api import streaming
from runs.api.auth import api_key_auth
from runsite.url_index import RouteIndex

logger = logging.getLogger("runsite")


def _load_api_middleware(handler: base.BaseHandler, is_async: bool) -> None:
    # BaseHandler reads settings.MIDDLEWARE itself; swap it only while the chain is built
    # (once, at import, before the server takes requests).
    full = settings.MIDDLEWARE
    settings.MIDDLEWARE = settings.API_MIDDLEWARE
    try:
        base.BaseHandler.load_middleware(handler, is_async)
    finally:
        settings.MIDDLEWARE = full


# The URL match found on the event loop (to choose sync or async), kept in the ASGI scope so the
# handler does not resolve the same path again on the thread.
_MATCH = "runsite.resolver_match"
# The path the API is served under (runsite/asgi.py sends it here).
API_PREFIX = "/api/"
_IS_ASYNC: dict[Any, bool] = {}


def _resolve_once(handler: base.BaseHandler, request: Any) -> ResolverMatch:
    path, match = getattr(request, "scope", {}).get(_MATCH, (None, None))
    if match is None or path != request.path_info or hasattr(request, "urlconf"):
        return base.BaseHandler.resolve_request(handler, request)
    request.resolver_match = match
    return match


_ROUTES: list[tuple[URLResolver, RouteIndex | URLResolver]] = []


def _route_index() -> RouteIndex | URLResolver:
    """The API's routes indexed by shape (runsite/url_index.py) under the project's resolver,
    built again when that changes (a test's ROOT_URLCONF); the resolver itself when it has no
    `api/` include."""
    root = get_resolver()
    if not _ROUTES or _ROUTES[0][0] is not root:
        try:
            _ROUTES[:] = [(root, RouteIndex(root, API_PREFIX[1:]))]
        except ValueError:
            _ROUTES[:] = [(root, root)]
    return _ROUTES[0][1]


def _is_async(view: Any) -> bool:
    # Views are module-level functions: one inspection each for the life of the process.
    found = _IS_ASYNC.get(view)
    if found is None:
        found = _IS_ASYNC[view] = iscoroutinefunction(view)
    return found


class _SyncChain(base.BaseHandler):
    """The API middleware chain in synchronous mode, for views served in one hop."""

    def __init__(self) -> None:
        super().__init__()
        _load_api_middleware(self, is_async=False)

    def resolve_request(self, request: Any) -> ResolverMatch:
        return _resolve_once(self, request)


def _after_answer_call(fn: Any, *args: Any) -> None:
    """`fn(*args)` on the pool after an answer, its database connection handed back after."""
    try:
        fn(*args)
    finally:
        connection.close()  # back to the pool, as a request's close hands it back


class ApiHandler(ASGIHandler):
    """Django's handler with `settings.API_MIDDLEWARE` instead of `MIDDLEWARE`, for /api/."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self._sync_chain = _SyncChain()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api")

    def load_middleware(self, is_async: bool = False) -> None:
        _load_api_middleware(self, is_async)

    def resolve_request(self, request: Any) -> ResolverMatch:
        return _resolve_once(self, request)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sync_view = self._is_sync_view(scope)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with closing(body_file):
            set_script_prefix(get_script_prefix(scope))
            if not sync_view:
                await self._serve_async(scope, receive, send, body_file)
                await self._after_answer()
                return
            response, held, notices = await self._in_pool(self._respond, scope, body_file)
            if response.streaming:  # its body may take long: what it committed goes first
                live.publish_all(held)
                await self._send_notices(notices)
                await self.send_response(response, send)
                await self._in_pool(response.close)
            else:
                try:
                    await self.send_response(response, send)
                finally:
                    live.publish_all(held)
                    await self._send_notices(notices)
        await self._after_answer()

    async def send_response(self, response: Any, send: Any) -> None:
        """Django's, with the length of a body held in memory (Django's CommonMiddleware sets
        it in the full chain; the API's leaves it out): the server then sends the body as it
        is instead of in chunks (`Transfer-Encoding: chunked`: framed, then an empty chunk to
        end it), and the client reads a length instead of the chunks' framing. ~0.08 ms of
        the server's CPU per request (docs/benchmarks.md)."""
        if not response.streaming and not response.has_header("Content-Length"):
            response.headers["Content-Length"] = str(len(response.content))
        await super().send_response(response, send)

    async def _after_answer(self) -> None:
        """What a request leaves for after its answer: the API keys this process holds that
        are due to be read again (`api_key_auth.refresh_kept_keys`), so that no request waits
        on a key's read while the key is in use. A failed read leaves them as they were, to
        be read by the request that finds them expired."""
        if not api_key_auth.kept_keys_due():
            return
        try:
            await self._in_pool(_after_answer_call, api_key_auth.refresh_kept_keys)
        except Exception:
            logger.warning("api: reading the kept API keys again failed", exc_info=True)

    async def _in_pool(self, fn: Any, *args: Any) -> Any:
        return await streaming.on_pool(self._pool, fn, *args)

    async def _serve_async(self, scope: Any, receive: Any, send: Any, body_file: Any) -> None:
        """Django's `ASGIHandler.handle` for an async view, its sync parts on the pool."""
        pool = streaming.API_EXECUTOR.set(self._pool)
        try:
            request, response = self._begin(scope, body_file)
            if request is None:
                await self.send_response(response, send)
                await self._in_pool(response.close)
                return

            class RequestProcessed(Exception):
                pass

            response = None
            try:
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(self.listen_for_disconnect(receive))
                        response = await self.run_get_response(request)
                        await self.send_response(response, send)
                        raise RequestProcessed
                except* (RequestProcessed, RequestAborted):
                    pass
            except BaseExceptionGroup as group:
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
            if response is None:  # the client left before the answer was ready
                await self._in_pool(lambda: signals.request_finished.send(sender=self.__class__))
            else:
                await self._in_pool(response.close)
        finally:
            streaming.API_EXECUTOR.reset(pool)

    def _begin(self, scope: Any, body_file: Any) -> tuple[Any, Any]:
        """`request_started`, the request, and its caller when this process knows it without
        the database (`resolve_from_memory`: no key, or a key it read in the last second), on
        the event loop, as Django's handler creates an async view's request: a hop to a
        thread and back costs ~0.5-1 ms on an idle machine, more than the rest. The signal's
        receivers (Django's: the queries log, connections past their age) find no connection
        here: the view's database calls take theirs on the pool and hand them back
        (`streaming.db`). A key this process must read is checked by the view's auth instead,
        on the pool, inside the middleware chain (where a lost database is answered 503)."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            api_key_auth.resolve_from_memory(request)
        return request, response

    def _is_sync_view(self, scope: dict[str, Any]) -> bool:
        path = scope["path"]
        try:
            match = _route_index().resolve(path)
        except Resolver404:
            return True  # the 404 answer is rendered synchronously
        scope[_MATCH] = (path, match)
        return not _is_async(match.func)

    def _respond(
        self, scope: Any, body_file: Any
    ) -> tuple[Any, list[live.RunChange], list[services.Notice]]:
        """The request from `request_started` to `request_finished`, on one thread, with the
        changes it committed and the cancel notices to workers its commits would have sent,
        both held for once the answer has gone (`live.publishes_held`,
        `services.cancel_notices_held`)."""
        with live.publishes_held() as held, services.cancel_notices_held() as notices:
            return self._respond_holding(scope, body_file), held, notices

    async def _send_notices(self, notices: list[services.Notice]) -> None:
        if notices:
            await self._in_pool(_after_answer_call, services.send_cancel_notices, notices)

    def _respond_holding(self, scope: Any, body_file: Any) -> Any:
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync_chain.get_response(request)
        assert response is not None
        # ASGIHandler sets it too: HttpResponse.close() names it in request_finished.
        response._handler_class = self.__class__  # type: ignore[attr-defined]
        if not response.streaming:
            # The body is in memory: what close() releases (the database connection among
            # them, through request_finished) is released here, on the thread that took it.
            response.close()
        return response
