"""One subscription per process to committed run changes, fanned out in-process.

Every `wait`/`join`/`stream` request, every cancel with `wait=true` and every dashboard socket
must learn when a run changes. Giving each of them its own channel-layer channel costs a
channel, a group join and a leave per request or socket (Redis round trips on the hot path),
one delivery per subscriber for every change (200 sockets on the runs page: 200 deliveries
through Redis), and one receive loop each. Instead each event loop of this process keeps one
channel in the `runs` group (the one group every run change is published to, after commit:
runs/live.py) and hands each change to the local waiters and sockets it concerns: the groups
`runs`, `run.<id>` (and the parent run's) and `thread.<id>` are derived here from the message.

A waiter registers locally before it reads the database, so a change committed between its
read and its wait still wakes it. Messages only wake; the database stays the truth (a waiter
that hears nothing re-reads it after a short poll).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from typing import Any

from channels.layers import get_channel_layer

from runs import live

logger = logging.getLogger("runs.live")

# The Redis pub/sub layer keeps a subscription until it is dropped; the core layer expires group
# membership after a day. Re-joining now and then keeps either kind subscribed for ever.
REJOIN_SECONDS = 600.0


class Hub:
    """The run-change fan-out of one event loop."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._listeners: dict[str, set[Callable[[dict[str, Any]], None]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._failed = False

    async def start(self) -> bool:
        """Join the `runs` group once; False when there is no usable channel layer."""
        if self._task is None or self._task.done():
            # First use on this loop, or the last attempt found no usable layer: (re)join.
            self._ready = asyncio.Event()
            self._failed = False
            self._task = asyncio.get_running_loop().create_task(self._pump())
        if not self._ready.is_set():
            await self._ready.wait()
        return not self._failed

    async def _pump(self) -> None:
        layer = get_channel_layer()
        if layer is None:
            self._failed = True
            self._ready.set()
            return
        try:
            channel = await layer.new_channel()
            await layer.group_add(live.RUNS_GROUP, channel)
        except Exception:
            logger.warning("hub: channel layer unavailable; waiters poll", exc_info=True)
            self._failed = True
            self._ready.set()
            return
        self._ready.set()
        loop = asyncio.get_running_loop()
        rejoin_at = loop.time() + REJOIN_SECONDS
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), timeout=REJOIN_SECONDS)
            except TimeoutError:
                message = None
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("hub: receive failed; retrying", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            if message is not None:
                self._wake(message)
            if loop.time() >= rejoin_at:
                rejoin_at = loop.time() + REJOIN_SECONDS
                with contextlib.suppress(Exception):
                    await layer.group_add(live.RUNS_GROUP, channel)

    def _wake(self, message: dict[str, Any]) -> None:
        for key in (message.get("run_id"), message.get("parent_run_id")):
            if key:
                for event in self._waiters.get(str(key), ()):
                    event.set()
        if not self._listeners:
            return
        for group in live.groups_of(message):
            for listener in list(self._listeners.get(group, ())):
                try:
                    listener(message)
                except Exception:  # one socket's failure must not starve the others
                    logger.exception("hub: a listener of %s failed", group)

    def listen(self, group: str, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener(message)` for every change published to `group` (sockets)."""
        self._listeners[group].add(listener)

    def unlisten(self, group: str, listener: Callable[[dict[str, Any]], None]) -> None:
        listeners = self._listeners.get(group)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._listeners[group]

    @contextlib.asynccontextmanager
    async def watch(self, run_id: Any) -> AsyncIterator[asyncio.Event]:
        """An event set whenever `run_id` (or a sub-agent run of it) changes."""
        key = str(run_id)
        event = asyncio.Event()
        self._waiters[key].add(event)
        try:
            await self.start()
            yield event
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The hub of the running event loop (Daphne has one; tests may start several)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    return found
