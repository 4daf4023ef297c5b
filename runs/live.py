"""Publishing committed run changes to every process (the `runs` group; runs/hub.py fans each
change out in-process to the subscribers of `runs`, `run.<id>` and `thread.<id>`).

Services call `run_changed_on_commit()`; the message leaves only once the change is durable.
Publishing never raises into a state change: the database is the truth and every message carries
the run's event sequence number, so a client that missed one re-syncs from the database.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields
from typing import Any

import redis
from channels import DEFAULT_CHANNEL_LAYER
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer
from channels_redis.utils import decode_hosts
from django.conf import settings
from django.db import transaction
from redis.backoff import NoBackoff
from redis.retry import Retry

from runs.holds import Hold

logger = logging.getLogger(__name__)

RUNS_GROUP = "runs"


def run_group(run_id: Any) -> str:
    return f"run.{run_id}"


def thread_group(thread_id: Any) -> str:
    return f"thread.{thread_id}"


@dataclass(frozen=True)
class RunChange:
    run_id: str
    thread_id: str | None
    agent_id: str
    status: str  # a RunStatus value, or "deleted" after a rollback
    seq: int
    parent_run_id: str | None = None
    kind: str = "changed"
    # The run's tenant: a socket of a user bound to other resources drops the message unread
    # (runs/consumers.py). None = no resource, heard by unbound staff only.
    resource_id: str | None = None
    # A stopped run's end as `selectors.run_outcome` reads it (its attempt and the wait/join
    # body), when the writer holds it and it is small (`OUTCOME_CARRIED_BYTES`): a wait or join
    # woken by this change answers without reading it back (runs/api/streaming.py).
    attempt: int | None = None
    outcome: Any = None

    def message(self) -> dict[str, Any]:
        # Shallow (`asdict` copies the outcome deeply, ~10 µs a message): the writer no longer
        # changes what it published once its transaction committed.
        data = {name: getattr(self, name) for name in _CHANGE_FIELDS}
        if self.outcome is None:
            del data["attempt"], data["outcome"]
        return {"type": "run.changed", **data, "published_at": time.time()}


_CHANGE_FIELDS = tuple(f.name for f in fields(RunChange))

# A carried outcome travels to every process's hub: a bigger one is read where it is needed.
OUTCOME_CARRIED_BYTES = 16_384


CHANGES = "run.changes"


def batch_message(changes: list[RunChange]) -> dict[str, Any]:
    """One message for changes published together (a bulk cancel, a busy loop turn): one
    channel-layer send and one receive per process instead of one per run."""
    if len(changes) == 1:
        return changes[0].message()
    return {"type": CHANGES, "changes": [c.message() for c in changes]}


def changes_in(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The `run.changed` messages a published message carries (one, or a batch's)."""
    if message.get("type") == CHANGES:
        return list(message.get("changes") or ())
    return [message]


def coalesced(changes: list[RunChange]) -> list[RunChange]:
    """The newest change of each run, in the order the runs first appear (a deletion wins:
    nothing newer can follow it)."""
    latest: dict[str, RunChange] = {}
    for change in changes:
        previous = latest.get(change.run_id)
        newer = change.seq >= previous.seq if previous is not None else True
        if previous is None or (
            previous.status != "deleted" and (newer or change.status == "deleted")
        ):
            latest[change.run_id] = change
    return list(latest.values())


def groups_of(message: dict[str, Any]) -> list[str]:
    """The groups a published change concerns: every list, its run, its thread, its parent."""
    groups = [RUNS_GROUP, run_group(message.get("run_id"))]
    if message.get("thread_id"):
        groups.append(thread_group(message["thread_id"]))
    if message.get("parent_run_id"):
        groups.append(run_group(message["parent_run_id"]))
    return groups


# The event loop of the ASGI server in this process, when there is one. The in-memory channel
# layer is bound to it, so sends from worker threads must be scheduled there.
_server_loop: asyncio.AbstractEventLoop | None = None


def bind_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _server_loop
    _server_loop = loop


# A send the channel layer refused (Redis away) is tried again this often, with what was
# queued meanwhile, for up to RETRY_FOR_SECONDS; subscribers that missed it resync (runs/hub.py).
RETRY_SECONDS = 0.5
RETRY_FOR_SECONDS = 60.0


# A send unanswered this long (a Redis gone silent without closing the connection) counts as
# refused: it is tried again as above, and the publisher is never stuck behind it. The channel
# layer drops the connection such a send was waiting on.
SEND_TIMEOUT = 5.0


