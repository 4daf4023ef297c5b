"""The per-process hub: one channel-layer subscription, fanned out to local waiters."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from channels.layers import get_channel_layer

from runs import live
from runs.hub import Waiter, hub


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
        await live._send([change(a)])
        await asyncio.wait_for(woken_a.event.wait(), timeout=2)
        assert not woken_b.event.is_set()


async def test_a_sub_agent_change_wakes_its_parent_waiters() -> None:
    parent, child = str(uuid.uuid4()), str(uuid.uuid4())
    async with hub().watch(parent) as woken:
        await live._send([change(child, parent=parent)])
        await asyncio.wait_for(woken.event.wait(), timeout=2)


async def test_waiters_share_one_subscription_per_loop() -> None:
    layer = get_channel_layer()
    groups_before = len(getattr(layer, "groups", {}).get(live.RUNS_GROUP, {}))
    ids = [str(uuid.uuid4()) for _ in range(20)]
    async with watching_all(ids) as events:
        assert hub().waiting() == 20
        if hasattr(layer, "groups"):  # the in-memory layer shows its members
            members = len(layer.groups.get(live.RUNS_GROUP, {}))
            assert members - groups_before <= 1
        await live._send([change(ids[7])])
        await asyncio.wait_for(events[7].event.wait(), timeout=2)
    assert hub().waiting() == 0


class watching_all:  # noqa: N801 - reads like the context manager it is
    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.managers = [hub().watch(i) for i in ids]

    async def __aenter__(self) -> list[Waiter]:
        return [await m.__aenter__() for m in self.managers]

    async def __aexit__(self, *exc: object) -> None:
        for m in self.managers:
            await m.__aexit__(None, None, None)


@pytest.mark.postgres
async def test_it_works_over_redis_too(settings) -> None:
    # CI runs the suite twice: with REDIS_URL this is the pub/sub layer across processes.
    a = str(uuid.uuid4())
    async with hub().watch(a) as woken:
        await live._send([change(a)])
        await asyncio.wait_for(woken.event.wait(), timeout=2)


async def test_a_waiter_hears_whether_a_change_may_have_ended_its_run() -> None:
    run_id = str(uuid.uuid4())
    async with hub().watch(run_id) as waiter:
        for status in ("pending", "running"):
            await live._send([replace(change(run_id), status=status)])
            await asyncio.wait_for(waiter.event.wait(), timeout=2)
            assert not waiter.may_have_stopped, status
            waiter.clear()
        await live._send([replace(change(run_id), status="suspended")])
        await asyncio.wait_for(waiter.event.wait(), timeout=2)
        assert waiter.may_have_stopped
        waiter.clear()
        assert not waiter.event.is_set() and not waiter.may_have_stopped
        await live._send([replace(change(run_id), status="deleted")])
        await asyncio.wait_for(waiter.event.wait(), timeout=2)
        assert waiter.may_have_stopped


async def test_a_waiter_registered_before_its_run_exists_is_woken_and_a_dropped_one_leaves() -> (
    None
):
    run_id = str(uuid.uuid4())
    await hub().start()
    before = hub().waiting()
    waiter = hub().watch(run_id)  # registered at once, before anything is published
    assert hub().waiting() == before + 1
    await live._send([change(run_id)])
    await asyncio.wait_for(waiter.event.wait(), timeout=2)
    # A response body that never started drops its waiter unclosed: it must not stay behind.
    del waiter
    gc.collect()
    assert hub().waiting() == before


async def test_a_waiter_closed_off_the_loop_is_unregistered_on_the_loop(monkeypatch) -> None:
    # The garbage collector may finalize a dropped waiter on any thread; the hub's sets are only
    # changed on its loop (a change from another thread could break a fan-out under way).
    h = hub()
    await h.start()
    before = h.waiting()
    threads: list[int] = []
    discard = h._discard

    def on_which_thread(key: str, slot: Any) -> None:
        threads.append(threading.get_ident())
        discard(key, slot)

    monkeypatch.setattr(h, "_discard", on_which_thread)
    waiter = h.watch(str(uuid.uuid4()))
    assert h.waiting() == before + 1
    await asyncio.to_thread(waiter.close)
    await asyncio.sleep(0)
    assert h.waiting() == before
    assert threads == [threading.get_ident()]


async def test_changes_published_in_one_turn_of_the_loop_leave_as_one_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bulk cancel of ten runs: one channel-layer send, every waiter woken, and a socket
    listening to the runs list hears each run's change on its own."""
    layer = get_channel_layer()
    sent: list[dict[str, Any]] = []
    real_send = layer.group_send

    async def counting(group: str, message: dict[str, Any]) -> None:
        sent.append(message)
        await real_send(group, message)

    monkeypatch.setattr(layer, "group_send", counting)
    live.bind_server_loop(asyncio.get_running_loop())
    ids = [str(uuid.uuid4()) for _ in range(10)]
    heard: list[str] = []
    listener = lambda message: heard.append(message["run_id"])  # noqa: E731
    await hub().start()
    hub().listen(live.RUNS_GROUP, listener)
    try:
        async with watching_all(ids) as events:
            for run_id in ids:
                live.publish(change(run_id))
            live.publish(replace(change(ids[0]), seq=2, status="success"))
            await asyncio.wait_for(asyncio.gather(*(e.event.wait() for e in events)), timeout=2)
            assert all(e.may_have_stopped is (i == 0) for i, e in enumerate(events))
    finally:
        hub().unlisten(live.RUNS_GROUP, listener)
    assert len(sent) == 1 and sent[0]["type"] == live.CHANGES
    assert sorted(heard) == sorted(ids)  # each run once: its newest change


