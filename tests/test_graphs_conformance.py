"""The Runsite checkpointer against LangGraph's own checkpointer conformance suite
(langgraph-checkpoint-conformance: put, put_writes, get_tuple, list, delete_thread,
delete_for_runs; the async methods, as LangGraph's server calls them)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

from runs.graphs.checkpointer import RunsiteSaver
from runs.models import Thread


class SaverCreatingThreads(RunsiteSaver):
    """The suite invents thread ids; Runsite's checkpoints belong to existing threads."""

    def _thread_for(self, config: Any) -> None:
        Thread.objects.get_or_create(id=UUID(str(config["configurable"]["thread_id"])))

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self._thread_for(config)
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self._thread_for(config)
        super().put_writes(config, writes, task_id, task_path)


@pytest.mark.django_db(transaction=True)
def test_the_checkpointer_passes_langgraphs_conformance_suite() -> None:
    @checkpointer_test(name="RunsiteSaver")
    async def saver() -> Any:
        s = SaverCreatingThreads()
        yield s
        s.close()

    report = asyncio.run(validate(saver))
    results = report.results
    failures = {name: r.failures for name, r in results.items() if r.passed is False}
    assert failures == {}
    passed = {name for name, r in results.items() if r.passed}
    assert passed >= {"put", "put_writes", "get_tuple", "list", "delete_thread", "delete_for_runs"}
