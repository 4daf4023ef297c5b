"""Sockets that share renders flush together (runs/live_groups.py), with members standing in for
the consumers: when a group flushes, what it renders, and who receives it."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from runs import live_groups


class Member:
    def __init__(self, page: str = "p1", log: list[tuple[str, list[str]]] | None = None) -> None:
        self.pending: dict[str, dict[str, Any]] = {}
        self.closed = False
        self.page = page  # what the page shows: members showing different rows render apart
        self.renders = log if log is not None else []
        self.received: list[tuple[float, str]] = []
        self.adopted: Any = None
        self.held = False  # its page is behind on its frames (runs/consumers.py FLOW_WINDOW)
        self.told: list[dict[str, Any]] = []

    def blocked(self) -> bool:
        return self.held

    def hear(self, change: str | dict[str, Any]) -> None:
        # A run id queued by the test itself, or what the group hands on (the hub's resync).
        if isinstance(change, str):
            self.pending[change] = {"run_id": change}
        else:
            self.told.append(change)

    def cache_key(self, changes: list[dict[str, Any]]) -> tuple:
        return (self.page, tuple(sorted(c["run_id"] for c in changes)))

    def render_state(self) -> str:
        return self.page

    def render_shared(self, changes: list[dict[str, Any]]) -> tuple[str, Any]:
        assert threading.current_thread() is not threading.main_thread()  # off the loop
        ids = sorted(c["run_id"] for c in changes)
        self.renders.append((self.page, ids))
        return f"{self.page}:{','.join(ids)}", {"page": self.page}

    def adopt(self, state: Any) -> None:
        self.adopted = state

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        self.received.append((asyncio.get_running_loop().time(), str(text_data)))


def key() -> tuple:
    return ("runs", str(uuid.uuid4()))


async def settle(group: live_groups.Group) -> None:
    while group.task is not None:
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _no_database_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    # The members render nothing from the database: skip channels' connection housekeeping.
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)


async def test_members_with_the_same_batch_share_one_render_and_the_same_bytes() -> None:
    log: list[tuple[str, list[str]]] = []
    group_key = key()
    members = [Member(log=log) for _ in range(3)]
    group = None
    for member in members:
        group = live_groups.join(group_key, 0.05, member)
        member.hear("r1")
        member.hear("r2")
        group.wake()
    assert group is not None
    await settle(group)
    assert log == [("p1", ["r1", "r2"])]
    assert [m.received[0][1] for m in members] == ["p1:r1,r2"] * 3
    assert all(m.adopted == {"page": "p1"} for m in members)


async def test_the_cache_key_is_computed_once_per_run_of_members_with_the_same_batch() -> None:
    """Members heard the same changes: a member whose batch and rows shown equal the one
    before it takes that one's key (200 sockets: not 200 keys per flush). A member that differs
    computes its own; one after it that matches the first still shares the first's render."""
    log: list[tuple[str, list[str]]] = []
    group_key = key()
    keys_computed: list[str] = []
    members = [Member(log=log) for _ in range(4)]
    members[2].page = "p2"
    for member in members:
        compute = member.cache_key

        def counted(changes: list[dict[str, Any]], compute: Any = compute) -> tuple:
            keys_computed.append("k")
            return compute(changes)

        member.cache_key = counted  # type: ignore[method-assign]
    group = None
    for member in members:
        group = live_groups.join(group_key, 0.05, member)
        member.hear("r1")
    assert group is not None
    group.wake()
    await settle(group)
    assert sorted(log) == [("p1", ["r1"]), ("p2", ["r1"])]
    assert [m.received[0][1] for m in members] == ["p1:r1", "p1:r1", "p2:r1", "p1:r1"]
    # Iteration order over the members is a set's: at most one key per change of state.
    assert len(keys_computed) <= 3  # each computed its own before: 4


