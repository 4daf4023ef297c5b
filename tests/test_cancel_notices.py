"""A cancel notice reaches the worker that holds the run, not every worker.

Every worker LISTENs on its own channel (`services.cancel_channel(owner)`) and on the shared
one. A cancel of a running run tells the run's lease owner on its channel, so one worker wakes
where all of them did (two workers on two cores: a harness cancel 0.2-0.5 ms sooner; a cluster
of many workers no longer wakes each one per cancel). These listen on PostgreSQL as the
workers do, with their own connections, and cancel through every path that tells a worker.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async as sync_to_async
from django.db import connection, transaction

from runs import services
from runs.exceptions import Conflict
from runs.models import Run, RunStatus, ToolCall
from runs.services.notices import cancel_channel_sql
from tests.helpers import asgi_request, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Listener:
    """A LISTEN connection of its own, as a worker's listener thread has."""

    def __init__(self, channel: str):
        self.conn = psycopg.connect(autocommit=True, **connection.get_connection_params())
        self.conn.execute(f"LISTEN {channel}")

    def heard(self) -> list[tuple[str, str]]:
        self.conn.execute("SELECT 1")  # notifications that came are read with any answer
        return [(n.channel, n.payload) for n in self.conn.notifies(timeout=0.2)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listeners():
    opened: list[Listener] = []

    def listen(channel: str) -> Listener:
        opened.append(Listener(channel))
        return opened[-1]

    yield listen
    for listener in opened:
        listener.close()


def running(owner: str, n: int = 1, *, on_threads: bool = True) -> list[Run]:
    """n `slow` runs claimed by the worker `owner`, each on a thread of its own."""
    for _ in range(n):
        thread_id = services.thread_create(metadata={}).id if on_threads else None
        kwargs = None if on_threads else {"on_completion": "keep"}
        services.run_create(
            agent_id="slow", thread_id=thread_id, input={"steps": 5}, actor="t", kwargs=kwargs
        )
    claimed = services.run_claim(owner=owner, limit=n)
    assert len(claimed) == n
    return [Run.objects.get(id=c.run.id) for c in claimed]


def test_the_channel_is_computed_alike_in_python_and_in_the_statement() -> None:
    owners = ["w1", "host-a:4242:9f3c01ab", "hôte:1:ü", "x" * 300]
    with connection.cursor() as cursor:
        for owner in [*owners, None, ""]:
            cursor.execute(
                f"SELECT {cancel_channel_sql('o')} FROM (SELECT %s::text AS o) x", [owner]
            )
            assert cursor.fetchone()[0] == services.cancel_channel(owner)
    assert services.cancel_channel(None) == services.CANCEL_CHANNEL
    names = {services.cancel_channel(o) for o in owners}
    assert len(names) == len(owners)  # one channel per worker
    assert all(len(name) <= 63 and name.isidentifier() for name in names)
    # The worker's listener stops runs on these, and only these.
    assert all(services.is_cancel_channel(name) for name in [*names, services.CANCEL_CHANNEL])
    assert not services.is_cancel_channel(services.QUEUE_CHANNEL)
    assert not services.is_cancel_channel("runsite_queue_handoff")


def test_a_cancel_on_a_thread_tells_the_runs_worker_alone(listeners, support) -> None:
    mine, other, shared = (
        listeners(services.cancel_channel("w1")),
        listeners(services.cancel_channel("w2")),
        listeners(services.CANCEL_CHANNEL),
    )
    interrupted, rolled_back = running("w1", 2)
    for run, action in ((interrupted, "interrupt"), (rolled_back, "rollback")):
        services.run_cancel_on_thread(
            thread_id=run.thread_id, run_id=run.id, action=action, actor=support
        )
    assert mine.heard() == [
        (services.cancel_channel("w1"), f"{interrupted.id}=interrupt"),
        (services.cancel_channel("w1"), f"{rolled_back.id}=rollback"),
    ]
    assert other.heard() == [] and shared.heard() == []


def test_a_cancel_by_run_and_a_bulk_cancel_tell_each_runs_worker(listeners, support) -> None:
    w1, w2, shared = (
        listeners(services.cancel_channel("w1")),
        listeners(services.cancel_channel("w2")),
        listeners(services.CANCEL_CHANNEL),
    )
    (single,) = running("w1", 1, on_threads=False)
    services.run_cancel(run=single, action="interrupt", actor=support)
    assert w1.heard() == [(services.cancel_channel("w1"), f"{single.id}=interrupt")]
    assert w2.heard() == []

    first, second = running("w1", 2), running("w2", 1)
    pending = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    result = services.runs_cancel_many(action="interrupt", actor=support, status="all")
    assert set(result.interrupted) == {r.id for r in [*first, *second]} | {pending.id}
    ((channel, payload),) = w1.heard()
    assert channel == services.cancel_channel("w1")
    assert sorted(payload.split(",")) == sorted(f"{r.id}=interrupt" for r in first)
    assert w2.heard() == [(services.cancel_channel("w2"), f"{second[0].id}=interrupt")]
    assert shared.heard() == []  # the pending run has no worker to tell


def test_deleting_a_thread_tells_the_worker_of_its_running_run(listeners, support) -> None:
    w1, w2 = listeners(services.cancel_channel("w1")), listeners(services.cancel_channel("w2"))
    (run,) = running("w1")
    services.thread_delete(thread=run.thread, actor=support)
    assert w1.heard() == [(services.cancel_channel("w1"), f"{run.id}=rollback")]
    assert w2.heard() == []
    assert not Run.objects.filter(id=run.id).exists()


def test_a_run_no_worker_holds_is_told_on_the_shared_channel(listeners, support) -> None:
    shared = listeners(services.CANCEL_CHANNEL)
    (run,) = running("w1")
    # A running row without an owner (as an older version could leave): every worker hears it.
    Run.objects.filter(id=run.id).update(lease_owner=None)
    services.run_cancel(run=Run.objects.get(id=run.id), action="interrupt", actor=support)
    assert shared.heard() == [(services.CANCEL_CHANNEL, f"{run.id}=interrupt")]
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED


# --- notices held for after a request's answer (services/notices.py) --------------------------


def test_within_a_hold_a_cancel_keeps_its_notice_for_after_the_answer(listeners, support) -> None:
    """Every path that tells a worker keeps its notice instead, from its commit on; sent
    later, the notices are the ones the statements would have sent."""
    w1, w2 = listeners(services.cancel_channel("w1")), listeners(services.cancel_channel("w2"))
    at_once, deleted_with_thread = running("w1", 2)
    (stateless,) = running("w1", 1, on_threads=False)
    bulk = running("w2", 2)
    with services.cancel_notices_held() as kept:
        services.run_cancel_on_thread(
            thread_id=at_once.thread_id, run_id=at_once.id, action="rollback", actor=support
        )
        services.run_cancel(run=stateless, action="interrupt", actor=support)
        services.thread_delete(thread=deleted_with_thread.thread, actor=support)
        services.runs_cancel_many(action="interrupt", actor=support, run_ids=[r.id for r in bulk])
        assert w1.heard() == [] and w2.heard() == []  # all committed, none sent
    assert Run.objects.get(id=stateless.id).status == RunStatus.INTERRUPTED
    assert not Run.objects.filter(id__in=[at_once.id, deleted_with_thread.id]).exists()
    channel1, channel2 = services.cancel_channel("w1"), services.cancel_channel("w2")
    assert kept[:3] == [
        (channel1, f"{at_once.id}=rollback"),
        (channel1, f"{stateless.id}=interrupt"),
        (channel1, f"{deleted_with_thread.id}=rollback"),
    ]
    ((channel, payload),) = kept[3:]
    assert channel == channel2 and sorted(payload.split(",")) == sorted(
        f"{r.id}=interrupt" for r in bulk
    )
    services.send_cancel_notices(kept)
    assert w1.heard() == kept[:3] and w2.heard() == kept[3:]


def test_a_hold_keeps_nothing_of_a_cancel_that_did_not_happen(listeners, support) -> None:
    w1 = listeners(services.cancel_channel("w1"))
    refused, rolled_back = running("w1", 2)
    services.run_cancel(run=refused, action="interrupt", actor=support)
    w1.heard()
    with services.cancel_notices_held() as kept:
        with pytest.raises(Conflict):  # already interrupted
            services.run_cancel_on_thread(
                thread_id=refused.thread_id, run_id=refused.id, action="interrupt", actor=support
            )
        with pytest.raises(RuntimeError), transaction.atomic():
            services.run_cancel(run=rolled_back, action="interrupt", actor=support)
            raise RuntimeError("the transaction rolls back")
    assert kept == [] and w1.heard() == []
    assert Run.objects.get(id=rolled_back.id).status == RunStatus.RUNNING


def test_a_hold_left_by_an_error_sends_what_it_kept(listeners, support) -> None:
    w1 = listeners(services.cancel_channel("w1"))
    (run,) = running("w1")
    with pytest.raises(RuntimeError), services.cancel_notices_held():
        services.run_cancel(run=run, action="interrupt", actor=support)
        raise RuntimeError("the request failed after its cancel committed")
    assert w1.heard() == [(services.cancel_channel("w1"), f"{run.id}=interrupt")]


def test_a_notice_postgresql_refuses_is_logged_not_raised(listeners, caplog) -> None:
    w1 = listeners(services.cancel_channel("w1"))
    too_long = "x" * 9000  # PostgreSQL's limit on a payload is 8000 bytes
    services.send_cancel_notices([(services.cancel_channel("w1"), too_long)])
    assert "cancel notice(s) to workers not sent" in caplog.text
    assert w1.heard() == []


async def test_an_api_cancel_tells_the_worker_once_its_answer_has_gone(listeners, key) -> None:
    """Through the ASGI application a server runs: when the answer's body is sent, the
    worker's channel has heard nothing yet; right after, it hears the cancel (single, both
    actions, and bulk)."""
    w1 = await sync_to_async(listeners)(services.cancel_channel("w1"))
    runs = await sync_to_async(running)("w1", 3)
    calls = [
        (f"/api/threads/{runs[0].thread_id}/runs/{runs[0].id}/cancel", b"wait=1", None),
        (f"/api/threads/{runs[1].thread_id}/runs/{runs[1].id}/cancel", b"action=rollback", None),
        ("/api/runs/cancel", b"", {"run_ids": [str(runs[2].id)], "action": "interrupt"}),
    ]
    expected = [f"{runs[0].id}=interrupt", f"{runs[1].id}=rollback", f"{runs[2].id}=interrupt"]
    for (path, query, body), payload in zip(calls, expected, strict=True):
        heard_at_answer: list[list[tuple[str, str]]] = []

        def at_answer() -> None:
            heard_at_answer.append(w1.heard())

        status = await cancel_served(path, query, body, key, at_answer)
        assert status in (200, 202, 204)
        assert heard_at_answer == [[]]
        heard = await sync_to_async(heard_soon)(w1)
        assert heard == [(services.cancel_channel("w1"), payload)]
    assert await sync_to_async(Run.objects.filter(status=RunStatus.RUNNING).count)() == 0


def test_a_worker_stops_a_run_cancelled_through_the_api_on_its_notice(
    start_worker, key, settings
) -> None:
    """A real worker whose heartbeat is 30 s away and whose run's tool sleeps for 30 s without
    a write: only the notice sent after the answer can stop it within seconds."""
    worker = start_worker(concurrency=1, RUNS_HEARTBEAT_SECONDS="30", RUNS_LEASE_SECONDS="60")
    thread = services.thread_create()
    run = services.run_create(
        agent_id="slow", thread_id=thread.id, input={"steps": 1, "delay_ms": 30_000}, actor="t"
    )
    wait_for(lambda: ToolCall.objects.filter(run=run, status="running").exists())
    status = async_to_sync(cancel_served)(
        f"/api/threads/{thread.id}/runs/{run.id}/cancel", b"wait=1", None, key, lambda: None
    )
    assert status == 200
    wait_for(lambda: f"cancelled run={run.id}" in worker.output())
    assert Run.objects.get(id=run.id).status == RunStatus.INTERRUPTED


def heard_soon(listener: Listener, seconds: float = 2.0) -> list[tuple[str, str]]:
    deadline = time.monotonic() + seconds
    heard: list[tuple[str, str]] = []
    while not heard and time.monotonic() < deadline:
        heard = listener.heard()
    return heard


@pytest.fixture
def key(settings: Any) -> str:
    settings.RUNS_API_AUTH = True
    return services.api_key_create(name="notices")[1]


async def cancel_served(path: str, query: bytes, body: Any, key: str, at_answer: Any) -> int:
    """A POST through the ASGI application; `at_answer()` is called (on the event loop) as
    the answer's last body message is sent. Returns the answer's status."""

    def on_send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            at_answer()

    return await asgi_request("POST", path, key, query=query, body=body, on_send=on_send)
