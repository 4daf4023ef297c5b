"""Domain exceptions mapped once to HTTP: {"detail": ..., "code": ...} with the right status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from runs.exceptions import RunsError


def _error_body(detail: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"detail": detail, "code": code, **extra}


def _location(loc: Any) -> str:
    parts = [str(p) for p in (loc or []) if p not in ("body", "query", "path", "header")]
    # ninja prefixes the parameter-model name (e.g. "payload"); drop it when more follows
    if len(parts) > 1 and parts[0] in ("payload", "data", "params", "filters"):
        parts = parts[1:]
    if parts in ([], ["payload"]):
        return "body"
    return ".".join(parts)


def _invalid_path_id(errors: list[dict[str, Any]]) -> str | None:
    """'thread' for a malformed {thread_id} in the path (LangGraph's 'Invalid thread ID')."""
    for e in errors:
        loc: Sequence[object] = e.get("loc") or ()
        if len(loc) >= 2 and loc[0] == "path" and str(e.get("type", "")).startswith("uuid"):
            return str(loc[-1]).removesuffix("_id")
    return None


def install_error_handlers(api: NinjaAPI) -> None:
    @api.exception_handler(RunsError)
    def runs_error(request: HttpRequest, exc: RunsError) -> HttpResponse:
        return api.create_response(
            request, _error_body(exc.detail, exc.code, **exc.extra), status=exc.status_code
        )

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        bad_id = _invalid_path_id(exc.errors)
        if bad_id is not None:
            return api.create_response(
                request,
                _error_body(
                    f"Invalid {bad_id} ID: must be a UUID",
                    "invalid_id",
                    errors=[{"field": f"{bad_id}_id", "message": "must be a UUID"}],
                ),
                status=422,
            )
        errors = [
            {"field": _location(e.get("loc")), "message": str(e.get("msg", "invalid"))}
            for e in exc.errors
        ]
        summary = (
            "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5]) or "invalid request"
        )
        return api.create_response(
            request,
            _error_body(f"Invalid request: {summary}", "validation_error", errors=errors),
            status=422,
        )

    @api.exception_handler(AuthenticationError)
    def auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return api.create_response(
            request,
            _error_body(
                "Missing or invalid API key (send it in the x-api-key header)", "unauthorized"
            ),
            status=401,
        )

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        if exc.status_code == 400 and str(exc).startswith("Cannot parse request body"):
            # ninja's body parser failed: the body is not JSON. A 422 with the parser's reason.
            reason = str(exc.__cause__) if exc.__cause__ else "not valid JSON"
            return api.create_response(
                request,
                _error_body(f"Malformed JSON body: {reason}", "invalid_json"),
                status=422,
            )
        return api.create_response(
            request, _error_body(str(exc), "http_error"), status=exc.status_code
        )

    @api.exception_handler(RequestDataTooBig)
    def too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        return api.create_response(
            request, _error_body("Request body is too large", "payload_too_large"), status=413
        )
