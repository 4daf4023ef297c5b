"""One subscription per process to committed run changes, fanned out in-process.

Every `wait`/`join`/`stream` request, every cancel with `wait=true` and every dashboard socket
must learn when a run changes. Giving each of them its own channel-layer channel costs a
channel, a group join and a leave per request or socket (Redis round trips on the hot path),
one delivery per subscriber for every change (200 sockets on the runs page: 200 deliveries
through Redis), and one receive loop each. Instead each event loop of this process keeps one
channel in the `runs` group (the one group every run change is published to, after commit:
runs/live.py) and hands each change to the local waiters and sockets it concerns: the groups
`runs`, `run.<id>` (and the parent run's) and `thread.<id>` are derived here from the message.

A waiter registers locally before it reads the database (or before the run it waits for is
created), so a change committed between its read and its wait still wakes it. Messages wake;
the database stays the truth (a waiter that hears nothing re-reads it after a short poll). A
message's status lets a waiter that only needs a run's end skip the read of a change that
cannot be one (pending, running), and a change that ends a run may carry the end as the read
would give it (`live.RunChange.outcome`, written by the worker at the commit it follows): a
wait or join answers from it unless it is older than what the waiter read (`heard_outcome`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from runs import live
from runs.models import RunStatus

logger = logging.getLogger("runs.live")

# The Redis pub/sub layer keeps a subscription until it is dropped; the core layer expires group
# membership after a day. Re-joining now and then keeps either kind subscribed for ever.
REJOIN_SECONDS = 600.0
# A join Redis leaves unanswered this long (gone silent without closing the connection) fails:
# the first is tried again by the next waiter (`start`), a re-join at the next REJOIN_SECONDS.
JOIN_TIMEOUT = 5.0

# A hub sends itself a beat this often through the channel layer. The Redis pub/sub layer loses
# what is published while its subscription is down (after its connection drops, channels_redis
# pauses a second before it reads again, and says nothing): a beat not heard back within
# BEAT_SECONDS marks such a gap, and the first one heard after it tells every waiter and socket
# of this loop to read the database again for what changed since (`resync`), instead of waiting
# for a run's next change. (A gap that only delayed messages costs one needless resync.)
BEAT_SECONDS = 1.0
BEAT = "hub.beat"


# A change to one of these statuses cannot end a wait: a waiter that only needs the run's end
# (wait, join) need not read the database for it.
GOING = frozenset({RunStatus.PENDING.value, RunStatus.RUNNING.value})


class _Slot:
    """What the hub sets for one waiter (the waiter itself is not held, so it can be collected)."""

    __slots__ = ("event", "may_have_stopped", "outcome", "seq")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.may_have_stopped = False
        # The newest change heard of the run itself (by its seq) and the outcome it carried.
        self.seq = -1
        self.outcome: tuple[str, int, Any] | None = None


class Waiter:
    """One waiter on a run's changes: `event` is set on every change; `may_have_stopped` once a
    change said something other than pending/running (or said no status)."""

    def __init__(self, hub: Hub, key: str) -> None:
        self._hub = hub
        self._slot = _Slot()
        hub._register(key, self._slot)
        self.close = weakref.finalize(self, hub._discard_from_anywhere, key, self._slot)

    async def __aenter__(self) -> Waiter:
        await self._hub.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    @property
    def event(self) -> asyncio.Event:
        return self._slot.event

    @property
    def may_have_stopped(self) -> bool:
        return self._slot.may_have_stopped

    def heard_outcome(self, floor: int) -> tuple[str, int, Any] | None:
        """(status, attempt, result) of the run's end as the newest change heard of it carried
        (`live.RunChange.outcome`), if that change is not older than `floor`, the run's seq
        when the caller last read it: an older one (from another process, overtaken on the
        way) must not answer for a run that changed since."""
        slot = self._slot
        return slot.outcome if slot.outcome is not None and slot.seq >= floor else None

    def clear(self) -> None:
        """Forget what was heard (before a read of the database, which sees all of it)."""
        self._slot.event.clear()
        self._slot.may_have_stopped = False
        self._slot.outcome = None


class Hub:
    """The run-change fan-out of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: dict[str, set[_Slot]] = defaultdict(set)
        self._listeners: dict[str, set[Callable[[dict[str, Any]], None]]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._failed = False
        # The wall time of the last beat heard back, and of the start of an unhealed gap.
        self._heard_at = 0.0
        self._deaf_since: float | None = None
        self._sent = self._heard_n = 0  # beats sent, the newest heard back

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
            channel = await asyncio.wait_for(self._join(layer), JOIN_TIMEOUT)
        except Exception:
            logger.warning("hub: channel layer unavailable; waiters poll", exc_info=True)
            self._failed = True
            self._ready.set()
            return
        self._ready.set()
        ticking = asyncio.get_running_loop().create_task(self._tick(layer, channel))
        try:
            # Never cancelled but with the hub: channels_redis's pub/sub layer unsubscribes a
            # channel whose receive is cancelled, losing what is published until the next one.
            while True:
                try:
                    message = await layer.receive(channel)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.warning("hub: receive failed; retrying", exc_info=True)
                    await asyncio.sleep(0.5)
                    continue
                if message.get("type") == BEAT:
                    self._heard(int(message.get("n") or 0), float(message.get("at") or 0.0))
                else:
                    for change in live.changes_in(message):
                        self._wake(change)
        finally:
            ticking.cancel()

    @staticmethod
    async def _join(layer: Any) -> str:
        channel = await layer.new_channel()
        await layer.group_add(live.RUNS_GROUP, channel)
        return channel

    async def _tick(self, layer: Any, channel: str) -> None:
        """Beats (not on the in-memory layer, which loses nothing) and re-joins, on a timer."""
        loop = asyncio.get_running_loop()
        beats = not isinstance(layer, InMemoryChannelLayer)
        rejoin_at = loop.time() + REJOIN_SECONDS
        self._heard_at, self._sent, self._heard_n = time.time(), 0, 0
        while True:
            await asyncio.sleep(BEAT_SECONDS if beats else REJOIN_SECONDS)
            if beats:
                if self._sent > self._heard_n and self._deaf_since is None:
                    # The last beat was not heard back within BEAT_SECONDS.
                    self._deaf_since = self._heard_at
                    logger.warning("hub: a beat went unheard; resyncing once the layer answers")
                self._sent += 1
                try:
                    beat = {"type": BEAT, "n": self._sent, "at": time.time()}
                    await asyncio.wait_for(layer.send(channel, beat), BEAT_SECONDS)
                except Exception:
                    logger.warning("hub: sending a beat failed", exc_info=True)
            if loop.time() >= rejoin_at:
                rejoin_at = loop.time() + REJOIN_SECONDS
                with contextlib.suppress(Exception):  # bounded: the beats must go on
                    await asyncio.wait_for(layer.group_add(live.RUNS_GROUP, channel), JOIN_TIMEOUT)

    def _heard(self, n: int, sent_at: float) -> None:
        """Beat `n` came back (sent at `sent_at`): ends a gap, if there was one, with a resync."""
        self._heard_n = max(self._heard_n, n)
        since = self._deaf_since
        self._deaf_since = None
        self._heard_at = max(self._heard_at, sent_at)
        if since is not None:
            self.resync(since)

    def resync(self, since: float) -> None:
        """What was published since `since` (wall time) may have been lost: every waiter reads
        the database again, and every socket is told to (`listener({"resync": since})`)."""
        logger.info("hub: resyncing %d waiters and every socket", self.waiting())
        for slots in self._waiters.values():
            for slot in slots:
                slot.may_have_stopped = True
                slot.event.set()
        told: set[Callable[[dict[str, Any]], None]] = set()
        for listeners in list(self._listeners.values()):
            for listener in list(listeners):
                if listener in told:
                    continue
                told.add(listener)
                try:
                    listener({"resync": since})
                except Exception:
                    logger.exception("hub: a listener failed to resync")

    def _wake(self, message: dict[str, Any]) -> None:
        going = message.get("status") in GOING
        run_id, seq = message.get("run_id"), message.get("seq")
        for key in (run_id, message.get("parent_run_id")):
            if key:
                for slot in self._waiters.get(str(key), ()):
                    slot.event.set()
                    if not going:
                        slot.may_have_stopped = True
                    if key == run_id and isinstance(seq, int) and seq >= slot.seq:
                        slot.seq = seq
                        slot.outcome = (
                            (message["status"], message["attempt"], message["outcome"])
                            if message.get("outcome") is not None
                            else None
                        )
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

    def watch(self, run_id: Any) -> Waiter:
        """A waiter on `run_id` (and its sub-agent runs), registered now, before anything is
        read: a change committed from here on wakes it. Use it as `async with` (which joins the
        channel layer first), or `start()` the hub and `close()` it yourself; a waiter that is
        garbage-collected unregisters itself."""
        return Waiter(self, str(run_id))

    def _register(self, key: str, slot: _Slot) -> None:
        self._waiters[key].add(slot)

    def _discard_from_anywhere(self, key: str, slot: _Slot) -> None:
        # A waiter is closed on the loop, or garbage-collected on whichever thread the
        # collector ran: the waiter sets are only changed on the loop's thread.
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self._loop:
            self._discard(key, slot)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits
                self._loop.call_soon_threadsafe(self._discard, key, slot)

    def _discard(self, key: str, slot: _Slot) -> None:
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(slot)
            if not waiters:
                del self._waiters[key]

    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())

    def listening(self, group: str) -> int:
        """How many listeners hear `group` (a list's sockets that share renders count once)."""
        return len(self._listeners.get(group, ()))


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """The hub of the running event loop (Daphne has one; tests may start several)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub(loop)
    return found