def test_a_batch_keeps_each_runs_newest_change_and_a_deletion_wins() -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    first = replace(change(a), seq=3)
    older = replace(change(a), seq=2, status="pending")
    deleted = replace(change(b), seq=5, status="deleted")
    late = replace(change(b), seq=9)

    kept = live.coalesced([first, replace(change(b), seq=4), older, deleted, late])

    assert kept == [first, deleted]
    single = live.batch_message([first])  # one change: the plain message
    assert single["type"] == "run.changed" and live.changes_in(single) == [single]
    batch = live.batch_message(kept)
    assert [m["run_id"] for m in live.changes_in(batch)] == [a, b]


def _publish_on_a_thread(change_: live.RunChange) -> str:
    """`live.publish` as a worker's run thread calls it after its commit (no server loop in
    this process); returns the thread's name."""

    def publish() -> None:
        with live.sending_thread():
            live.publish(change_)

    done = threading.Thread(target=publish, name="runsite-run-test")
    done.start()
    done.join(10)
    return done.name


@pytest.mark.postgres
async def test_a_worker_thread_sends_its_change_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over Redis, a thread without the server's loop (a worker's run, after its commit) sends
    its change itself, with a blocking Redis client, instead of waking the publisher's thread
    for it; the hubs, which listen through channels_redis, hear it."""
    layer = get_channel_layer()
    if isinstance(layer, live.InMemoryChannelLayer):
        pytest.skip("the in-memory layer is bound to one loop: the publisher's")
    monkeypatch.setattr(live, "_server_loop", None)
    monkeypatch.setattr(live, "_inline_off_until", 0.0)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    sender = live._blocking_sender(layer)
    assert sender is not None  # Runsite's Redis settings: one host, named by its address
    senders: list[str] = []
    real_send = sender.send

    def noting(changes: list[live.RunChange]) -> bool:
        senders.append(threading.current_thread().name)
        return real_send(changes)

    monkeypatch.setattr(sender, "send", noting)
    run_id = str(uuid.uuid4())
    async with hub().watch(run_id) as woken:
        name = await asyncio.to_thread(_publish_on_a_thread, change(run_id))
        await asyncio.wait_for(woken.event.wait(), timeout=2)
    assert senders == [name] and handed == []


@pytest.mark.postgres
def test_a_sending_thread_publishes_on_one_redis_connection_of_its_own_and_closes_it(
    settings: Any,
) -> None:
    """A worker's run thread sends each change on a Redis connection it keeps for the block
    (`live.sending_thread`), not through the client's pool; a send that fails drops that
    connection, and the next one connects afresh; the block's end closes it."""
    import redis

    layer = get_channel_layer()
    if isinstance(layer, live.InMemoryChannelLayer):
        pytest.skip("the in-memory layer is bound to one loop: the publisher's")
    sender = live._blocking_sender(layer)
    assert sender is not None
    address = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0]["address"]
    admin = redis.Redis.from_url(address)
    listener = admin.pubsub(ignore_subscribe_messages=True)
    listener.subscribe(sender.channel)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    seen: dict[str, Any] = {}

    def client_id(conn: Any) -> int:
        conn.send_command("CLIENT", "ID")
        return int(conn.read_response())

    def run_thread() -> None:
        with live.sending_thread():
            seen["first"] = sender.send([change(ids[0])])
            conn = live._inline.redis[1]
            seen["kept"] = client_id(conn)
            admin.client_kill_filter(_id=seen["kept"])  # Redis drops it
            seen["dropped"] = sender.send([change(ids[1])])
            seen["again"] = sender.send([change(ids[2])])
            seen["same object"] = live._inline.redis[1] is conn
            seen["reconnected"] = client_id(conn)
        seen["open after"] = conn._sock is not None

    try:
        done = threading.Thread(target=run_thread)
        done.start()
        done.join(10)
        heard = []
        deadline = time.monotonic() + 5
        while len(heard) < 2 and time.monotonic() < deadline:
            message = listener.get_message(timeout=0.5)
            if message is not None:
                heard.append(layer.deserialize(message["data"])["run_id"])
    finally:
        listener.close()
    assert seen["first"] is True and seen["dropped"] is False and seen["again"] is True
    assert seen["same object"] and seen["reconnected"] != seen["kept"]
    assert seen["open after"] is False
    assert heard == [ids[0], ids[2]]
    clients = admin.client_list()
    assert not any(int(c["id"]) == seen["reconnected"] for c in clients)


