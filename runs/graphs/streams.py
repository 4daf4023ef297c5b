"""A graph's own stream → run events (kind "graph") → LangGraph SSE frames.

The worker records the chunks of `graph.astream(stream_mode=[…])`: values, updates and custom
always (the dashboard's timeline), messages/debug/tasks/checkpoints when the run asked for them.
Interrupts are left out of the chunks: the run's `suspended` event carries them, and
runs/api/streaming.frames_for turns it into `updates`/`values` `__interrupt__` frames.
"""

from __future__ import annotations

from typing import Any

from runs.graphs.jsonable import to_json

ALWAYS = ("values", "updates", "custom")
ON_REQUEST = ("messages", "debug", "tasks", "checkpoints")


def recorded_modes(requested: Any) -> list[str]:
    asked = set(requested if isinstance(requested, list) else [requested] if requested else [])
    if not asked:
        asked = {"values"}
    if asked & {"messages-tuple", "events"}:
        asked.add("messages")
    return [*ALWAYS, *(m for m in ON_REQUEST if m in asked)]


def event_of(ns: tuple[str, ...], mode: str, chunk: Any) -> tuple[str, dict[str, Any], str] | None:
    """The run event for one stream chunk (None: nothing to record)."""
    if mode in ("updates", "values") and isinstance(chunk, dict) and "__interrupt__" in chunk:
        chunk = {k: v for k, v in chunk.items() if k != "__interrupt__"}
        if not chunk and mode == "updates":
            return None
    if mode == "messages":
        message, metadata = chunk
        data: Any = [to_json(message), to_json(metadata)]
    else:
        data = to_json(chunk)
    event: dict[str, Any] = {"mode": mode, "data": data}
    if ns:
        event["ns"] = list(ns)
    return ("graph", event, "system")


def frames(data: dict[str, Any], modes: list[str], seq: int) -> list[tuple[str, Any]]:
    """The SSE (event, data) pairs of one recorded chunk under the requested modes."""
    want = set(modes) if modes else {"values"}
    mode, chunk, ns = data.get("mode"), data.get("data"), data.get("ns")
    suffix = "|" + "|".join(ns) if ns else ""
    out: list[tuple[str, Any]] = []
    if mode == "messages":
        if "messages-tuple" in want:
            out.append(("messages" + suffix, chunk))
        if "messages" in want:
            out.append(("messages/partial" + suffix, [(chunk or [None])[0]]))
    elif mode in want:
        out.append((mode + suffix, chunk))
    if "events" in want:
        out.append(("events", {"event": f"on_{mode}", "seq": seq, "data": chunk}))
    return out
