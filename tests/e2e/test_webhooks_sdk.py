"""LangGraph's `webhook` through the official langgraph_sdk against a live Runsite: the server's
embedded worker POSTs the run to a receiver on loopback when it suspends and when it ends."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import UnprocessableEntityError

from tests.test_webhooks import Receiver

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def client(site_factory: Callable[..., Any]) -> Any:
    site = site_factory(
        RUNS_WEBHOOK_ALLOW_PRIVATE="1",
        RUNS_WEBHOOK_SECRET="s3cret",
        RUNS_POLL_SECONDS="0.2",
    )
    return get_client(url=site.url + "/api", api_key=None)


def received(receiver: Receiver, n: int, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while len(receiver.requests) < n:
        assert time.monotonic() < end, f"{len(receiver.requests)} of {n} webhooks arrived"
        time.sleep(0.05)


async def test_the_sdk_webhook_hears_a_suspension_and_the_end(
    client: Any, receiver: Receiver
) -> None:
    thread = await client.threads.create()
    tid = thread["thread_id"]
    run = await client.runs.create(
        tid, "refund", input={"order_id": "A-1", "amount": 5}, webhook=receiver.url
    )
    received(receiver, 1)
    suspended = receiver.json(0)
    assert suspended["run_id"] == run["run_id"]
    assert suspended["status"] == "suspended"

    values = await client.runs.wait(
        tid, "refund", command={"resume": {"approved": True}}, webhook=receiver.url + "?end"
    )
    received(receiver, 2)
    ended = receiver.json(1)
    assert ended["run_id"] == run["run_id"]
    assert ended["status"] == "success"
    assert ended["values"] == values
    request = receiver.requests[1]
    timestamp = request["headers"]["x-runsite-timestamp"]
    mac = hmac.new(b"s3cret", timestamp.encode() + b"." + request["body"], hashlib.sha256)
    assert request["headers"]["x-runsite-signature"] == f"sha256={mac.hexdigest()}"


async def test_a_stateless_wait_with_a_webhook(client: Any, receiver: Receiver) -> None:
    values = await client.runs.wait(None, "echo", input="solo", webhook=receiver.url)
    received(receiver, 1)
    assert receiver.json(0)["status"] == "success"
    assert receiver.json(0)["values"] == values


async def test_the_sdk_gets_422_for_a_webhook_it_may_not_call(client: Any) -> None:
    with pytest.raises(UnprocessableEntityError) as refused:
        await client.runs.create(None, "echo", input="x", webhook="ftp://example.com/hook")
    assert "webhook" in str(refused.value)
    # runs.wait surfaces the same 422 as httpx's error (the SDK reads its body as a stream).
    with pytest.raises(httpx.HTTPStatusError) as waited:
        await client.runs.wait(None, "echo", input="x", webhook="ftp://example.com/hook")
    assert waited.value.response.status_code == 422
    assert await client.threads.search() == []  # nothing was created