class _Publisher:
    """A background thread with its own event loop for processes without an ASGI server."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[RunChange | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.sending = False
        self.unsent: list[RunChange] = []  # refused by the layer, tried again

    def submit(self, change: RunChange) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._main, name="runsite-publisher", daemon=True
                )
                self._thread.start()
        self._queue.put(change)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        failing_since = 0.0
        while True:
            got: list[RunChange] = []
            try:
                change = self._queue.get(timeout=RETRY_SECONDS if self.unsent else None)
            except queue.Empty:
                pass  # only the retry
            else:
                if change is None:
                    break
                got.append(change)
            # Under load several changes queue up (a run claimed, then finished a few
            # milliseconds later; many runs at once): only each run's newest matters to
            # subscribers, who read the database anyway, and they go out as one message.
            # Never wait to coalesce: only what is already queued.
            changes = [*self.unsent, *got]
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    break
                changes.append(more)
            self.sending = True
            try:
                batch = coalesced(changes)
                if loop.run_until_complete(_send(batch)):
                    self.unsent, failing_since = [], 0.0
                else:
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since < RETRY_FOR_SECONDS:
                        self.unsent = batch
                    else:
                        logger.warning("live: %d changes dropped after a minute", len(batch))
                        self.unsent, failing_since = [], 0.0
            finally:
                self.sending = False

    def idle(self) -> bool:
        return self._queue.empty() and not self.sending and not self.unsent

    def flush(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.idle() and time.monotonic() < deadline:
            time.sleep(0.005)


_publisher = _Publisher()


async def _send(changes: list[RunChange]) -> bool:
    """Whether it was handed to the channel layer (True without one: nothing to do)."""
    layer = get_channel_layer()
    if layer is None:
        return True
    # One message to the one group every process's hub listens to (runs/hub.py); the hub
    # derives `run.<id>`, `thread.<id>` and the parent's group for its local subscribers.
    try:
        await asyncio.wait_for(layer.group_send(RUNS_GROUP, batch_message(changes)), SEND_TIMEOUT)
    except Exception:
        logger.warning(
            "live: publishing %s failed", ", ".join(c.run_id for c in changes), exc_info=True
        )
        return False
    return True


class _LoopBatch:
    """Changes published on the server's event loop within one turn of it (the changes of one
    transaction, the requests served in that turn) leave as one message on the next turn."""

    def __init__(self) -> None:
        self.pending: list[RunChange] = []
        self.failing_since = 0.0

    def add(self, loop: asyncio.AbstractEventLoop, change: RunChange) -> None:
        if not self.pending:
            loop.create_task(self._flush())
        self.pending.append(change)

    async def _flush(self) -> None:
        changes, self.pending = self.pending, []
        if not await _send(coalesced(changes)):
            # Tried again with what comes meanwhile, as the publisher does.
            await asyncio.sleep(RETRY_SECONDS)
            failed_at = self.failing_since or time.monotonic()
            if time.monotonic() - failed_at < RETRY_FOR_SECONDS:
                if not self.pending:
                    asyncio.get_running_loop().create_task(self._flush())
                self.pending[:0] = changes  # before what came meanwhile
                self.failing_since = failed_at
                return
            logger.warning("live: %d changes dropped after a minute", len(changes))
        self.failing_since = 0.0


_loop_batch = _LoopBatch()


# Sent by the thread that committed, on a thread that opted in (`sending_thread`: a worker's
# run threads), when nothing this process published before waits: a hand-off to the
# publisher's thread costs its wake-up, 0.2-0.9 ms on an idle machine, between a run's
# suspension or end and its waiter. Bounded: a send that fails or takes longer than
# INLINE_TIMEOUT (Redis unreachable) hands that change and every one after it to the publisher
# for a while, so a run never waits on the channel layer more than once in that while.
INLINE_TIMEOUT = 0.25
INLINE_BACKOFF_SECONDS = 30.0
_inline = threading.local()
_inline_off_until = 0.0


@contextmanager
def sending_thread() -> Iterator[None]:
    """Within the block, this thread publishes its committed changes itself, on an event loop
    of its own, which the block closes (with the channel layer's connection on it)."""
    loop = asyncio.new_event_loop()
    _inline.loop = loop
    try:
        yield
    finally:
        _inline.loop = None
        loop.close()
        held = getattr(_inline, "redis", None)
        if held is not None:
            _inline.redis = None
            held[1].disconnect()


class BlockingSender:
    """The `runs` group's message PUBLISHed as channels_redis's pub/sub layer sends it (the
    layer's serializer, its group's channel `<prefix>__group__<group>`: channels-redis 4,
    pinned), on a blocking Redis connection: a committing thread's send without an event loop
    run for it. Each sending thread (`sending_thread`, which closes it) keeps a connection of
    its own from the client's pool and sends the command and reads its answer on it: ~43 µs of
    CPU against ~78 through the client's `publish` (its pool, retry and argument checks on every
    call) and ~185 through the layer's event loop. A send that fails or gets no answer within
    INLINE_TIMEOUT is not tried again here (False: the caller hands it on); its connection is
    dropped, and the next send connects afresh."""

    def __init__(self, layer: Any, client: Any, prefix: str) -> None:
        self.layer, self.client = layer, client
        self.channel = f"{prefix}__group__{RUNS_GROUP}"

    def send(self, changes: list[RunChange]) -> bool:
        conn = self._connection()
        try:
            conn.send_command("PUBLISH", self.channel, self.layer.serialize(batch_message(changes)))
            conn.read_response()
        except Exception:
            conn.disconnect()
            logger.warning(
                "live: publishing %s failed", ", ".join(c.run_id for c in changes), exc_info=True
            )
            return False
        return True

    def _connection(self) -> Any:
        """This sending thread's connection, made at its first send (`sending_thread` closes
        it)."""
        pool = self.client.connection_pool
        held = getattr(_inline, "redis", None)  # (pool, connection)
        if held is None or held[0] is not pool:
            if held is not None:
                held[1].disconnect()  # of a layer configured since
            held = _inline.redis = (pool, pool.make_connection())
        return held[1]


_blocking: tuple[Any, BlockingSender | None] = (None, None)


def _blocking_sender(layer: Any) -> BlockingSender | None:
    """This process's BlockingSender for `layer`, the channels_redis pub/sub layer on one Redis
    named by its address (as Runsite's settings configure it); None for any other layer, whose
    sends go through its own event loop."""
    global _blocking
    if _blocking[0] is layer:
        return _blocking[1]
    sender = None
    if type(layer) is RedisPubSubChannelLayer:
        layers: dict[str, dict[str, Any]] = settings.CHANNEL_LAYERS
        config = layers[DEFAULT_CHANNEL_LAYER].get("CONFIG", {})
        hosts = decode_hosts(config.get("hosts"))
        if len(hosts) == 1 and "address" in hosts[0]:
            options = {k: v for k, v in hosts[0].items() if k != "address"}
            client = redis.Redis.from_url(
                hosts[0]["address"],
                socket_timeout=INLINE_TIMEOUT,
                socket_connect_timeout=INLINE_TIMEOUT,
                retry=Retry(NoBackoff(), 0),  # a failure is handed on, not waited out again
                **options,
            )
            sender = BlockingSender(layer, client, config.get("prefix", "asgi"))
    _blocking = (layer, sender)
    return sender


def _publish_inline(change: RunChange) -> bool:
    """Send `change` from this thread; False when it is the publisher's to send."""
    global _inline_off_until
    loop = getattr(_inline, "loop", None)
    if loop is None or time.monotonic() < _inline_off_until or not _publisher.idle():
        return False
    if _loop_running_here():
        return False  # committed from code running an event loop of its own on this thread
    layer = get_channel_layer()
    if isinstance(layer, InMemoryChannelLayer):
        return False  # bound to one event loop: the publisher's
    sender = _blocking_sender(layer)
    if sender is not None:
        sent = sender.send([change])
    else:
        try:
            sent = loop.run_until_complete(asyncio.wait_for(_send([change]), INLINE_TIMEOUT))
        except Exception:  # the timeout; _send logs and swallows the layer's own errors
            sent = False
    if not sent:
        _inline_off_until = time.monotonic() + INLINE_BACKOFF_SECONDS
        logger.warning("live: publishing from the committing thread is off for a while")
    return sent


def _loop_running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


# Changes committed by a thread serving a request whose answer goes out afterwards
# (`publishes_held`): kept here until the server has sent it.
_held = Hold(lambda changes: publish_all(changes))


def publishes_held() -> AbstractContextManager[list[RunChange]]:
    """Within the block, this thread's publishes are kept in the list yielded instead of
    going out, for the server to hand to `publish_all` once it has sent the answer they belong
    to. A request's answer then leaves before its publish, which would otherwise run on the
    server's event loop first (building and sending a message to Redis, ~0.3 ms) and hold the
    GIL against the thread finishing the answer; nobody waits on a web process's own publish
    before that answer (its subscribers are pages and streams). Raising out of the block
    publishes what was kept at once."""
    return _held.held()


def publish_all(changes: list[RunChange]) -> None:
    for change in changes:
        publish(change)


def publish(change: RunChange) -> None:
    held = _held.kept()
    if held is not None:
        held.append(change)
        return
    loop = _server_loop
    if loop is not None and loop.is_running():
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _loop_batch.add(loop, change)
        else:
            loop.call_soon_threadsafe(_loop_batch.add, loop, change)
        return
    if _publish_inline(change):
        return
    _publisher.submit(change)


def run_changed_on_commit(change: RunChange) -> None:
    """Publish `change` after the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: publish(change), robust=True)


def flush(timeout: float = 5.0) -> None:
    """Wait until queued publishes from this process have been handed to the channel layer."""
    _publisher.flush(timeout)
