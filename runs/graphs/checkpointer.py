"""RunsiteSaver: LangGraph's BaseCheckpointSaver over Runsite's tables (sync and async).

Reads go straight to GraphCheckpoint/GraphWrite; writes go through runs/services/graphs.py,
fenced by the run's lease when the saver belongs to a worker's run. The async methods run the
sync ones on one dedicated thread per saver: Django's ORM must not run on the event loop, and
one thread keeps a run's writes in the order LangGraph issued them, on one connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import CancelledError
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from django.db import close_old_connections, connection
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from runs.contracts import FenceResult, Lease
from runs.graphs.jsonable import to_json
from runs.models import GraphCheckpoint, GraphWrite
from runs.services import graphs as graph_services

Event = tuple[str, dict[str, Any], str]

# The channel of a task's error write (LangGraph keeps the constant private; the checkpoint
# library's WRITES_IDX_MAP, which savers use, names it).
ERROR = "__error__"
if ERROR not in WRITES_IDX_MAP:  # renamed by a LangGraph release: a cancelled task would resume
    raise ImportError(f"langgraph's checkpoint writes no longer name {ERROR!r}; see put_writes")


def _thread_uuid(config: RunnableConfig) -> UUID:
    return UUID(str(config["configurable"]["thread_id"]))


def project_values(channel_values: dict[str, Any], keys: Sequence[str] | None) -> dict[str, Any]:
    """The state values a client sees: the graph's state keys (internal channels left out)."""
    if keys:
        picked = {k: channel_values[k] for k in keys if k in channel_values}
    else:
        picked = {
            k: v
            for k, v in channel_values.items()
            if not k.startswith("__") and ":" not in k and not k.startswith("branch")
        }
    return to_json(picked)


