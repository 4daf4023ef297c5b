"""The JSON API (django-ninja): LangGraph-compatible threads/runs/assistants and the review API."""

from __future__ import annotations

from ninja import NinjaAPI


def build_api() -> NinjaAPI:
    from runs.api.errors import install_error_handlers

    api = NinjaAPI(
        title="Runsite API",
        version="1.0.0",
        description="LangGraph-compatible threads and runs, plus the suspended-run review API.",
        urls_namespace="api",
        docs_url="/docs",
    )
    install_error_handlers(api)

    @api.get("/ok", tags=["meta"], summary="Liveness of the API")
    def ok(request):
        return {"ok": True}

    return api
