"""The JSON API (django-ninja): LangGraph-compatible threads/runs/assistants and the review API."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpRequest
from ninja import NinjaAPI

logger = logging.getLogger("runs.api")


def build_api() -> NinjaAPI:
    from runs.api.auth import api_key_auth
    from runs.api.errors import install_error_handlers
    from runs.api.langgraph import assistants, runs, threads
    from runs.api.retry import retry
    from runs.api.review import review
    from runs.api.search import search

    api = NinjaAPI(
        title="Runsite API",
        version="1.0.0",
        description=(
            "LangGraph-compatible threads and runs (langgraph_sdk works against it), plus the "
            "suspended-run review API. Send the API key in the `x-api-key` header."
        ),
        urls_namespace="api",
        docs_url="/docs",
        auth=api_key_auth,
    )
    install_error_handlers(api)
    if not settings.RUNS_API_AUTH:
        logger.warning(
            "!! RUNS_API_AUTH=off: the JSON API at /api/ accepts requests without an API key !!"
        )

    @api.get("/ok", tags=["meta"], summary="Liveness of the API", auth=None)
    def ok(request: HttpRequest) -> dict[str, bool]:
        return {"ok": True}

    # Order matters: the LangGraph routers register literal paths (/runs/stream, /runs/cancel)
    # that must resolve before the review API's /runs/{run_id}.
    api.add_router("", assistants)
    api.add_router("", threads)
    api.add_router("", runs)
    # Before review: its /runs/{run_id} would otherwise answer POST /runs/retry.
    api.add_router("", retry)
    api.add_router("", search)  # before review too: /runs/search is not a run id
    api.add_router("", review)
    return api
