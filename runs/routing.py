from __future__ import annotations

from django.urls import path

from runs import consumers

websocket_urlpatterns: list = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", consumers.RunConsumer.as_asgi()),
    path("ws/threads/<uuid:thread_id>/", consumers.RunsConsumer.as_asgi()),
]
