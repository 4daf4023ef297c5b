"""Following a run to its end (wait, join): the database is read when the run may have ended,
not on every change it publishes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async

from runs import live, selectors, services
from runs.api import streaming
from runs.hub import hub
from runs.ids import uuid7
from runs.models import Run, RunStatus

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Every read of a followed run's state, with the status it saw (the real read runs)."""
    seen: list[str | None] = []

    def spying(real: Any) -> Any:
        def spy(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            seen.append(result[0])
            return result

        return spy

    # A stream reads its events; a wait or join only the run's outcome.
    for name in ("run_stream_state", "run_outcome"):
        monkeypatch.setattr(selectors, name, spying(getattr(selectors, name)))
    # Only published changes drive reads here; the poll (the safety net for a lost message)
    # would read on its own schedule.
    monkeypatch.setattr(streaming, "POLL_SECONDS", 30.0)
    monkeypatch.setattr(streaming, "HEARTBEAT_SECONDS", 30.0)
    return seen


async def body_of(chunks: Any) -> Any:
    parts = [chunk async for chunk in chunks]
    return json.loads(b"".join(parts).strip())


def announce(run_id: Any, status: str) -> None:
    """A change published as a worker's claim publishes it (the row itself is left alone)."""
    run = Run.objects.get(id=run_id)
    live.publish(
        live.RunChange(
            run_id=str(run.id),
            thread_id=str(run.thread_id),
            agent_id=run.agent_id,
            status=status,
            seq=run.last_seq,
        )
    )


async def test_a_wait_watched_from_before_the_create_reads_once_when_the_run_ends(
    reads, drain
) -> None:
    live.bind_server_loop(asyncio.get_running_loop())
    run_id = uuid7()
    waiter = hub().watch(run_id)
    run = await sync_to_async(services.run_create)(
        agent_id="echo", input={"say": "hi"}, actor="t", run_id=run_id
    )
    assert run.id == run_id
    body = asyncio.ensure_future(
        body_of(streaming.result_body(run.id, thread_id=run.thread_id, waiter=waiter))
    )
    await asyncio.sleep(0.2)
    assert reads == []  # the create left it pending: nothing to read yet
    await sync_to_async(announce)(run.id, RunStatus.RUNNING)
    await asyncio.sleep(0.2)
    assert reads == []  # "running" cannot end a wait
    await sync_to_async(drain)()  # the worker runs it to its end
    result = await asyncio.wait_for(body, timeout=10)
    assert result["output"] == {"echo": {"say": "hi"}}
    assert reads == [RunStatus.SUCCESS]
    assert hub().waiting() == 0


async def test_join_reads_first_then_only_when_the_run_may_have_ended(reads, drain) -> None:
    live.bind_server_loop(asyncio.get_running_loop())
    run = await sync_to_async(services.run_create)(agent_id="echo", input=7, actor="t")
    body = asyncio.ensure_future(body_of(streaming.result_body(run.id, thread_id=run.thread_id)))
    await asyncio.sleep(0.2)
    assert reads == [RunStatus.PENDING]  # registered, then read: a change before it is seen
    await sync_to_async(announce)(run.id, RunStatus.RUNNING)
    await asyncio.sleep(0.2)
    assert reads == [RunStatus.PENDING]
    await sync_to_async(drain)()
    assert (await asyncio.wait_for(body, timeout=10))["output"] == {"echo": 7}
    assert reads == [RunStatus.PENDING, RunStatus.SUCCESS]


async def test_a_join_of_a_run_that_ended_answers_from_the_read_it_was_given(reads, drain) -> None:
    live.bind_server_loop(asyncio.get_running_loop())
    run = await sync_to_async(services.run_create)(agent_id="echo", input=3, actor="t")
    await sync_to_async(drain)()
    known = await sync_to_async(selectors.run_outcome)(run.id, thread_id=run.thread_id)
    assert reads == [RunStatus.SUCCESS]

    body = streaming.result_body(run.id, thread_id=run.thread_id, known=known)
    assert (await asyncio.wait_for(body_of(body), timeout=5))["output"] == {"echo": 3}
    assert reads == [RunStatus.SUCCESS]  # no second read, no waiting on the hub
    assert hub().waiting() == 0


async def test_a_stream_reads_on_every_change_for_its_events(reads, drain) -> None:
    live.bind_server_loop(asyncio.get_running_loop())
    run = await sync_to_async(services.run_create)(agent_id="echo", input=1, actor="t")
    frames = streaming.sse_events(run.id, modes=["values"], after=0, attempt=1)
    collected = asyncio.ensure_future(body_of_frames(frames))
    await asyncio.sleep(0.2)
    await sync_to_async(announce)(run.id, RunStatus.RUNNING)
    await asyncio.sleep(0.2)
    assert reads == [RunStatus.PENDING, RunStatus.PENDING]  # a change may carry events
    await sync_to_async(drain)()
    text = await asyncio.wait_for(collected, timeout=10)
    assert "event: end" in text and '"status":"success"' in text


async def body_of_frames(chunks: Any) -> str:
    return b"".join([chunk async for chunk in chunks]).decode()


async def _followed_to_its_end(agent_id: str, input: Any, drain: Any) -> tuple[Run, Any]:
    """A run waited for as /wait waits (watched before its create, from the seq it was created
    at), executed by the worker; (the run, the body the wait answered)."""
    live.bind_server_loop(asyncio.get_running_loop())
    run_id = uuid7()
    waiter = hub().watch(run_id)
    run = await sync_to_async(services.run_create)(
        agent_id=agent_id, input=input, actor="t", run_id=run_id
    )
    body = asyncio.ensure_future(
        body_of(
            streaming.result_body(
                run.id, thread_id=run.thread_id, waiter=waiter, seq_floor=run.last_seq
            )
        )
    )
    await asyncio.sleep(0.1)
    await sync_to_async(drain)()
    return run, await asyncio.wait_for(body, timeout=10)


async def test_a_wait_answers_a_suspension_from_the_change_that_carried_it(reads, drain) -> None:
    run, result = await _followed_to_its_end("refund", {"order_id": "A1", "amount": 5}, drain)
    assert reads == []  # the suspension's change carried the body: nothing read back
    status, _, expected = await sync_to_async(selectors.run_outcome)(run.id)
    assert status == RunStatus.SUSPENDED
    assert result == json.loads(json.dumps(expected, default=str))
    [interrupt] = result["__interrupt__"]
    assert interrupt["value"]["tool_name"] == "issue_refund"


async def test_a_wait_answers_a_success_from_the_change_that_carried_it(reads, drain) -> None:
    run, result = await _followed_to_its_end("echo", {"say": "hi"}, drain)
    assert reads == []
    status, _, expected = await sync_to_async(selectors.run_outcome)(run.id)
    assert status == RunStatus.SUCCESS
    assert result == json.loads(json.dumps(expected, default=str))
    assert result["output"] == {"echo": {"say": "hi"}}


async def test_a_carried_end_older_than_what_the_caller_read_is_not_answered(reads, drain) -> None:
    """A change overtaken on its way (another process published a newer one, which the caller
    read) must not answer for the run: the follower reads it instead."""
    live.bind_server_loop(asyncio.get_running_loop())
    run = await sync_to_async(services.run_create)(agent_id="echo", input=5, actor="t")
    # As join does: watched, then read (here as if the read saw one change more than the one
    # published below).
    waiter = hub().watch(run.id)
    known = await sync_to_async(selectors.run_outcome)(run.id, thread_id=run.thread_id)
    follow = streaming.result_body(
        run.id, thread_id=run.thread_id, waiter=waiter, known=known, seq_floor=run.last_seq + 1
    )
    body = asyncio.ensure_future(body_of(follow))
    await asyncio.sleep(0.2)
    assert reads == [RunStatus.PENDING]
    stale = live.RunChange(
        run_id=str(run.id),
        thread_id=str(run.thread_id),
        agent_id=run.agent_id,
        status=RunStatus.SUCCESS,
        seq=run.last_seq,
        attempt=1,
        outcome={"stale": True},
    )
    await sync_to_async(live.publish)(stale)
    await asyncio.sleep(0.2)
    assert reads == [RunStatus.PENDING, RunStatus.PENDING]  # woken, read, still going
    await sync_to_async(drain)()
    assert (await asyncio.wait_for(body, timeout=10))["output"] == {"echo": 5}
    assert reads == [RunStatus.PENDING, RunStatus.PENDING, RunStatus.SUCCESS]