async def test_a_held_member_keeps_its_batch_and_the_group_stops_until_it_is_released() -> None:
    log: list[tuple[str, list[str]]] = []
    group_key = key()
    held, free = Member(log=log), Member(log=log)
    held.held = True
    for member in (held, free):
        group = live_groups.join(group_key, 0.05, member)
        member.hear("r1")
        group.wake()
    await settle(group)  # ends: only a held member has a batch, nothing to wait on
    assert log == [("p1", ["r1"])] and held.received == [] and free.received
    held.hear("r2")
    group.wake()
    await settle(group)
    assert held.received == [] and set(held.pending) == {"r1", "r2"}
    held.held = False  # its page acknowledged: the consumer wakes the group
    group.wake()
    await settle(group)
    assert [text for _, text in held.received] == ["p1:r1,r2"] and held.pending == {}


class Hub:
    """The process's hub as a group meets it: listeners per group name (runs/hub.py)."""

    def __init__(self) -> None:
        self.listeners: dict[str, list[Any]] = {}

    def listen(self, group: str, listener: Any) -> None:
        self.listeners.setdefault(group, []).append(listener)

    def unlisten(self, group: str, listener: Any) -> None:
        self.listeners[group].remove(listener)

    def publish(self, change: dict[str, Any]) -> None:
        for listener in list(self.listeners.get("runs", ())):
            listener(change)


def change(run_id: str, seq: int, status: str = "running", resource: str = "") -> dict[str, Any]:
    return {"run_id": run_id, "seq": seq, "status": status, "resource_id": resource}


async def test_a_tapped_group_hears_once_for_its_members_and_renders_once_for_them() -> None:
    log: list[tuple[str, list[str]]] = []
    hub, group_key = Hub(), key()
    members = [Member(log=log) for _ in range(3)]
    for member in members:
        group = live_groups.join(group_key, 0.05, member)
        group.tap(hub, ["runs"], lambda resource: resource != "other-tenant")
    assert len(hub.listeners["runs"]) == 1
    hub.publish(change("r1", 1))
    hub.publish(change("r1", 2, "suspended"))
    hub.publish(change("r9", 1, resource="other-tenant"))  # outside the members' scope
    await settle(group)
    assert log == [("p1", ["r1"])]
    assert [m.received[0][1] for m in members] == ["p1:r1"] * 3
    assert group.pending == {}
    for member in members:
        live_groups.leave(group, member)
    assert hub.listeners["runs"] == []  # the last member gone, the group stops listening


async def test_a_tapped_groups_changes_wait_with_a_held_member_and_go_with_a_leaving_one() -> None:
    log: list[tuple[str, list[str]]] = []
    hub, group_key = Hub(), key()
    held, free, leaving = Member(log=log), Member(log=log), Member(log=log)
    held.held = True
    for member in (held, free, leaving):
        group = live_groups.join(group_key, 0.05, member)
        group.tap(hub, ["runs"], lambda resource: True)
    hub.publish(change("r1", 1))
    hub.publish(change("r1", 2, "suspended"))
    await settle(group)
    # The held member keeps the group's batch, with every status the run went through.
    assert held.received == [] and held.pending["r1"]["seq"] == 2
    assert held.pending["r1"]["statuses"] == {"running", "suspended"}
    held.held = False
    group.wake()
    await settle(group)
    assert [text for _, text in held.received] == ["p1:r1"]
    # A member that leaves before the flush takes what the group heard for it.
    hub.publish(change("r2", 1))
    live_groups.leave(group, leaving)
    assert set(leaving.pending) == {"r2"}
    await settle(group)
    assert [text for _, text in free.received] == ["p1:r1", "p1:r2"]


async def test_a_tapped_group_hands_the_hubs_resync_to_each_member() -> None:
    hub, group_key = Hub(), key()
    members = [Member() for _ in range(2)]
    for member in members:
        group = live_groups.join(group_key, 0.05, member)
        group.tap(hub, ["runs"], lambda resource: True)
    hub.publish({"resync": 12.5})
    assert all(m.told == [{"resync": 12.5}] for m in members)
    assert group.pending == {}


