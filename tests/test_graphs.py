"""LangGraph graphs as Runsite agents: registration, the checkpointer, execution in the worker.

The graphs are tests/graphs/ (peers.py is the peers' benchmark graphs, copied unchanged);
runs execute in-process with `drain`. Graph runs keep their database work on the
checkpointer's own thread, so these tests commit for real (transactional_db).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from langgraph.checkpoint.base import empty_checkpoint

from runs import services
from runs.graphs.checkpointer import RunsiteSaver
from runs.graphs.loader import GraphAgent, load_graphs
from runs.models import Checkpoint, GraphCheckpoint, GraphWrite, Run, RunStatus, Thread

GRAPHS_DIR = Path(__file__).parent / "graphs"


def graphs_config() -> dict[str, Any]:
    data = json.loads((GRAPHS_DIR / "langgraph.json").read_text())
    return {**data, "base_dir": str(GRAPHS_DIR)}


@pytest.fixture
def graphs(register_agent: Any) -> dict[str, GraphAgent]:
    loaded = load_graphs(graphs_config())
    for agent in loaded.values():
        register_agent(agent)
    return loaded


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


def post(path: str, body: Any = None) -> Any:
    return Client().post(f"/api{path}", json.dumps(body or {}), content_type="application/json")


def start(agent_id: str, input: Any, **kwargs: Any) -> Run:
    thread = services.thread_create()
    return services.run_create(
        agent_id=agent_id, actor="test", thread_id=thread.id, input=input, **kwargs
    )


# --- registration ------------------------------------------------------------------------------


def test_it_loads_the_graphs_of_a_langgraph_json() -> None:
    loaded = load_graphs(graphs_config())
    assert set(loaded) >= {"echo", "slow", "approval"}
    assert loaded["slow"].value_keys == ["steps", "delay_ms", "items"]


def test_it_stops_start_up_naming_a_graph_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('no model key')\n")
    config = {"graphs": {"mine": "./broken.py:graph"}, "base_dir": str(tmp_path)}
    with pytest.raises(ImproperlyConfigured) as err:
        load_graphs(config)
    assert "'mine'" in str(err.value)
    assert "RuntimeError: no model key" in str(err.value)


def test_it_refuses_a_missing_attribute(tmp_path: Path) -> None:
    (tmp_path / "g.py").write_text("x = 1\n")
    with pytest.raises(ImproperlyConfigured, match="'g1'.*no attribute 'graph'"):
        load_graphs({"graphs": {"g1": "./g.py:graph"}, "base_dir": str(tmp_path)})


def test_it_reads_runs_graphs_from_a_file_or_inline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from runsite.settings import env_graphs

    monkeypatch.setenv("RUNS_GRAPHS", str(GRAPHS_DIR / "langgraph.json"))
    assert env_graphs("RUNS_GRAPHS")["base_dir"] == str(GRAPHS_DIR.resolve())
    monkeypatch.setenv("RUNS_GRAPHS", '{"graphs": {"a": "./x.py:g"}}')
    assert env_graphs("RUNS_GRAPHS")["graphs"] == {"a": "./x.py:g"}
    monkeypatch.setenv("RUNS_GRAPHS", "{not json")
    with pytest.raises(ImproperlyConfigured, match="RUNS_GRAPHS"):
        env_graphs("RUNS_GRAPHS")
    monkeypatch.setenv("RUNS_GRAPHS", str(tmp_path / "missing.json"))
    with pytest.raises(ImproperlyConfigured, match="RUNS_GRAPHS"):
        env_graphs("RUNS_GRAPHS")


def test_it_lists_graphs_as_assistants(db: Any, graphs: Any) -> None:
    r = post("/assistants/search", {"limit": 100})
    assert r.status_code == 200
    ids = {a["graph_id"] for a in r.json()}
    assert {"echo", "slow", "approval"} <= ids


# --- the checkpointer --------------------------------------------------------------------------


def _checkpoint(n: int, **values: Any) -> dict[str, Any]:
    cp = empty_checkpoint()
    cp["id"] = f"1ef00000-0000-6000-8000-{n:012d}"
    cp["channel_values"] = values
    cp["channel_versions"] = dict.fromkeys(values, 1)
    return cp


def test_the_saver_puts_gets_lists_and_keeps_pending_writes(db: Any) -> None:
    thread = Thread.objects.create()
    saver = RunsiteSaver()
    config = {"configurable": {"thread_id": str(thread.id), "checkpoint_ns": ""}}
    first = saver.put(config, _checkpoint(1, a=1), {"source": "input", "step": -1}, {})
    second = saver.put(first, _checkpoint(2, a=2), {"source": "loop", "step": 0}, {})
    saver.put_writes(second, [("a", 3), ("b", 4)], task_id="t1")
    saver.put_writes(second, [("a", 99)], task_id="t1")  # a replayed task keeps its first write
    saver.put_writes(second, [("__interrupt__", ["x"])], task_id="t2")
    saver.put_writes(second, [("__interrupt__", ["y"])], task_id="t2")  # special: upserted

    latest = saver.get_tuple(config)
    assert latest is not None
    assert latest.checkpoint["id"] == _checkpoint(2)["id"]
    assert latest.checkpoint["channel_values"] == {"a": 2}
    assert latest.parent_config["configurable"]["checkpoint_id"] == _checkpoint(1)["id"]
    assert sorted(latest.pending_writes) == [
        ("t1", "a", 3),
        ("t1", "b", 4),
        ("t2", "__interrupt__", ["y"]),
    ]
    assert latest.metadata["step"] == 0

    older = saver.get_tuple(first)
    assert older.checkpoint["channel_values"] == {"a": 1}
    listed = [t.checkpoint["id"] for t in saver.list(config)]
    assert listed == [_checkpoint(2)["id"], _checkpoint(1)["id"]]
    assert [t.metadata["source"] for t in saver.list(config, filter={"source": "input"})] == [
        "input"
    ]
    assert len(list(saver.list(config, before=second))) == 1
    assert len(list(saver.list(config, limit=1))) == 1
    # The root checkpoints are projected for Runsite's thread state.
    assert Checkpoint.objects.get(id=_checkpoint(2)["id"]).values == {"a": 2}

    saver.delete_thread(str(thread.id))
    assert saver.get_tuple(config) is None
    assert not GraphWrite.objects.exists()


def test_the_saver_works_from_an_event_loop(transactional_db: Any) -> None:
    thread = Thread.objects.create()
    saver = RunsiteSaver()
    config = {"configurable": {"thread_id": str(thread.id), "checkpoint_ns": ""}}

    async def scenario() -> tuple[Any, list[Any]]:
        put = await saver.aput(config, _checkpoint(1, a=1), {"source": "input", "step": -1}, {})
        await saver.aput_writes(put, [("a", 2)], task_id="t")
        got = await saver.aget_tuple(config)
        listed = [t async for t in saver.alist(config)]
        return got, listed

    try:
        got, listed = asyncio.run(scenario())
    finally:
        saver.close()
    assert got.checkpoint["channel_values"] == {"a": 1}
    assert got.pending_writes == [("t", "a", 2)]
    assert len(listed) == 1


# --- execution ---------------------------------------------------------------------------------


def test_it_runs_a_graph_to_success(transactional_db: Any, graphs: Any, drain: Any) -> None:
    run = start("echo", {"input": "hi"})
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"input": "hi", "output": "hi"}
    thread = Thread.objects.get(id=run.thread_id)
    assert thread.status == "idle"
    assert thread.values == {"input": "hi", "output": "hi"}
    assert GraphCheckpoint.objects.filter(run=run).count() >= 2


def test_it_checkpoints_every_super_step(transactional_db: Any, graphs: Any, drain: Any) -> None:
    run = start("slow", {"steps": 3, "delay_ms": 1})
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output["items"] == [0, 1, 2]
    # input + one per super-step (start, 3 × step)
    steps = list(
        Checkpoint.objects.filter(run=run).order_by("step").values_list("values", flat=True)
    )
    assert [len(v.get("items", [])) for v in steps] == [0, 0, 1, 2, 3]


def test_a_second_run_continues_the_threads_state(
    transactional_db: Any, graphs: Any, drain: Any
) -> None:
    run = start("slow", {"steps": 2, "delay_ms": 1})
    drain()
    again = services.run_create(
        agent_id="slow", actor="test", thread_id=run.thread_id, input={"steps": 3}
    )
    drain()
    again.refresh_from_db()
    assert again.status == RunStatus.SUCCESS
    assert again.output["items"] == [0, 1, 2]


def test_a_node_that_raises_ends_the_run_with_error(
    transactional_db: Any, graphs: Any, drain: Any
) -> None:
    run = start("slow", {"steps": 2, "delay_ms": "soon"})  # int("soon") raises in the node
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR
    assert "ValueError" in run.error["message"]
    assert Thread.objects.get(id=run.thread_id).status == "error"


def test_thread_state_comes_from_the_graphs_checkpoints(
    transactional_db: Any, graphs: Any, drain: Any
) -> None:
    run = start("slow", {"steps": 2, "delay_ms": 1})
    drain()
    r = Client().get(f"/api/threads/{run.thread_id}/state")
    assert r.status_code == 200
    state = r.json()
    head = GraphCheckpoint.objects.filter(thread_id=run.thread_id).order_by("-checkpoint_id")[0]
    assert state["values"] == {"steps": 2, "delay_ms": 1, "items": [0, 1]}
    assert state["next"] == []
    assert state["checkpoint"]["checkpoint_id"] == head.checkpoint_id
    assert state["checkpoint_id"] == head.checkpoint_id
    assert state["metadata"]["source"] == "loop"
    assert state["metadata"]["run_id"] == str(run.id)
    r = Client().get(f"/api/threads/{run.thread_id}/history?limit=100")
    assert r.status_code == 200
    assert len(r.json()) == GraphCheckpoint.objects.filter(thread_id=run.thread_id).count()
    assert r.json()[0]["checkpoint_id"] == head.checkpoint_id
