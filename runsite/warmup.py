"""Warm-up of a web process: the work its first request and first live push would pay.

Daphne (like any ASGI server) imports the URLconf on the first HTTP request that resolves a
path, and Django's cached template loader compiles each template on its first render. The first
API request after a start therefore imported every view, ninja's API and the admin (~200 ms
here), and the first push to the dashboard's sockets, which need `reverse()` but no request,
took ~250 ms instead of ~5 ms (docs/benchmarks.md). `warm_up()` does both when the ASGI
application loads (runsite/asgi.py), before the server accepts a connection.

`warm_up_database()` then plans, on the connection the pool will lend first, the statements of
the one API request too rare to have run on it before it is needed: the bulk cancel (support's
"stop them all"), whose cold statements took ~7 ms to parse and plan (docs/benchmarks.md). The
statements every run makes plan themselves on their first use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.template import TemplateDoesNotExist, TemplateSyntaxError
from django.template.loader import get_template
from django.urls import get_resolver

from runs import services

logger = logging.getLogger(__name__)


def warm_up() -> int:
    """Import the URLconf and build its reverse map; compile the project's templates. Returns
    how many templates were compiled. A template that fails to compile is logged, not raised:
    it fails on its own page as it would have without the warm-up."""
    started = time.monotonic()
    get_resolver().reverse_dict  # noqa: B018 - reading it imports the URLconf and fills the map
    compiled = 0
    folders = [Path(d) for d in cast(list[Any], settings.TEMPLATES[0]["DIRS"])]
    for folder in folders:
        for path in sorted(folder.rglob("*.html")):
            name = path.relative_to(folder).as_posix()
            try:
                get_template(name)
            except (TemplateDoesNotExist, TemplateSyntaxError):
                logger.exception("warm-up: template %s does not compile", name)
                continue
            compiled += 1
    logger.debug("warm-up: %d templates in %.0f ms", compiled, (time.monotonic() - started) * 1e3)
    return compiled


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def warm_up_database() -> bool:
    """Plan the API's bulk cancel (`services.bulk_cancel_planned`, which changes nothing) on a
    pooled connection, then give it back to the pool, which lends it first (runsite/dbpool.py).
    Returns whether it did. Any failure (the database down or not migrated yet) is logged and
    the server starts all the same: the first bulk cancel then plans its statements itself.
    Nothing either where the application is loaded on a running event loop (a test importing
    it in an async test), where Django refuses a database call."""
    if connection.vendor != "postgresql" or connection.in_atomic_block or _on_event_loop():
        return False
    started = time.monotonic()
    try:
        services.bulk_cancel_planned()
    except Exception:
        logger.warning("warm-up: the bulk cancel's statements not planned", exc_info=True)
        return False
    finally:
        connection.close()  # back to the pool
    logger.debug("warm-up: bulk cancel planned in %.0f ms", (time.monotonic() - started) * 1e3)
    return True
