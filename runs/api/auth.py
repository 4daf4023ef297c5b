"""API keys: the `x-api-key` header langgraph_sdk sends, checked against hashed ApiKey rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from ninja.security import APIKeyHeader

from runs import selectors, services


@dataclass(frozen=True)
class Caller:
    """Who is calling: the actor recorded by services and the resource a key is pinned to."""

    actor: str
    pinned_resource_id: str | None = None
    key_id: int | None = None


ANONYMOUS = Caller(actor="api:anonymous")


class ApiKeyAuth(APIKeyHeader):
    param_name = "x-api-key"

    def authenticate(self, request: HttpRequest, key: str | None) -> Caller | None:
        api_key = selectors.api_key_for_raw(key.strip()) if key else None
        if api_key is None:
            # With auth off a stray key (LANGSMITH_API_KEY is sent by the SDK whenever it is
            # set in the environment) must not lock the caller out.
            return None if settings.RUNS_API_AUTH else ANONYMOUS
        services.api_key_touch(key=api_key)
        return Caller(
            actor=f"api:{api_key.name}",
            pinned_resource_id=api_key.resource_id,
            key_id=api_key.id,
        )


api_key_auth = ApiKeyAuth()


def caller_of(request: HttpRequest) -> Caller:
    auth: Any = getattr(request, "auth", None)
    return auth if isinstance(auth, Caller) else ANONYMOUS
