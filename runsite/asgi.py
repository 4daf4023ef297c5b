"""ASGI entry point: HTTP (Django) and websockets (Channels) in one application.

With RUNS_EMBEDDED_WORKER=1 (the `make run` demo) a worker runs inside this process, so one
command serves everything on the SQLite default.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, cast

from asgiref.typing import (
    ASGI3Application,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    Scope,
)
from django.core.asgi import get_asgi_application

if TYPE_CHECKING:
    from runs.engine.worker import Worker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs apps loaded)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from runs import heap, live  # noqa: E402
from runs.routing import websocket_urlpatterns  # noqa: E402
from runsite import server_tuning, warmup  # noqa: E402
from runsite.handlers import API_PREFIX, ApiHandler  # noqa: E402

server_tuning.apply()  # Daphne's per-request work nothing reads (runsite/server_tuning.py)
warmup.warm_up()  # URLs and templates loaded before the first request (runsite/warmup.py)
warmup.warm_up_database()  # the bulk cancel planned on the pool's first connection (same)


# django-stubs types the handler's own signature more narrowly than asgiref's protocol.
_api_app = cast(ASGI3Application, ApiHandler(threads=settings.RUNS_API_THREADS))

_router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)


async def _lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """ASGI's lifespan protocol, for servers that speak it (uvicorn; Daphne does not). Start-up
    has nothing to do (everything is loaded at import); at shutdown the embedded worker gives its
    runs back before the server exits (Daphne's exit reaches the same through an exit hook)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _embedded_worker is not None:
                from runs.engine.worker import stop_embedded_worker

                await asyncio.to_thread(stop_embedded_worker, _embedded_worker)
            await send({"type": "lifespan.shutdown.complete"})
            return


async def application(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    # Publishes from worker threads must reach the in-memory channel layer on this loop.
    live.bind_server_loop(asyncio.get_running_loop())
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        await _router(scope, receive, send)
        return
    # Expose the client's disconnect to views (request.scope): a streaming view whose client
    # left before its body started must still cancel the run it created (on_disconnect=cancel).
    disconnected = asyncio.Event()

    async def watched_receive() -> ASGIReceiveEvent:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
        return message

    # ASGI lets a server add its own keys to a scope; the TypedDicts do not list them.
    extended = cast(Scope, {**scope, "runsite.disconnected": disconnected})
    if scope["path"].startswith(API_PREFIX):
        await _api_app(extended, watched_receive, send)
        return
    await _router(extended, watched_receive, send)


_embedded_worker: Worker | None = None
if settings.RUNS_EMBEDDED_WORKER:
    from runs.engine.worker import start_embedded_worker

    _embedded_worker = start_embedded_worker()

# Last: everything the process serves with is loaded (runs/heap.py).
heap.freeze_heap()
