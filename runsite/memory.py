"""How many malloc arenas glibc keeps for a web process.

glibc gives each thread that allocates concurrently an arena of its own, up to eight per core,
and hands freed memory back to the arena, not to the system. A web process runs requests on
many threads (the API's thread pool, Django's per-request threads for asynchronous views, the
database pool's workers), so under load its memory grows with the number of arenas it has
touched, not with what it holds. Two arenas keep it near what it holds (docs/benchmarks.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util

from django.core.exceptions import ImproperlyConfigured

M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(count: int, *, explicit: bool) -> bool:
    """Cap glibc's arenas at `count` (0: glibc's default). Without glibc an explicit setting
    is refused and the default is skipped. True when the cap took effect."""
    if count == 0:
        return False
    mallopt = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt", None)
    if mallopt is None or not mallopt(M_ARENA_MAX, count):
        if explicit:
            raise ImproperlyConfigured(
                "RUNS_MALLOC_ARENAS is set but this C library has no mallopt(M_ARENA_MAX); "
                "unset it (or set 0)"
            )
        return False
    return True
