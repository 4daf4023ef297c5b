"""Liveness (the process answers) and readiness (database and, when configured, Redis reachable)."""

from __future__ import annotations

import asyncio

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse


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


async def _layer_ok() -> bool:
    layer = get_channel_layer()
    try:
        await asyncio.wait_for(layer.group_send("health", {"type": "noop"}), 2)
        return True
    except Exception:
        return False
