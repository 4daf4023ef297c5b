"""The LangGraph-compatible API, driven only through the official `langgraph_sdk` client against a
real server (Daphne, and uvicorn: every_server) with its worker (the reference's method table, call by call)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError

from runs.engine import Agent, FinalAnswer, ProposedCall, ScriptedModel, ToolCalls, tool
from runs.engine.context import NonRetryableError

pytestmark = [pytest.mark.e2e, pytest.mark.every_server]

SLOW = {"steps": 50, "delay_ms": 50}  # ~3 s: long enough to catch it running, short to finish
REJECT_TEXT = "Thread is already running a task"


# Extra agents the server loads through RUNS_AGENTS (see `site` below).


@tool(description="Reports progress as custom stream events.")
def report(ctx: Any, parts: int) -> dict[str, int]:
    for i in range(parts):
        ctx.emit({"progress": i + 1, "of": parts})
    return {"parts": parts}


def _emitter_script(state: Any) -> ToolCalls | FinalAnswer:
    if state.last_result("report") is None:
        return ToolCalls([ProposedCall("report", {"parts": 3})])
    return FinalAnswer(output={"reported": 3})


def _broken_script(state: Any) -> FinalAnswer:
    raise NonRetryableError("this agent always fails")


EXTRA_AGENTS = [
    Agent(id="emitter", tools=[report], model=ScriptedModel(_emitter_script)),
    Agent(id="broken", model=ScriptedModel(_broken_script)),
]


@pytest.fixture
def site(site_factory: Callable[..., Any]) -> Any:
    return site_factory(
        RUNS_AGENTS="runs.agents.BUILTIN_AGENTS,tests.e2e.test_sdk.EXTRA_AGENTS",
        RUNS_POLL_SECONDS="0.2",
    )


@pytest.fixture
def client(site: Any) -> Any:
    return get_client(url=site.url + "/api", api_key=None)


async def until(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.05)


async def status_of(client: Any, thread_id: str, run_id: str) -> str:
    return (await client.runs.get(thread_id, run_id))["status"]


async def running_slow_run(client: Any, thread_id: str, **kwargs: Any) -> dict[str, Any]:
    run = await client.runs.create(thread_id, "slow", input=SLOW, **kwargs)

    async def is_running() -> bool:
        return await status_of(client, thread_id, run["run_id"]) == "running"

    await until(is_running)
    return run


# --- assistants and threads --------------------------------------------------------------------


async def test_it_serves_assistants_and_thread_crud(client: Any) -> None:
    found = await client.assistants.search(limit=100)
    by_graph = {a["graph_id"]: a for a in found}
    assert {"echo", "refund", "slow", "weather"} <= set(by_graph)
    echo_id = by_graph["echo"]["assistant_id"]
    assert echo_id == str(uuid.uuid5(uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8"), "echo"))
    assert (await client.assistants.get(echo_id))["graph_id"] == "echo"
    assert (await client.assistants.get("echo"))["assistant_id"] == echo_id
    schemas = await client.assistants.get_schemas("refund")
    assert schemas["input_schema"]["required"] == ["order_id", "amount"]
    graph = await client.assistants.get_graph("refund")
    assert {n["id"] for n in graph["nodes"]} >= {"agent", "tools"}
    with pytest.raises(NotFoundError):
        await client.assistants.get("no-such-agent")

    tid = str(uuid.uuid4())
    thread = await client.threads.create(thread_id=tid, metadata={"team": "a", "n": 1})
    assert thread["thread_id"] == tid
    assert thread["status"] == "idle"
    with pytest.raises(ConflictError):
        await client.threads.create(thread_id=tid)
    again = await client.threads.create(thread_id=tid, if_exists="do_nothing")
    assert again["metadata"] == {"team": "a", "n": 1}
    other = await client.threads.create(metadata={"team": "b"}, graph_id="echo")
    assert other["metadata"]["graph_id"] == "echo"

    updated = await client.threads.update(tid, metadata={"n": 2, "extra": True})
    assert updated["metadata"] == {"team": "a", "n": 2, "extra": True}
    assert (await client.threads.get(tid))["metadata"]["n"] == 2

    hits = await client.threads.search(metadata={"team": "a"})
    assert [t["thread_id"] for t in hits] == [tid]
    assert len(await client.threads.search(ids=[tid, other["thread_id"]])) == 2
    assert len(await client.threads.search(limit=1, offset=1)) == 1
    assert await client.threads.count() == 2
    assert await client.threads.count(metadata={"team": "b"}) == 1
    assert await client.threads.count(status="busy") == 0

    state = await client.threads.get_state(tid)
    assert state["values"] == {} and state["next"] == [] and state["checkpoint"] is None

    await client.threads.delete(other["thread_id"])
    with pytest.raises(NotFoundError):
        await client.threads.get(other["thread_id"])
    with pytest.raises(UnprocessableEntityError) as bad:
        await client.threads.get("not-a-uuid")
    assert "Invalid thread ID: must be a UUID" in str(bad.value)


# --- runs: create, wait, join, list, get, delete, stateless, batch, state ------------------------


async def test_it_creates_waits_joins_lists_and_deletes_runs(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    created: list[dict[str, Any]] = []
    run = await client.runs.create(
        tid, "echo", input={"hi": 1}, metadata={"who": "t"}, on_run_created=created.append
    )
    assert run["status"] == "pending"
    assert run["metadata"]["who"] == "t"
    assert created == [{"run_id": run["run_id"], "thread_id": tid}]
    joined = await client.runs.join(tid, run["run_id"])
    assert joined["output"] == {"echo": {"hi": 1}}
    assert await status_of(client, tid, run["run_id"]) == "success"

    values = await client.runs.wait(tid, "echo", input={"hi": 2})
    assert values["output"] == {"echo": {"hi": 2}}
    assert len(values["messages"]) == 4  # the thread keeps the first run's messages

    listed = await client.runs.list(tid)
    assert [r["status"] for r in listed] == ["success", "success"]
    assert listed[1]["run_id"] == run["run_id"]  # newest first
    assert len(await client.runs.list(tid, limit=1, offset=1)) == 1
    assert await client.runs.list(tid, status="error") == []

    history = await client.threads.get_history(tid)
    assert history[0]["values"] == values
    assert history[0]["metadata"]["run_id"] != history[-1]["metadata"]["run_id"]
    older = await client.threads.get_history(tid, before=history[0]["checkpoint"], limit=1)
    assert older[0]["checkpoint_id"] == history[1]["checkpoint_id"]
    state = await client.threads.get_state(tid)
    assert state["values"] == values
    at = await client.threads.get_state(tid, checkpoint_id=history[1]["checkpoint_id"])
    assert at["values"] == history[1]["values"]
    at = await client.threads.get_state(tid, checkpoint=history[1]["checkpoint"])
    assert at["checkpoint_id"] == history[1]["checkpoint_id"]

    update = await client.threads.update_state(tid, {"note": "hand-written"})
    assert update["checkpoint"]["checkpoint_id"]
    assert (await client.threads.get_state(tid))["values"]["note"] == "hand-written"

    await client.runs.delete(tid, run["run_id"])
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, run["run_id"])

    stateless = await client.runs.wait(None, "echo", input="solo")
    assert stateless["output"] == {"echo": "solo"}
    background = await client.runs.create(None, "echo", input="bg")
    assert background["thread_id"]
    assert (await client.runs.join(background["thread_id"], background["run_id"]))["output"]
    batch = await client.runs.create_batch([{"assistant_id": "echo", "input": i} for i in range(3)])
    assert [r["status"] for r in batch] == ["pending"] * 3
    parts = [p async for p in client.runs.stream(None, "echo", input="s")]
    assert parts[0].event == "metadata" and parts[-1].event == "end"

    with pytest.raises(NotFoundError):
        await client.runs.create(str(uuid.uuid4()), "echo", input=1)
    new_tid = str(uuid.uuid4())
    created_thread_values = await client.runs.wait(new_tid, "echo", input=1, if_not_exists="create")
    assert created_thread_values["output"] == {"echo": 1}
    assert (await client.threads.get(new_tid))["metadata"]["graph_id"] == "echo"
    with pytest.raises(UnprocessableEntityError):
        await client.runs.create(tid, "no-such-agent", input=1)


async def test_it_starts_a_run_after_seconds(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    started = time.monotonic()
    run = await client.runs.create(tid, "echo", input=1, after_seconds=1)
    assert await status_of(client, tid, run["run_id"]) == "pending"
    await client.runs.join(tid, run["run_id"])
    assert time.monotonic() - started >= 0.9
    assert await status_of(client, tid, run["run_id"]) == "success"


# --- streaming ---------------------------------------------------------------------------------


async def test_it_streams_values_updates_custom_and_errors(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            tid, "echo", input={"q": 1}, stream_mode=["values", "updates"]
        )
    ]
    events = [p.event for p in parts]
    assert events[0] == "metadata"
    assert parts[0].data["attempt"] == 1
    assert sorted(events[1:-2]) == ["updates", "values"] and events[-2:] == ["values", "end"]
    (update,) = [p.data for p in parts if p.event == "updates"]
    assert update == {
        "agent": {
            "messages": [{"role": "assistant", "content": {"echo": {"q": 1}}}],
            "output": {"echo": {"q": 1}},
        }
    }
    assert parts[-2].data["output"] == {"echo": {"q": 1}}
    assert parts[-1].data == {"run_id": parts[0].data["run_id"], "status": "success"}

    custom = [p async for p in client.runs.stream(tid, "emitter", stream_mode="custom")]
    assert [p.data for p in custom if p.event == "custom"] == [
        {"progress": 1, "of": 3},
        {"progress": 2, "of": 3},
        {"progress": 3, "of": 3},
    ]
    v2 = [p async for p in client.runs.stream(tid, "echo", input=2, version="v2")]
    assert [p["type"] for p in v2] == ["metadata", "values", "values"]

    failed = [p async for p in client.runs.stream(tid, "broken", input=1)]
    error = next(p for p in failed if p.event == "error")
    assert error.data == {"error": "NonRetryableError", "message": "this agent always fails"}
    with pytest.raises(Exception, match="NonRetryableError: this agent always fails"):
        await client.runs.wait(tid, "broken", input=1)
    run = (await client.runs.list(tid, limit=1))[0]
    assert (await client.runs.join(tid, run["run_id"]))["__error__"]["error"] == (
        "NonRetryableError"
    )
    assert (await client.threads.get(tid))["status"] == "error"


async def test_it_joins_a_stream_and_replays_after_last_event_id(client: Any, site: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    run = await client.runs.create(
        tid,
        "slow",
        input={"steps": 4, "delay_ms": 20},
        stream_mode=["values", "updates"],
        stream_resumable=True,
    )
    full = [p async for p in client.runs.join_stream(tid, run["run_id"], last_event_id="-1")]
    assert full[0].event == "metadata" and full[-1].event == "end"
    ids = [int(p.id) for p in full[1:-1]]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
    middle = full[len(full) // 2]
    tail = [
        p
        async for p in client.runs.join_stream(
            tid, run["run_id"], last_event_id=middle.id, stream_mode=["values", "updates"]
        )
    ]
    assert [(p.event, p.id) for p in tail[1:-1]] == [
        (p.event, p.id) for p in full[1:-1] if int(p.id) > int(middle.id)
    ]
    only_values = [
        p
        async for p in client.runs.join_stream(
            tid, run["run_id"], last_event_id="-1", stream_mode="values"
        )
    ]
    assert {p.event for p in only_values} == {"metadata", "values", "end"}
    # A finished run without Last-Event-ID: an empty stream that closes.
    finished = [p async for p in client.runs.join_stream(tid, run["run_id"])]
    assert [p.event for p in finished] == ["metadata", "end"]

    # The same replay with the raw header, and a JSON-array stream_mode, over plain HTTP.
    async with httpx.AsyncClient(base_url=site.url + "/api") as http:
        r = await http.get(
            f"/threads/{tid}/runs/{run['run_id']}/stream",
            params={"stream_mode": '["updates"]'},
            headers={"Last-Event-ID": middle.id},
        )
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["location"] == f"/threads/{tid}/runs/{run['run_id']}/stream"
    assert "\r\nid: " in r.text and "event: values" not in r.text


async def test_the_real_server_limits_and_checks_bodies(site: Any) -> None:
    async with httpx.AsyncClient(base_url=site.url + "/api") as http:
        big = await http.post("/threads", json={"metadata": {"blob": "x" * 2_000_000}})
        assert big.status_code == 413
        assert big.json()["code"] == "payload_too_large"
        bad = await http.post(
            "/threads", content=b"{oops", headers={"content-type": "application/json"}
        )
        assert bad.status_code == 422 and bad.json()["code"] == "invalid_json"
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        run = (await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo"})).json()
        empty = await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel")  # no body at all
        assert empty.status_code in (202, 409)  # 409 if the echo run already finished


async def test_it_cancels_a_stream_when_the_client_goes_away(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    stream = client.runs.stream(tid, "slow", input=SLOW, on_disconnect="cancel")
    run_id = None
    async for part in stream:
        if part.event == "metadata":
            run_id = part.data["run_id"]
        if part.event == "values":
            break
    await stream.aclose()  # closes the connection mid-stream

    async def interrupted() -> bool:
        return await status_of(client, tid, run_id) == "interrupted"

    await until(interrupted)
    run = await client.runs.get(tid, run_id)
    assert "on_disconnect=cancel" in run["cancel_reason"]

    # join_stream(cancel_on_disconnect=True) on a running run does the same.
    other = await running_slow_run(client, tid)
    joined = client.runs.join_stream(tid, other["run_id"], cancel_on_disconnect=True)
    async for part in joined:
        if part.event == "metadata":
            break
    await joined.aclose()

    async def other_interrupted() -> bool:
        return await status_of(client, tid, other["run_id"]) == "interrupted"

    await until(other_interrupted)

    # The default (continue) leaves the run going.
    third = client.runs.stream(tid, "slow", input={"steps": 3, "delay_ms": 20})
    async for part in third:
        if part.event == "metadata":
            third_id = part.data["run_id"]
            break
    await third.aclose()
    await client.runs.join(tid, third_id)
    assert await status_of(client, tid, third_id) == "success"


async def test_it_cancels_a_wait_when_the_client_goes_away(site: Any, client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    # A run of ~30 s and a client that gives up after 3 s: long enough for a loaded machine to
    # have created the run before the client leaves, far shorter than the run.
    long_run = {"steps": 600, "delay_ms": 50}
    async with httpx.AsyncClient(base_url=site.url + "/api", timeout=3.0) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                f"/threads/{tid}/runs/wait",
                json={"assistant_id": "slow", "input": long_run, "on_disconnect": "cancel"},
            )

    async def interrupted() -> bool:
        runs = await client.runs.list(tid)
        return runs and runs[0]["status"] == "interrupted"

    await until(interrupted)


# --- cancellation ------------------------------------------------------------------------------


async def test_it_cancels_with_interrupt_and_rollback(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    first = await client.runs.wait(tid, "echo", input="before")
    history_before = await client.threads.get_history(tid, limit=100)

    run = await running_slow_run(client, tid)

    async def its_first_checkpoint() -> bool:  # "running" comes before its first step's write
        history = await client.threads.get_history(tid, limit=100)
        return history[0]["metadata"]["run_id"] == run["run_id"]

    await until(its_first_checkpoint)
    body = await client.runs.cancel(tid, run["run_id"], wait=True, action="interrupt")
    assert body["messages"][:2] == first["messages"]
    cancelled = await client.runs.get(tid, run["run_id"])
    assert cancelled["status"] == "interrupted"
    assert (await client.threads.get(tid))["status"] == "idle"
    # Interrupt keeps the run's checkpoints.
    history_after_interrupt = await client.threads.get_history(tid, limit=100)
    assert len(history_after_interrupt) > len(history_before)
    assert history_after_interrupt[0]["metadata"]["run_id"] == run["run_id"]
    with pytest.raises(ConflictError):  # deliberate difference: 409 for a finished run
        await client.runs.cancel(tid, run["run_id"])

    state_before = (await client.threads.get_state(tid))["values"]
    doomed = await running_slow_run(client, tid)
    body = await client.runs.cancel(tid, doomed["run_id"], wait=True, action="rollback")
    assert body == state_before
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, doomed["run_id"])
    history_after_rollback = await client.threads.get_history(tid, limit=100)
    assert [h["checkpoint_id"] for h in history_after_rollback] == [
        h["checkpoint_id"] for h in history_after_interrupt
    ]
    assert (await client.threads.get_state(tid))["values"] == state_before

    # wait=False answers 202 with no body (the SDK returns None); a pending run stops at once.
    queued = await client.runs.create(tid, "echo", input=1, after_seconds=30)
    assert await client.runs.cancel(tid, queued["run_id"]) is None
    assert await status_of(client, tid, queued["run_id"]) == "interrupted"


async def test_it_cancels_many_by_ids_and_by_status(client: Any) -> None:
    tids = [(await client.threads.create())["thread_id"] for _ in range(3)]
    runs = [await running_slow_run(client, t) for t in tids]
    await client.runs.cancel_many(thread_id=tids[0], run_ids=[runs[0]["run_id"]])

    async def first_stopped() -> bool:
        return await status_of(client, tids[0], runs[0]["run_id"]) == "interrupted"

    assert await first_stopped()  # ended by the call itself, running or not
    assert await status_of(client, tids[1], runs[1]["run_id"]) == "running"

    await client.runs.cancel_many(status="running", action="interrupt")

    async def all_stopped() -> bool:
        statuses = [
            await status_of(client, t, r["run_id"]) for t, r in zip(tids, runs, strict=True)
        ]
        return statuses == ["interrupted"] * 3

    assert await all_stopped()

    doomed = await running_slow_run(client, tids[0])
    await client.runs.cancel_many(status="all", action="rollback")

    async def gone() -> bool:
        try:
            await client.runs.get(tids[0], doomed["run_id"])
        except NotFoundError:
            return True
        return False

    assert await gone()
    with pytest.raises(UnprocessableEntityError):
        await client.runs.cancel_many(thread_id=tids[0], status="all")


async def test_it_applies_multitask_strategies(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    first = await running_slow_run(client, tid)
    with pytest.raises(ConflictError) as rejected:
        await client.runs.create(tid, "echo", input=1, multitask_strategy="reject")
    assert REJECT_TEXT in str(rejected.value)

    second = await client.runs.create(tid, "echo", input="second", multitask_strategy="interrupt")
    await client.runs.join(tid, second["run_id"])
    assert await status_of(client, tid, first["run_id"]) == "interrupted"
    assert await status_of(client, tid, second["run_id"]) == "success"

    third = await running_slow_run(client, tid)
    fourth = await client.runs.wait(tid, "echo", input="fourth", multitask_strategy="rollback")
    assert fourth["output"] == {"echo": "fourth"}
    with pytest.raises(NotFoundError):
        await client.runs.get(tid, third["run_id"])

    fifth = await running_slow_run(client, tid, multitask_strategy="enqueue")
    sixth = await client.runs.create(tid, "echo", input="sixth")
    assert await status_of(client, tid, sixth["run_id"]) == "pending"
    with pytest.raises(ConflictError):  # a busy thread refuses a hand-written state
        await client.threads.update_state(tid, {"x": 1})
    await client.runs.join(tid, sixth["run_id"])
    assert await status_of(client, tid, fifth["run_id"]) == "success"
    assert await status_of(client, tid, sixth["run_id"]) == "success"


# --- human in the loop -------------------------------------------------------------------------


async def test_it_pauses_for_a_human_and_resumes_with_command(client: Any) -> None:
    tid = (await client.threads.create(metadata={"case": "hitl"}))["thread_id"]
    paused = await client.runs.wait(tid, "refund", input={"order_id": "A-7", "amount": 12.5})
    (interrupt,) = paused["__interrupt__"]
    assert interrupt["value"]["tool_name"] == "issue_refund"
    assert interrupt["value"]["args"] == {"order_id": "A-7", "amount": 12.5}

    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    (run_id,) = thread["interrupts"]
    assert thread["interrupts"][run_id] == [interrupt]
    assert await status_of(client, tid, run_id) == "suspended"  # deliberate difference
    waiting = await client.threads.search(status="interrupted", metadata={"case": "hitl"})
    assert [t["thread_id"] for t in waiting] == [tid]
    state = await client.threads.get_state(tid)
    assert state["next"] == ["tools"] and state["interrupts"] == [interrupt]
    assert state["tasks"][0]["interrupts"] == [interrupt]
    history = await client.threads.get_history(tid, limit=100)
    assert history[0]["interrupts"] == [interrupt]

    resumed = await client.runs.wait(
        tid,
        "refund",
        input={"ignored": True},  # input + command: the command wins
        command={"resume": {"approved": True, "args": {"order_id": "A-7", "amount": 10}}},
    )
    assert resumed["output"] == {"refunded": True, "order_id": "A-7", "amount": 10}
    runs = await client.runs.list(tid)
    assert [r["run_id"] for r in runs] == [run_id]  # resuming continues the same run
    assert runs[0]["status"] == "success"
    with pytest.raises(ConflictError):  # nothing suspended any more
        await client.runs.create(tid, "refund", command={"resume": {"approved": True}})

    # Decline with a reason, through the streaming endpoint.
    await client.runs.wait(tid, "refund", input={"order_id": "B-1", "amount": 3})
    parts = [
        p
        async for p in client.runs.stream(
            tid,
            "refund",
            command={"resume": {"approved": False, "reason": "not eligible"}},
            stream_mode="updates",
        )
    ]
    assert parts[-1].event == "end" and parts[-1].data["status"] == "success"
    final = await client.threads.get_state(tid)
    assert final["values"]["output"] == {"refunded": False, "reason": "not eligible"}

    # A tool that asked for input gets the resume data; bad data is a 422.
    await client.runs.wait(tid, "weather", input={})
    with pytest.raises(UnprocessableEntityError):
        await client.runs.create(tid, "weather", command={"resume": {"town": 1}})
    done = await client.runs.wait(tid, "weather", command={"resume": {"city": "Paris"}})
    assert "Paris" in str(done["output"])


async def test_a_run_waiting_for_a_human_holds_its_thread(client: Any) -> None:
    tid = (await client.threads.create())["thread_id"]
    paused = await client.runs.wait(tid, "refund", input={"order_id": "H-1", "amount": 4})
    assert paused["__interrupt__"]
    with pytest.raises(ConflictError, match=REJECT_TEXT):
        await client.runs.create(tid, "echo", input={"x": 1}, multitask_strategy="reject")
    with pytest.raises(ConflictError):
        await client.threads.update_state(tid, {"note": "meanwhile"})
    queued = await client.runs.create(tid, "echo", input={"after": "review"})
    await asyncio.sleep(0.5)
    assert await status_of(client, tid, queued["run_id"]) == "pending"  # behind the review

    resumed = await client.runs.wait(tid, "refund", command={"resume": {"approved": True}})
    assert resumed["output"]["refunded"] is True
    await client.runs.join(tid, queued["run_id"])
    assert await status_of(client, tid, queued["run_id"]) == "success"
    state = await client.threads.get_state(tid)
    # The echo run continued from the refund run's state: both runs' messages are there.
    texts = str(state["values"])
    assert "H-1" in texts and "review" in texts


async def test_it_resumes_several_pending_calls_with_a_map_and_streams_the_interrupt(
    client: Any,
) -> None:
    tid = (await client.threads.create())["thread_id"]
    parts = [
        p
        async for p in client.runs.stream(
            tid, "refund", input={"order_id": "C-1", "amount": 1}, stream_mode="values"
        )
    ]
    interrupts = parts[-2].data["__interrupt__"]  # values-only still surfaces the interrupt
    assert parts[-1].data["status"] == "suspended"
    (call,) = interrupts
    done = await client.runs.wait(
        tid, "refund", command={"resume": {call["id"]: {"approved": True}}}
    )
    assert done["output"]["refunded"] is True


# --- the sync client ---------------------------------------------------------------------------


def test_the_sync_client_does_the_same(site: Any) -> None:
    client = get_sync_client(url=site.url + "/api", api_key=None)
    tid = client.threads.create(metadata={"sync": True})["thread_id"]
    assert client.runs.wait(tid, "echo", input="s")["output"] == {"echo": "s"}
    events = [p.event for p in client.runs.stream(tid, "echo", input="t", stream_mode="updates")]
    assert events == ["metadata", "updates", "end"]
    run = client.runs.create(tid, "slow", input=SLOW)
    end = time.monotonic() + 15
    while client.runs.get(tid, run["run_id"])["status"] != "running":
        assert time.monotonic() < end
        time.sleep(0.05)
    client.runs.cancel(tid, run["run_id"], wait=True)
    assert client.runs.get(tid, run["run_id"])["status"] == "interrupted"
    assert [t["thread_id"] for t in client.threads.search(metadata={"sync": True})] == [tid]
    with pytest.raises(ConflictError):
        client.runs.cancel(tid, run["run_id"])
    with pytest.raises(NotFoundError):
        client.threads.get(str(uuid.uuid4()))
