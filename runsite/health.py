"""Liveness (the process answers) and readiness (database and, when configured, Redis reachable)."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest


def liveness(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _redis_ok() -> tuple[bool, str]:
    if not settings.REDIS_URL:
        return True, "not configured"
    import redis

    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2
        )
        client.ping()
        client.close()
        return True, "ok"
    except Exception as exc:
        return False, type(exc).__name__


def readiness(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    ok = True
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        ok = False
        checks["database"] = type(exc).__name__
    redis_ok, detail = _redis_ok()
    checks["redis"] = detail
    ok = ok and redis_ok
    return JsonResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503
    )


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. With RUNS_METRICS_TOKEN set, requires `Authorization: Bearer …`."""
    token = settings.RUNS_METRICS_TOKEN
    if token and not hmac.compare_digest(
        request.headers.get("Authorization", ""), f"Bearer {token}"
    ):
        return HttpResponse("metrics need a bearer token\n", status=401, content_type="text/plain")
    from runs.metrics import register_run_state_collector

    register_run_state_collector()
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
