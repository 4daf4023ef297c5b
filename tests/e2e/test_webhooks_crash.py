"""The outbox with real worker processes on PostgreSQL: a worker SIGKILLed in the middle of a
POST loses no delivery (another worker sends it again once the claim's lease expires, with the
same id), and workers sending side by side (SKIP LOCKED) send each delivery once."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from typing import Any

import pytest

from runs import services
from runs.models import Delivery, RunStatus
from tests.helpers import wait_for
from tests.test_webhooks import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

WORKER_ENV = {
    "RUNS_WEBHOOK_ALLOW_PRIVATE": "1",  # the receiver is on loopback
    "RUNS_WEBHOOK_SECRET": "s3cret",
    "RUNS_WEBHOOK_TIMEOUT_SECONDS": "3",  # claim lease: 2 x 3 + 5 = 11 s
    "RUNS_WEBHOOK_BACKOFF_SECONDS": "0.1",
    "RUNS_POLL_SECONDS": "0.2",
    "RUNS_NOTIFY": "1",
}


@pytest.fixture(autouse=True)
def _allow_loopback(settings: Any) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = True  # this process creates the runs


@pytest.fixture
def receiver() -> Any:
    r = Receiver()
    yield r
    r.close()


def test_it_loses_no_delivery_when_a_worker_is_killed_mid_post(
    receiver: Receiver, start_worker: Any
) -> None:
    hung = threading.Event()
    release = threading.Event()
    original = receiver.server.RequestHandlerClass.do_POST  # type: ignore[attr-defined]

    def first_hangs(handler: Any) -> None:
        if not hung.is_set():
            hung.set()
            release.wait(30)  # the worker is killed while it waits for this answer
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = first_hangs  # type: ignore[attr-defined]
    first = start_worker(concurrency=2, **WORKER_ENV)
    thread = services.thread_create()
    run = services.run_create(
        agent_id="echo", actor=None, thread_id=thread.id, input="hi", webhook=receiver.url
    )
    assert hung.wait(20), first.output()
    first.signal(signal.SIGKILL)
    first.proc.wait(10)
    release.set()
    claimed = Delivery.objects.get()
    assert claimed.status == "pending" and claimed.attempts == 1 and claimed.locked_by

    start_worker(concurrency=2, **WORKER_ENV)
    sent = wait_for(
        lambda: Delivery.objects.filter(status="sent").first(), timeout=40, interval=0.2
    )
    assert sent.id == claimed.id
    assert sent.attempts == 2
    ids = [rq["headers"]["x-runsite-delivery"] for rq in receiver.requests]
    # Twice the same delivery (at least once): the receiver recognises the duplicate by its id.
    assert ids == [str(sent.id), str(sent.id)]
    assert receiver.json(1)["run_id"] == str(run.id)
    assert receiver.json(1)["status"] == RunStatus.SUCCESS


def test_workers_side_by_side_send_each_delivery_once(
    receiver: Receiver, start_worker: Any
) -> None:
    start_worker(concurrency=4, **WORKER_ENV)
    start_worker(concurrency=4, **WORKER_ENV)
    runs = []
    for i in range(20):
        thread = services.thread_create()
        runs.append(
            services.run_create(
                agent_id="echo", actor=None, thread_id=thread.id, input=i, webhook=receiver.url
            )
        )
    wait_for(
        lambda: Delivery.objects.filter(status="sent").count() == len(runs),
        timeout=60,
        interval=0.2,
    )
    ids = Counter(rq["headers"]["x-runsite-delivery"] for rq in receiver.requests)
    assert len(ids) == len(runs) and set(ids.values()) == {1}
    assert {receiver.json(i)["run_id"] for i in range(len(runs))} == {str(r.id) for r in runs}
    assert set(Delivery.objects.values_list("attempts", flat=True)) == {1}
