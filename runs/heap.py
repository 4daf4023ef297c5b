"""The start-up heap set aside from the garbage collector, in web and worker processes."""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_heap() -> int:
    """Set every object alive at the end of start-up (modules, classes, the URL map, compiled
    templates, settings: ~160,000 objects in a web process) aside from the garbage collector
    (`gc.freeze`), once, when the process has loaded what it serves with.

    Python's full collections traverse every tracked object. Under load a web process made one
    or two a minute, each a pause of its whole event loop of ~200-300 ms here (no socket pushed,
    no request answered meanwhile); with the start-up heap frozen, 30-60 ms (docs/benchmarks.md,
    bench/gc_pause.py). What is frozen is never collected: it is what the process keeps for its
    whole life anyway. Returns how many objects are frozen."""
    started = time.monotonic()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.debug(
        "start-up heap: %d objects frozen in %.0f ms", frozen, (time.monotonic() - started) * 1e3
    )
    return frozen