@pytest.mark.postgres
async def test_a_layer_on_hosts_given_otherwise_is_sent_to_on_the_threads_own_loop(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A Redis named other than by one address (a host and port, several shards) gets no
    blocking client: the committing thread sends through the layer on its own event loop."""
    if isinstance(get_channel_layer(), live.InMemoryChannelLayer):
        pytest.skip("the in-memory layer is bound to one loop: the publisher's")
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": settings.CHANNEL_LAYERS["default"]["BACKEND"],
            "CONFIG": {"hosts": [("127.0.0.1", 6379)], "prefix": config["prefix"]},
        }
    }
    layer = get_channel_layer()
    assert live._blocking_sender(layer) is None
    monkeypatch.setattr(live, "_server_loop", None)
    monkeypatch.setattr(live, "_inline_off_until", 0.0)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    sent: list[str] = []
    real_send = live._send

    async def noting(changes: list[live.RunChange]) -> bool:
        sent.append(changes[0].run_id)
        return await real_send(changes)

    monkeypatch.setattr(live, "_send", noting)
    one = change(str(uuid.uuid4()))
    await asyncio.to_thread(_publish_on_a_thread, one)
    assert sent == [one.run_id] and handed == []


@pytest.mark.postgres
async def test_a_send_that_hangs_hands_changes_to_the_publisher_for_a_while(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """A Redis that accepts the connection and never answers: the committing thread gives up on
    its send after INLINE_TIMEOUT and hands that change and the ones after it to the
    publisher's thread, so no run waits on Redis twice."""
    import socket

    if isinstance(get_channel_layer(), live.InMemoryChannelLayer):
        pytest.skip("the in-memory layer is bound to one loop: the publisher's")
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    config = settings.CHANNEL_LAYERS["default"]["CONFIG"]
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": settings.CHANNEL_LAYERS["default"]["BACKEND"],
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{port}/0"}], "prefix": "x"},
        }
    }
    assert config["hosts"] != settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    monkeypatch.setattr(live, "_server_loop", None)
    monkeypatch.setattr(live, "_inline_off_until", 0.0)
    monkeypatch.setattr(live, "INLINE_TIMEOUT", 0.05)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    attempts: list[str] = []
    sender = live._blocking_sender(get_channel_layer())
    assert sender is not None
    real_send = sender.send

    def noting(changes: list[live.RunChange]) -> bool:
        attempts.append(changes[0].run_id)
        return real_send(changes)

    monkeypatch.setattr(sender, "send", noting)
    first, second = change(str(uuid.uuid4())), change(str(uuid.uuid4()))
    try:
        await asyncio.to_thread(_publish_on_a_thread, first)
        await asyncio.to_thread(_publish_on_a_thread, second)
    finally:
        silent.close()
    assert attempts == [first.run_id]  # tried once, on the committing thread
    assert handed == [first, second]


