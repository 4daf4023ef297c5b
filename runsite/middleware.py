"""A lost database connection is a 503 (retry later), never a 500 with a traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, InterfaceError, OperationalError, close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse

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


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_connection_error(exception):
            return None
        logger.warning(
            "database unavailable for %s %s: %s", request.method, request.path, exception
        )
        close_old_connections()  # the next request gets a fresh connection from the pool
        return unavailable_response(request)


class RejectNulMiddleware:
    """PostgreSQL cannot store or compare NUL characters in text or jsonb; a request carrying one
    in its query string or JSON body gets a clear 4xx instead of a database error."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
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
        return self.get_response(request)
