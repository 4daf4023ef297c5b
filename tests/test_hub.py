"""The per-process hub: one channel-layer subscription, fanned out to local waiters."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.layers import get_channel_layer

from runs import live
from runs.hub import hub


def change(run_id: str, parent: str | None = None) -> live.RunChange:
    return live.RunChange(
        run_id=run_id,
        thread_id=None,
        agent_id="echo",
        status="running",
        seq=1,
        parent_run_id=parent,
    )


async def test_a_published_change_wakes_only_the_waiters_of_that_run() -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    async with hub().watch(a) as woken_a, hub().watch(b) as woken_b:
        await live._send(change(a))
        await asyncio.wait_for(woken_a.wait(), timeout=2)
        assert not woken_b.is_set()


async def test_a_sub_agent_change_wakes_its_parent_waiters() -> None:
    parent, child = str(uuid.uuid4()), str(uuid.uuid4())
    async with hub().watch(parent) as woken:
        await live._send(change(child, parent=parent))
        await asyncio.wait_for(woken.wait(), timeout=2)


async def test_waiters_share_one_subscription_per_loop() -> None:
    layer = get_channel_layer()
    groups_before = len(getattr(layer, "groups", {}).get(live.RUNS_GROUP, {}))
    ids = [str(uuid.uuid4()) for _ in range(20)]
    async with watching_all(ids) as events:
        assert hub().waiting() == 20
        if hasattr(layer, "groups"):  # the in-memory layer shows its members
            members = len(layer.groups.get(live.RUNS_GROUP, {}))
            assert members - groups_before <= 1
        await live._send(change(ids[7]))
        await asyncio.wait_for(events[7].wait(), timeout=2)
    assert hub().waiting() == 0


class watching_all:  # noqa: N801 - reads like the context manager it is
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.managers = [hub().watch(i) for i in ids]

    async def __aenter__(self) -> list[asyncio.Event]:
        return [await m.__aenter__() for m in self.managers]

    async def __aexit__(self, *exc: object) -> None:
        for m in self.managers:
            await m.__aexit__(None, None, None)


@pytest.mark.postgres
async def test_it_works_over_redis_too(settings) -> None:
    # CI runs the suite twice: with REDIS_URL this is the pub/sub layer across processes.
    a = str(uuid.uuid4())
    async with hub().watch(a) as woken:
        await live._send(change(a))
        await asyncio.wait_for(woken.wait(), timeout=2)