def test_a_thread_that_did_not_opt_in_hands_its_change_to_the_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only threads that live as long as their event loop send themselves (a worker's run
    threads, `live.sending_thread`); any other gets no loop, nor a channel-layer connection."""
    monkeypatch.setattr(live, "_server_loop", None)
    monkeypatch.setattr(live, "_inline_off_until", 0.0)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    one = change(str(uuid.uuid4()))
    done = threading.Thread(target=live.publish, args=(one,))
    done.start()
    done.join(10)
    assert handed == [one]


def test_changes_held_for_an_answer_wait_for_it_and_go_out_at_once_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`live.publishes_held`: a request thread's publishes are kept for the server to send
    after its answer; a block that raises publishes what it kept before the error goes on."""
    monkeypatch.setattr(live, "_server_loop", None)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    kept, lost = change(str(uuid.uuid4())), change(str(uuid.uuid4()))
    with live.publishes_held() as held:
        live.publish(kept)
    assert held == [kept] and handed == []
    live.publish_all(held)
    assert handed == [kept]
    with pytest.raises(RuntimeError), live.publishes_held():
        live.publish(lost)
        raise RuntimeError("the request failed after its commit")
    assert handed == [kept, lost]
    live.publish(kept)  # nothing is held outside the block
    assert handed == [kept, lost, kept]


def test_a_change_committed_inside_an_event_loop_goes_to_the_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run thread whose code runs an event loop of its own (an async graph) and commits from
    it: its loop cannot be nested in that one, so the publisher sends the change."""
    monkeypatch.setattr(live, "_server_loop", None)
    monkeypatch.setattr(live, "_inline_off_until", 0.0)
    handed: list[live.RunChange] = []
    monkeypatch.setattr(live._publisher, "submit", handed.append)
    one = change(str(uuid.uuid4()))

    async def commit_inside_a_loop() -> None:
        live.publish(one)

    def run() -> None:
        with live.sending_thread():
            asyncio.run(commit_inside_a_loop())

    done = threading.Thread(target=run)
    done.start()
    done.join(10)
    assert handed == [one]
    assert live._inline_off_until == 0.0  # not a failure: nothing turned off


def _redis_layer() -> Any:
    layer = get_channel_layer()
    if isinstance(layer, live.InMemoryChannelLayer):
        pytest.skip("the in-memory layer loses nothing and is bound to one loop")
    return layer


@pytest.mark.postgres
async def test_a_hub_whose_subscription_dropped_tells_waiters_and_sockets_to_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis drops the hub's pub/sub connection (a restart, a failover, CLIENT KILL):
    channels_redis re-subscribes a second or so later and what was published meanwhile never
    arrives. The hub's beat goes unheard, and the first one heard after it makes every waiter
    read the database again and every socket resync from the moment it last heard."""
    import os

    import redis

    _redis_layer()
    monkeypatch.setattr("runs.hub.BEAT_SECONDS", 0.2)
    heard: list[dict[str, Any]] = []
    run_id = str(uuid.uuid4())
    async with hub().watch(run_id) as waiter:
        hub().listen(live.RUNS_GROUP, heard.append)
        try:
            await asyncio.sleep(0.6)  # beats heard: the hub knows it was listening
            assert not waiter.event.is_set()
            r = redis.Redis.from_url(os.environ["REDIS_URL"])
            killed_at = time.time()
            assert r.client_kill_filter(_type="pubsub") >= 1
            await live._send([change(run_id)])  # published while nobody listens: lost
            for _ in range(300):
                if any("resync" in m for m in heard):
                    break
                await asyncio.sleep(0.05)
        finally:
            hub().unlisten(live.RUNS_GROUP, heard.append)
        resyncs = [m["resync"] for m in heard if "resync" in m]
        assert resyncs, "no resync after the subscription dropped"
        assert killed_at - 1.0 <= resyncs[0] <= killed_at  # from the last beat heard
        assert waiter.event.is_set() and waiter.may_have_stopped


