"""LangGraph graphs on a real Runsite (Daphne + workers), driven by langgraph_sdk: a tool-calling
graph streamed, interrupted and approved; a worker SIGKILLed mid-graph."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client

from runs.models import Checkpoint, Run, RunStatus
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e]

GRAPHS = str(Path(__file__).resolve().parent.parent / "graphs" / "langgraph.json")


@pytest.fixture
def site(site_factory: Any) -> Any:
    return site_factory(RUNS_GRAPHS=GRAPHS, RUNS_POLL_SECONDS="0.2")


async def test_the_sdk_streams_a_tool_calling_graph_through_its_review(site: Any) -> None:
    client = get_client(url=site.url + "/api", api_key=None)
    thread = await client.threads.create()
    tid = thread["thread_id"]
    seen: list[tuple[str, Any]] = []
    async for part in client.runs.stream(
        tid,
        "tools",
        input={"messages": [{"role": "user", "content": "refund A-7"}]},
        stream_mode=["updates", "messages-tuple"],
    ):
        seen.append((part.event, part.data))
    names = [e for e, _ in seen]
    assert "messages" in names
    assert "updates" in names
    tokens = "".join(d[0]["content"] for e, d in seen if e == "messages")
    assert "Refunding order A-7." in tokens
    interrupt = next(d["__interrupt__"] for e, d in seen if e == "updates" and "__interrupt__" in d)
    assert interrupt[0]["value"] == {
        "tool": "issue_refund",
        "args": {"order_id": "A-7", "amount": 12.5},
    }
    state = await client.threads.get_state(tid)
    assert state["next"] == ["review"]
    runs = await client.runs.list(tid)
    run_id = runs[0]["run_id"]
    assert runs[0]["status"] == "suspended"

    # The reviewer approves in the review API (what the dashboard's inbox does).
    async with httpx.AsyncClient(base_url=site.url + "/api") as http:
        r = await http.post("/agents/tools/approve-tool-call", json={"run_id": run_id})
    assert r.status_code == 202
    await client.runs.join(tid, run_id)
    assert (await client.runs.get(tid, run_id))["status"] == "success"
    final = (await client.threads.get_state(tid))["values"]["messages"]
    assert final[-1]["content"] == "The refund is done."


@pytest.mark.postgres
def test_a_graph_resumes_from_its_last_super_step_after_a_worker_is_killed(
    site_factory: Any, start_worker: Any
) -> None:
    fast = {
        "RUNS_GRAPHS": GRAPHS,
        "RUNS_LEASE_SECONDS": "2",
        "RUNS_HEARTBEAT_SECONDS": "0.5",
        "RUNS_REAPER_SECONDS": "0.5",
        "RUNS_POLL_SECONDS": "0.2",
    }
    site = site_factory(embedded_worker=False, **fast)
    victim = start_worker(concurrency=1, **fast)
    with httpx.Client(base_url=site.url + "/api", timeout=30) as http:
        tid = http.post("/threads", json={}).json()["thread_id"]
        run = http.post(
            f"/threads/{tid}/runs",
            json={"assistant_id": "slow", "input": {"steps": 12, "delay_ms": 100}},
        ).json()

    def progress() -> int:
        cp = Checkpoint.objects.filter(run_id=run["run_id"]).order_by("-step").first()
        return len(cp.values.get("items", [])) if cp else 0

    wait_for(lambda: progress() >= 3, timeout=20)
    victim.signal(signal.SIGKILL)
    kept = progress()
    start_worker(concurrency=1, **fast)
    wait_for(
        lambda: Run.objects.filter(id=run["run_id"], status=RunStatus.SUCCESS).exists(),
        timeout=30,
    )
    finished = Run.objects.get(id=run["run_id"])
    assert finished.attempt == 2
    assert finished.output["items"] == list(range(12))  # no step ran twice into the state
    assert kept >= 3
