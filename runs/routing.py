from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.urls import path

from runs import consumers

if TYPE_CHECKING:
    from channels.consumer import _ASGIApplicationProtocol
    from channels.routing import URLRouter, _ExtendedURLPattern


def _ws(route: str, app: _ASGIApplicationProtocol) -> _ExtendedURLPattern:
    # django-stubs types path() for HTTP views only; Channels' URLRouter routes ASGI apps with it.
    return cast("_ExtendedURLPattern", path(route, app))  # type: ignore[arg-type]


websocket_urlpatterns: list[_ExtendedURLPattern | URLRouter] = [
    _ws("ws/runs/", consumers.RunsConsumer.as_asgi()),
    _ws("ws/runs/<uuid:run_id>/", consumers.RunConsumer.as_asgi()),
    _ws("ws/threads/<uuid:thread_id>/", consumers.RunsConsumer.as_asgi()),
]