@pytest.mark.postgres
def test_changes_the_layer_refused_are_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis briefly away when a change is published: the publisher tries again, with what came
    meanwhile, instead of dropping it."""
    layer = _redis_layer()
    monkeypatch.setattr(live, "RETRY_SECONDS", 0.05)
    real = layer.group_send
    sent: list[list[str]] = []

    async def away_twice(group: str, message: dict[str, Any]) -> None:
        ids = [c["run_id"] for c in live.changes_in(message)]
        sent.append(ids)
        if len(sent) <= 2:
            raise ConnectionError("Redis away")
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", away_twice)
    first, second = change(str(uuid.uuid4())), change(str(uuid.uuid4()))
    live._publisher.submit(first)
    deadline = time.monotonic() + 5
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    live._publisher.submit(second)
    live.flush(5)
    assert live._publisher.idle()
    assert sent[0] == [first.run_id] and sent[1] == [first.run_id]
    assert sent[-1] == [first.run_id, second.run_id]  # the refused one first, then what came


async def test_a_change_the_layer_refused_on_the_servers_loop_is_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A web process publishes on its event loop (a cancel, a run created): a send the layer
    refuses is tried again, with what came meanwhile, and the waiter is woken."""
    layer = get_channel_layer()
    monkeypatch.setattr(live, "RETRY_SECONDS", 0.05)
    real = layer.group_send
    tries: list[list[str]] = []

    async def away_once(group: str, message: dict[str, Any]) -> None:
        tries.append([c["run_id"] for c in live.changes_in(message)])
        if len(tries) == 1:
            raise ConnectionError("Redis away")
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", away_once)
    live.bind_server_loop(asyncio.get_running_loop())
    first, second = change(str(uuid.uuid4())), change(str(uuid.uuid4()))
    async with hub().watch(first.run_id) as waiter:
        live.publish(first)
        while not tries:
            await asyncio.sleep(0.005)
        live.publish(second)
        await asyncio.wait_for(waiter.event.wait(), timeout=2)
    assert tries[0] == [first.run_id]
    assert [first.run_id] in tries[1:] or [first.run_id, second.run_id] in tries[1:]


@pytest.mark.postgres
async def test_the_layers_redis_connections_probe_a_silent_peer() -> None:
    """REDIS_KEEPALIVE_SECONDS (30): the subscription's socket and the publishes' probe an idle
    peer after 30 s, three times 10 s apart, and give up on data unacknowledged for 60 s; a
    subscription whose Redis vanished without a word is dropped and made again (the OS alone
    would wait two hours, the hub's beats unheard all along)."""
    import socket

    layer = _redis_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "probe"})  # through a publish connection
    await layer.send(channel, {"type": "probe"})
    assert (await asyncio.wait_for(layer.receive(channel), 5))["type"] == "probe"
    # channels_redis's own objects: it offers no public way to its sockets.
    shard = layer._shards[0]
    connections = [shard._pubsub.connection, *shard._redis.connection_pool._available_connections]
    assert len(connections) >= 2
    for conn in connections:
        sock = conn._writer.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000


async def test_a_send_a_silent_redis_never_answers_counts_as_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis that takes the connection and never answers (a peer gone half-open): the send
    gives up after SEND_TIMEOUT and reports itself refused (then sent again), instead of
    holding the publisher, or the server loop's batch, for ever."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass
        writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    layer = RedisPubSubChannelLayer(hosts=[{"address": f"redis://127.0.0.1:{port}"}])
    monkeypatch.setattr(live, "get_channel_layer", lambda: layer)
    monkeypatch.setattr(live, "SEND_TIMEOUT", 0.2)
    try:
        started = time.monotonic()
        assert await asyncio.wait_for(live._send([change(str(uuid.uuid4()))]), 5) is False
        assert time.monotonic() - started < 2
    finally:
        server.close()
        await asyncio.wait_for(layer.flush(), 5)
        await server.wait_closed()


@pytest.mark.postgres
async def test_a_join_redis_never_answers_neither_stops_the_beats_nor_blocks_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis takes a join (a subscription) and never answers: the hub's first join gives up
    after JOIN_TIMEOUT (the next waiter tries again), and a periodic re-join does not hold up
    the beats that tell the hub it is deaf."""
    layer = _redis_layer()
    monkeypatch.setattr("runs.hub.REJOIN_SECONDS", 0.1)
    monkeypatch.setattr("runs.hub.BEAT_SECONDS", 0.1)
    monkeypatch.setattr("runs.hub.JOIN_TIMEOUT", 0.2)
    real_add = layer.group_add
    joins: list[str] = []
    silent = True

    async def add(group: str, channel: str) -> None:
        joins.append(group)
        if silent:
            await asyncio.sleep(3600)
        await real_add(group, channel)

    monkeypatch.setattr(layer, "group_add", add)
    the_hub = hub()
    assert await asyncio.wait_for(the_hub.start(), 5) is False  # gave up, did not hang
    silent = False
    assert await asyncio.wait_for(the_hub.start(), 5) is True  # the next one joins
    heard_before = the_hub._heard_n
    silent = True  # every re-join from now on hangs
    await asyncio.sleep(1.5)
    assert len(joins) >= 4  # re-joins kept being tried
    # and the beats went on between them (unbounded, the first re-join ended them)
    assert the_hub._heard_n >= heard_before + 3
