"""LangGraph's thread retention through the official `langgraph_sdk` client against a real
Daphne with its worker: `threads.prune(...)` and `threads.create(ttl=...)`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def client(site_factory: Callable[..., Any]) -> Any:
    # A fast reaper so a thread's ttl (in minutes, fractions allowed) runs out within the test.
    site = site_factory(RUNS_REAPER_SECONDS="0.2", RUNS_POLL_SECONDS="0.2")
    return get_sync_client(url=site.url + "/api", api_key=None)


def until(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    end = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(0.1)
    return value


def gone(client: Any, thread_id: str) -> bool:
    try:
        client.threads.get(thread_id)
    except NotFoundError:
        return True
    return False


def test_threads_prune_deletes_the_threads_with_their_runs(client: Any) -> None:
    a = client.threads.create()
    b = client.threads.create()
    keep = client.threads.create()
    run = client.runs.wait(a["thread_id"], "echo", input={"q": 1})
    assert run is not None
    result = client.threads.prune([a["thread_id"], b["thread_id"]])
    assert result == {"pruned_count": 2}
    assert gone(client, a["thread_id"]) and gone(client, b["thread_id"])
    assert client.threads.get(keep["thread_id"])["thread_id"] == keep["thread_id"]
    # Pruning again finds nothing to prune.
    assert client.threads.prune([a["thread_id"]]) == {"pruned_count": 0}


def test_threads_prune_refuses_keep_latest(client: Any) -> None:
    thread = client.threads.create()
    with pytest.raises(UnprocessableEntityError):
        client.threads.prune([thread["thread_id"]], strategy="keep_latest")
    assert client.threads.get(thread["thread_id"])["thread_id"] == thread["thread_id"]


def test_a_thread_created_with_a_ttl_is_deleted_once_idle_that_long(client: Any) -> None:
    # 0.05 minutes = 3 s; the thread outlives a run on it and goes once idle for that long.
    thread = client.threads.create(ttl={"ttl": 0.05, "strategy": "delete"})
    forever = client.threads.create()
    client.runs.wait(thread["thread_id"], "echo", input={"q": 2})
    assert client.threads.get(thread["thread_id"])["status"] == "idle"
    until(lambda: gone(client, thread["thread_id"]))
    assert not gone(client, forever["thread_id"])


def test_a_ttl_strategy_it_cannot_honour_is_refused(client: Any) -> None:
    with pytest.raises(UnprocessableEntityError):
        client.threads.create(ttl={"ttl": 5, "strategy": "keep_latest"})
    assert client.threads.search() == []
