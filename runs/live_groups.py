"""Sockets of one process that show the same list to users with the same permissions, flushed
together: one timer, one snapshot of their batches, one render per distinct batch, the same
bytes sent to each.

Each socket timing its own batch from its own first message drifts apart from the others (one
was still sending when a change came, one connected later). Their batches then differ, each
renders on its own, the renders queue behind each other on the one database thread and the
sockets drift further: under load (200 sockets) every socket ended up rendering for itself,
seconds behind. A group takes every member's batch at the same moment instead, so members that
show the same rows render once between them.

Timing: a group that has not flushed for `interval` seconds flushes on the next turn of the loop
(a change on a quiet page is pushed at once); a busy one `interval` seconds after its last flush
ended, with everything that came meanwhile (renders slower than the changes come do not run back
to back). The consumer (runs/consumers.py) says which sockets share a group (`share_key`) and
renders; this module only times, groups and sends.

Hearing: a group hears its members' changes once (`tap`: one listener on the process's hub for
all of them) and keeps one batch for all (`pending`); each member keeps only what is its own (a
page's catch-up, or what it kept while its page was behind). The hub handed every change to
every list socket, each merging it into its own batch: under bench/load.py, 100 sockets a
process, ~13 % of a web process's CPU.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol

from channels.db import database_sync_to_async

logger = logging.getLogger("runs.consumers")

Frames = str | list[str]


def merge_change(pending: dict[str, dict[str, Any]], change: dict[str, Any]) -> None:
    """Add `change` to a batch: the latest message per run, with every status the run went
    through meanwhile (a run can suspend and resume within one batch: the inbox must still hear
    of it). `change` is not modified; the batch keeps its own copies."""
    run_id = str(change.get("run_id"))
    statuses = {str(change.get("status")), *change.get("statuses", ())}
    previous = pending.get(run_id)
    if previous is None:
        pending[run_id] = {**change, "statuses": statuses}
    elif int(change.get("seq") or 0) >= int(previous.get("seq") or 0):
        pending[run_id] = {**change, "statuses": statuses | previous["statuses"]}
    else:
        previous["statuses"] |= statuses


class Member(Protocol):
    """A socket of a group (runs/consumers.py `_BatchingConsumer`)."""

    pending: dict[str, dict[str, Any]]
    closed: bool

    def hear(self, event: dict[str, Any]) -> None: ...

    def cache_key(self, changes: list[dict[str, Any]]) -> Hashable: ...

    def render_state(self) -> Hashable: ...

    def render_shared(self, changes: list[dict[str, Any]]) -> tuple[Frames, Any]: ...

    def adopt(self, state: Any) -> None: ...

    def blocked(self) -> bool: ...

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None: ...


class Group:
    """The members of one `share_key` in this process, and the task that flushes them."""

    def __init__(self, key: Hashable, interval: float) -> None:
        self.key = key
        self.interval = interval
        self.members: set[Member] = set()
        self.last_flush = -math.inf
        self.task: asyncio.Task[None] | None = None
        # What the group heard for every member since its last flush (`tap`).
        self.pending: dict[str, dict[str, Any]] = {}
        self._tapped: tuple[Any, list[str]] | None = None
        self._allows: Callable[[Any], bool] = lambda resource_id: True

    def tap(self, hub: Any, groups: list[str], allows: Callable[[Any], bool]) -> None:
        """Hear `groups` on `hub` once for every member (members that listen through the group
        do not listen themselves). `allows(resource_id)`: the members' tenant scope, theirs
        alike (it is part of the group's key)."""
        if self._tapped is None:
            self._tapped, self._allows = (hub, list(groups)), allows
            for name in groups:
                hub.listen(name, self.hear)

    def untap(self) -> None:
        if self._tapped is not None:
            hub, groups = self._tapped
            self._tapped = None
            for name in groups:
                hub.unlisten(name, self.hear)

    def hear(self, event: dict[str, Any]) -> None:
        """A change for every member (dropped unread outside their scope), or the hub's word to
        resync, which each member reads for itself (sharing the read: `read_once`)."""
        if "resync" in event:
            for member in list(self.members):
                member.hear(event)
        elif self._allows(event.get("resource_id")):
            merge_change(self.pending, event)
            self.wake()

    def wake(self) -> None:
        """A member has a change pending: flush (now or after the interval)."""
        if self.task is None:
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # A held member (runs/consumers.py FLOW_WINDOW) keeps its batch; its page's next
            # acknowledgement wakes the group again.
            while self.pending or any(
                member.pending and not member.blocked() for member in self.members
            ):
                # Even when due now, a turn of the loop passes first: every member has heard the
                # change that woke the group (the hub hands a change to all of them in one call).
                await asyncio.sleep(max(0.0, self.last_flush + self.interval - loop.time()))
                await self.flush()
                self.last_flush = loop.time()
        finally:
            self.task = None
            if not self.members and _groups.get(self.key) is self:
                del _groups[self.key]

    async def flush(self) -> None:
        """Take every member's batch at once; render each distinct one once; send it to each
        member that had it."""
        batches: dict[Hashable, tuple[list[dict[str, Any]], list[Member]]] = {}
        shared, self.pending = self.pending, {}
        # Most members have nothing of their own: their batch is the group's, one object. A
        # member whose batch and render state equal the one before it shares that one's key
        # without computing it (a member's cache key depends on nothing else: the group's key
        # is theirs alike).
        before: tuple[dict[str, dict[str, Any]], Hashable, Hashable] | None = None
        for member in list(self.members):
            if member.blocked():
                # Its page is behind: it keeps the group's changes with its own until released.
                for change in shared.values():
                    merge_change(member.pending, change)
                continue
            if member.pending:
                pending, member.pending = member.pending, {}
                for change in shared.values():
                    merge_change(pending, change)
            elif shared:
                pending = shared
            else:
                continue
            state = member.render_state()
            if (
                before is not None
                and (pending is before[0] or pending == before[0])
                and state == before[1]
            ):
                key = before[2]
            else:
                key = member.cache_key(list(pending.values()))
                before = (pending, state, key)
            batches.setdefault(key, (list(pending.values()), []))[1].append(member)
        for changes, members in batches.values():
            try:
                frames, state = await database_sync_to_async(members[0].render_shared)(changes)
            except Exception:
                # A failed render must not stop the group: the pages re-fetch on the next change
                # (or their poll) and the error is in the log.
                logger.exception("live: rendering a push failed")
                continue
            for member in members:
                member.adopt(state)
                if not member.closed:
                    await send_frames(member, frames)


async def send_frames(member: Member, frames: Frames) -> None:
    """Send one socket its frames in order (a push may be several, swapped one at a time)."""
    try:
        for frame in [frames] if isinstance(frames, str) else frames:
            if frame:
                await member.send(text_data=frame)
    except Exception:
        # One socket that cannot be written to (it is going away) must not keep the frames
        # from the others; its own disconnect removes it from the group.
        logger.warning("live: a push could not be sent to one socket", exc_info=True)


_groups: dict[Hashable, Group] = {}
# Reads in flight that sockets of this process share (`read_once`), by what they depend on.
_reads: dict[Hashable, asyncio.Future[Any]] = {}


async def read_once(key: Hashable, read: Callable[[], Awaitable[Any]]) -> Any:
    """`read()`'s result, read once for every socket that asks with the same `key` while it is
    in flight: after a gap in the layer the hub tells every socket to resync in one call, and
    the sockets that show the same list would each read the same changes from the database
    (200 sockets: 200 reads at once). A failed read fails every sharer alike."""
    pending = _reads.get(key)
    if pending is None:
        pending = _reads[key] = asyncio.ensure_future(read())
        pending.add_done_callback(lambda _: _reads.pop(key, None))
    # A sharer that goes away must not cancel the read the others wait for.
    return await asyncio.shield(pending)


def join(key: Hashable, interval: float, member: Member) -> Group:
    group = _groups.get(key)
    if group is None:
        group = _groups[key] = Group(key, interval)
    group.members.add(member)
    return group


def leave(group: Group, member: Member) -> None:
    """`member` leaves; it takes what the group heard for it and has not flushed yet (a member
    that leaves to render on its own must not lose it)."""
    group.members.discard(member)
    for change in group.pending.values():
        merge_change(member.pending, change)
    if not group.members:
        group.untap()
        group.pending = {}
        if group.task is None and _groups.get(group.key) is group:
            del _groups[group.key]