class RunsiteSaver(BaseCheckpointSaver[str]):
    def __init__(
        self,
        *,
        lease: Lease | None = None,
        value_keys: Sequence[str] | None = None,
        take_events: Callable[[], list[Event]] | None = None,
        on_fence: Callable[[FenceResult], None] | None = None,
        serde: Any = None,
    ):
        super().__init__(serde=serde)
        self.lease = lease
        self.value_keys = list(value_keys) if value_keys else None
        # Stream events gathered by the executor ride along with the next write.
        self.take_events = take_events or list
        self.on_fence = on_fence
        self._pool: ThreadPoolExecutor | None = None
        self._stored: set[str] = set()  # checkpoints this saver put (no parent lookup needed)

    # -- the async side: one thread per saver --------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="runsite-saver")
        return self._pool

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), lambda: fn(*args, **kwargs))

    def call_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn` on the saver's thread and wait (keeps a run's writes in order)."""
        return self._executor().submit(fn, *args).result()

    def close(self) -> None:
        """Wait for the writes in flight, then hand the thread's connection back."""
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self._pool.submit(_close_connection).result()
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- reads ---------------------------------------------------------------------------------

    def _tuple(self, row: GraphCheckpoint) -> CheckpointTuple:
        thread_id, ns = str(row.thread_id), row.checkpoint_ns
        writes = GraphWrite.objects.filter(
            thread_id=row.thread_id, checkpoint_ns=ns, checkpoint_id=row.checkpoint_id
        ).order_by("task_path", "task_id", "idx")
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": row.checkpoint_id,
                }
            },
            checkpoint=self.serde.loads_typed((row.type, bytes(row.checkpoint))),
            metadata=row.metadata,
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": row.parent_checkpoint_id,
                    }
                }
                if row.parent_checkpoint_id
                else None
            ),
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.type, bytes(w.value))))
                for w in writes
            ],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        qs = GraphCheckpoint.objects.filter(
            thread_id=_thread_uuid(config),
            checkpoint_ns=config["configurable"].get("checkpoint_ns", ""),
        )
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            row = qs.filter(checkpoint_id=checkpoint_id).first()
        else:
            row = qs.order_by("-checkpoint_id").first()
        return self._tuple(row) if row is not None else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        qs = GraphCheckpoint.objects.all()
        if config is not None:
            qs = qs.filter(thread_id=_thread_uuid(config))
            ns = config["configurable"].get("checkpoint_ns")
            if ns is not None:
                qs = qs.filter(checkpoint_ns=ns)
            if checkpoint_id := get_checkpoint_id(config):
                qs = qs.filter(checkpoint_id=checkpoint_id)
        if before is not None and (before_id := get_checkpoint_id(before)):
            qs = qs.filter(checkpoint_id__lt=before_id)
        qs = qs.order_by("-checkpoint_id")
        if not filter and limit is not None:
            qs = qs[:limit]
        count = 0
        for row in list(qs):
            # Metadata containment in Python: the same on SQLite and PostgreSQL.
            if filter and any(row.metadata.get(k) != v for k, v in filter.items()):
                continue
            yield self._tuple(row)
            count += 1
            if limit is not None and count >= limit:
                return

    # -- writes --------------------------------------------------------------------------------

    def _fenced(self, fence: FenceResult | None) -> None:
        if fence is not None and self.on_fence is not None:
            self.on_fence(fence)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "")
        full_metadata = get_checkpoint_metadata(config, metadata)
        type_, blob = self.serde.dumps_typed(checkpoint)
        write = graph_services.GraphCheckpointWrite(
            thread_id=_thread_uuid(config),
            checkpoint_ns=ns,
            checkpoint_id=checkpoint["id"],
            parent_checkpoint_id=configurable.get("checkpoint_id"),
            type=type_,
            blob=blob,
            metadata=to_json(full_metadata),
            step=int(full_metadata.get("step", 0) or 0),
            values=project_values(checkpoint["channel_values"], self.value_keys)
            if ns == ""
            else None,
        )
        fence = graph_services.graph_checkpoint_put(
            lease=self.lease,
            write=write,
            events=self.take_events(),
            parent_known=write.parent_checkpoint_id in self._stored,
        )
        self._stored.add(checkpoint["id"])
        self._fenced(fence)
        return {
            "configurable": {
                "thread_id": configurable["thread_id"],
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        if any(channel == ERROR and isinstance(value, CancelledError) for channel, value in writes):
            # A task cancelled part-way (a cancel, a timeout, a lost lease) is saved with what
            # it had written so far: its node's update, say, and not yet its edge's. On resume
            # LangGraph takes a task with writes for a finished one and applies them without
            # running it, so the graph would go on from half a step (without the edge's write
            # it ends there). Keep the error alone: the task runs again from its start.
            writes = [(channel, value) for channel, value in writes if channel == ERROR]
        rows = []
        for position, (channel, value) in enumerate(writes):
            type_, blob = self.serde.dumps_typed(value)
            rows.append((WRITES_IDX_MAP.get(channel, position), channel, type_, blob))
        write = graph_services.GraphWritesWrite(
            thread_id=_thread_uuid(config),
            checkpoint_ns=configurable.get("checkpoint_ns", ""),
            checkpoint_id=configurable["checkpoint_id"],
            task_id=task_id,
            task_path=task_path,
            rows=rows,
            upsert=all(channel in WRITES_IDX_MAP for channel, _ in writes),
        )
        fence = graph_services.graph_writes_put(
            lease=self.lease, write=write, events=self.take_events()
        )
        self._fenced(fence)

    def delete_thread(self, thread_id: str) -> None:
        graph_services.graph_thread_delete_checkpoints(thread_id=UUID(str(thread_id)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        graph_services.graph_runs_delete_checkpoints(run_ids=[str(r) for r in run_ids])

    # -- async ---------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._call(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._call(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._call(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._call(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._call(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._call(self.delete_for_runs, run_ids)


def _close_connection() -> None:
    if not connection.in_atomic_block:
        close_old_connections()
        connection.close()
