"""Request middleware: NUL characters refused, a lost database connection answered 503,
static files served by WhiteNoise.

Every middleware here works both ways (sync and async): under ASGI one sync-only middleware
makes Django run the rest of the chain in a thread, so every request (including the async
streaming views) would hop to a thread and back before reaching its view.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.security import SecurityMiddleware as DjangoSecurityMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware

logger = logging.getLogger("runsite")

UNAVAILABLE = (OperationalError, InterfaceError)


def is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, UNAVAILABLE):
        return True
    # psycopg reports a terminated backend as an OperationalError, which Django wraps; a query
    # on a connection that is already closed surfaces as InterfaceError.
    return isinstance(exc, DatabaseError) and "connection" in str(exc).lower()


def unavailable_response(request: HttpRequest) -> HttpResponse:
    body = {
        "detail": "The database is unavailable right now; retry shortly.",
        "code": "database_unavailable",
    }
    if request.path.startswith("/api/") or "application/json" in request.headers.get("Accept", ""):
        response: HttpResponse = JsonResponse(body, status=503)
    else:
        response = HttpResponse(
            "<h1>Service unavailable</h1><p>The database is unavailable right now; retry shortly.</p>",
            status=503,
        )
    response["Retry-After"] = "2"
    return response


class _BothWays:
    """A middleware Django may call synchronously or asynchronously (the chain's mode)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        refused = self.refuse(request)
        if self.is_async:
            return self._acall(request, refused)
        return refused if refused is not None else self.get_response(request)

    async def _acall(self, request: HttpRequest, refused: HttpResponse | None) -> HttpResponse:
        if refused is not None:
            return refused
        response: HttpResponse = await self.get_response(request)
        return response

    def refuse(self, request: HttpRequest) -> HttpResponse | None:
        return None


class DatabaseUnavailableMiddleware(_BothWays):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_connection_error(exception):
            return None
        logger.warning(
            "database unavailable for %s %s: %s", request.method, request.path, exception
        )
        close_old_connections()  # the next request gets a fresh connection from the pool
        return unavailable_response(request)


class RejectNulMiddleware(_BothWays):
    """PostgreSQL cannot store or compare NUL characters in text or jsonb; a request carrying one
    in its query string or JSON body gets a clear 4xx instead of a database error."""

    def refuse(self, request: HttpRequest) -> HttpResponse | None:
        # Under ASGI the body has already been read into memory (or a spooled file).
        query = request.META.get("QUERY_STRING", "")
        if "%00" in query or "\x00" in query:
            return JsonResponse(
                {
                    "detail": "Query parameters may not contain NUL characters (%00)",
                    "code": "bad_request",
                },
                status=400,
            )
        if "json" in request.headers.get("Content-Type", ""):
            try:
                body = request.body
            except RequestDataTooBig:
                return JsonResponse(
                    {"detail": "Request body is too large", "code": "payload_too_large"}, status=413
                )
            if b"\\u0000" in body or b"\x00" in body:
                return JsonResponse(
                    {
                        "detail": "JSON strings may not contain NUL characters (\\u0000)",
                        "code": "invalid_json",
                    },
                    status=422,
                )
        return None


class SecurityMiddleware(DjangoSecurityMiddleware):
    """Django's SecurityMiddleware, with its checks run inline in async mode.

    Django's MiddlewareMixin calls `process_request` and `process_response` through
    `sync_to_async` for an async request: two hops to a thread and back per request for a
    redirect check and a few headers, which touch neither the database nor the disk.
    """

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        response = self.process_request(request)
        if response is None:
            response = await self.get_response(request)  # type: ignore[misc]  # async chain
        return self.process_response(request, response)


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, both ways: a static file is served from a thread, anything else goes on
    down the chain without one (WhiteNoiseMiddleware itself is sync-only)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any], settings: Any = None):
        if settings is None:
            super().__init__(get_response)
        else:
            super().__init__(get_response, settings)
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    async def _acall(self, request: HttpRequest) -> Any:
        if self.autorefresh:
            static_file = await sync_to_async(self.find_file)(request.path_info)
        else:
            static_file = self.files.get(request.path_info)
        if static_file is not None:
            return await sync_to_async(self.serve)(static_file, request)
        return await self.get_response(request)