async def test_members_whose_pages_differ_render_apart_in_the_same_flush() -> None:
    log: list[tuple[str, list[str]]] = []
    group_key = key()
    a, b, c = Member("p1", log), Member("p1", log), Member("p2", log)
    for member in (a, b, c):
        group = live_groups.join(group_key, 0.05, member)
        member.hear("r1")
        group.wake()
    await settle(group)
    assert sorted(log) == [("p1", ["r1"]), ("p2", ["r1"])]
    assert a.received[0][1] == b.received[0][1] == "p1:r1"
    assert c.received[0][1] == "p2:r1"


async def test_a_quiet_group_flushes_at_once_and_a_busy_one_an_interval_after_its_last() -> None:
    loop = asyncio.get_running_loop()
    member = Member()
    group = live_groups.join(key(), 0.5, member)
    member.hear("r1")
    group.wake()
    start = loop.time()
    await asyncio.wait_for(settle(group), timeout=0.4)  # did not wait for the interval
    first_at = member.received[0][0]
    member.hear("r2")
    group.wake()
    await settle(group)
    assert [text for _, text in member.received] == ["p1:r1", "p1:r2"]
    assert member.received[1][0] - first_at >= 0.5 - 0.01
    assert first_at - start < 0.4


async def test_a_member_that_hears_a_change_later_flushes_with_the_others() -> None:
    """A member whose first change came while the group was waiting is flushed in the same
    flush as the others, not an interval after its own first change."""
    log: list[tuple[str, list[str]]] = []
    group_key = key()
    early, late = Member(log=log), Member(log=log)
    group = live_groups.join(group_key, 0.4, early)
    live_groups.join(group_key, 0.4, late)
    early.hear("r0")
    group.wake()
    await settle(group)  # flushed just now: the next flush waits the interval
    early.hear("r1")
    group.wake()
    await asyncio.sleep(0.2)
    late.hear("r1")  # e.g. it connected, or was sending, when r1 came
    group.wake()
    await settle(group)
    assert log == [("p1", ["r0"]), ("p1", ["r1"])]
    assert early.received[-1][1] == late.received[-1][1] == "p1:r1"
    # the same flush (on its own the late one would wait 0.4 s after its change)
    assert abs(early.received[-1][0] - late.received[-1][0]) < 0.1


async def test_a_closed_member_is_sent_nothing_and_an_empty_group_is_forgotten() -> None:
    group_key = key()
    open_member, closed_member = Member(), Member()
    group = live_groups.join(group_key, 0.05, open_member)
    live_groups.join(group_key, 0.05, closed_member)
    for member in (open_member, closed_member):
        member.hear("r1")
    closed_member.closed = True
    group.wake()
    await settle(group)
    assert open_member.received and not closed_member.received
    live_groups.leave(group, open_member)
    live_groups.leave(group, closed_member)
    assert group_key not in live_groups._groups


async def test_a_failed_render_does_not_stop_the_group(caplog: pytest.LogCaptureFixture) -> None:
    member = Member()
    calls = {"n": 0}
    original = member.render_shared

    def flaky(changes: list[dict[str, Any]]) -> tuple[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return original(changes)

    member.render_shared = flaky  # type: ignore[method-assign]
    group = live_groups.join(key(), 0.05, member)
    member.hear("r1")
    group.wake()
    await settle(group)
    member.hear("r2")
    group.wake()
    await settle(group)
    assert [text for _, text in member.received] == ["p1:r2"]
    assert "rendering a push failed" in caplog.text


async def test_a_socket_that_cannot_be_written_to_does_not_keep_the_frames_from_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Gone(Member):
        async def send(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
            raise ConnectionResetError("socket gone")

    group_key = key()
    members = [Member(), Gone(), Member()]
    for member in members:
        group = live_groups.join(group_key, 0.05, member)
        member.hear("r1")
    group.wake()
    await settle(group)
    assert members[0].received[0][1] == members[2].received[0][1] == "p1:r1"
    assert "could not be sent to one socket" in caplog.text
