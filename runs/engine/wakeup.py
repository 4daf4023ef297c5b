"""In-process wake-ups for workers living in the same process as the code that changed a run.

PostgreSQL workers in other processes wake on pg_notify; a worker embedded in the server
(SQLite default) has no NOTIFY, so services also poke it directly after commit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

_lock = threading.Lock()
_listeners: list[Any] = []


def register(listener: Any) -> None:
    """`listener` has `wake()` and `cancel_requested(run_ids)`."""
    with _lock:
        _listeners.append(listener)


def unregister(listener: Any) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


def _each(fn: Callable[[Any], None]) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        fn(listener)


def wake() -> None:
    _each(lambda w: w.wake())


def cancel_requested(run_ids: Iterable[str]) -> None:
    ids = list(run_ids)
    _each(lambda w: w.cancel_requested(ids))
