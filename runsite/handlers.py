"""The ASGI handler for /api/: Django's, with the API's own middleware chain, and a synchronous
view served in one hop to a thread.

Django's ASGI handler serves a synchronous view in three hops between the event loop and a
thread (the `request_started` receivers, the view, `response.close()` with `request_finished`),
each on a thread created for the request, plus a task listening for a disconnect the view
cannot act on. Here a synchronous view's whole request (signals, middleware, view, close) runs in
one call on a long-lived thread pool; the event loop only reads the body and writes the answer.
Asynchronous views (wait, join, stream) take Django's own path unchanged.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import Resolver404, get_resolver, set_script_prefix


def _load_api_middleware(handler: base.BaseHandler, is_async: bool) -> None:
    # BaseHandler reads settings.MIDDLEWARE itself; swap it only while the chain is built
    # (once, at import, before the server takes requests).
    full = settings.MIDDLEWARE
    settings.MIDDLEWARE = settings.API_MIDDLEWARE
    try:
        base.BaseHandler.load_middleware(handler, is_async)
    finally:
        settings.MIDDLEWARE = full


class _SyncChain(base.BaseHandler):
    """The API middleware chain in synchronous mode, for views served in one hop."""

    def __init__(self) -> None:
        super().__init__()
        _load_api_middleware(self, is_async=False)


class ApiHandler(ASGIHandler):
    """Django's handler with `settings.API_MIDDLEWARE` instead of `MIDDLEWARE`, for /api/."""

    def __init__(self, threads: int) -> None:
        super().__init__()
        self._sync_chain = _SyncChain()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api")

    def load_middleware(self, is_async: bool = False) -> None:
        _load_api_middleware(self, is_async)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._is_sync_view(scope["path"]):
            await super().__call__(scope, receive, send)
            return
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        with closing(body_file):
            set_script_prefix(get_script_prefix(scope))
            respond = sync_to_async(self._respond, thread_sensitive=False, executor=self._pool)
            response = await respond(scope, body_file)
            await self.send_response(response, send)
            if response.streaming:
                await sync_to_async(response.close, thread_sensitive=False, executor=self._pool)()

    def _is_sync_view(self, path: str) -> bool:
        try:
            match = get_resolver().resolve(path)
        except Resolver404:
            return True  # the 404 answer is rendered synchronously
        return not iscoroutinefunction(match.func)

    def _respond(self, scope: Any, body_file: Any) -> Any:
        """The request from `request_started` to `request_finished`, on one thread."""
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
