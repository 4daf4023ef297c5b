"""What this process last knew a thread's metadata to be: a hint for creating a run on the
thread in one statement (`runs._create_at_once`), never an answer.

A run's creation needs its thread's metadata before it writes: the run's search document
holds it, and the run stamps `graph_id` and `assistant_id` into it. Read under the thread's
lock, that is a round trip of its own before the write. With a hint, the one statement locks
the thread, compares the hint with the row it locked, and writes only when they are equal; a
thread that holds anything else (changed by another process, or since) takes the full path,
whose reads follow its lock. So a wrong or old hint costs one round trip, and is never written
or shown to anyone.

Kept as PostgreSQL returns a `jsonb` object (keys shorter first, then by their bytes), so that
what is built from a hint is what the full path builds from the row it reads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any
from uuid import UUID

from runs.contracts import JSONObject

# Threads this process touched last; a hint is a few hundred bytes.
_LIMIT = 4096

_lock = threading.Lock()
_known: OrderedDict[UUID, JSONObject] = OrderedDict()


def _as_stored(value: Any) -> Any:
    """A JSON value with its objects' keys in `jsonb`'s order."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _as_stored(value[k]) for k in keys}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    return value


def remember(thread_id: UUID, metadata: JSONObject) -> None:
    """The thread's metadata as just committed (or about to be, by the caller's transaction:
    a hint that turns out wrong only costs a round trip)."""
    if not isinstance(metadata, dict) or any(not isinstance(k, str) for k in metadata):
        return
    stored = _as_stored(metadata)
    with _lock:
        _known[thread_id] = stored
        _known.move_to_end(thread_id)
        while len(_known) > _LIMIT:
            _known.popitem(last=False)


def recall(thread_id: UUID) -> JSONObject | None:
    with _lock:
        return _known.get(thread_id)
