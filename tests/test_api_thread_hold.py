"""A run waiting for a human holds its thread (issue: a suspended run is in flight), over HTTP.

Runs execute in-process with `drain` (a worker's claim, on PostgreSQL and on SQLite).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runs import services
from runs.models import AuditEntry, Checkpoint, Run, RunStatus, Thread

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.fixture
def api() -> Client:
    return Client()


def post(api: Client, path: str, body: Any = None) -> Any:
    return api.post(f"/api{path}", json.dumps(body or {}), content_type="application/json")


def suspended_refund_on_thread(api: Client, drain: Any) -> tuple[str, str]:
    tid = post(api, "/threads", {}).json()["thread_id"]
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "A1", "amount": 5}},
    )
    assert r.status_code == 200
    drain()
    run_id = r.json()["run_id"]
    assert Run.objects.get(id=run_id).status == RunStatus.SUSPENDED
    return tid, run_id


def test_it_queues_a_new_run_behind_a_suspended_one(api: Client, drain: Any, reviewer) -> None:
    tid, refund_id = suspended_refund_on_thread(api, drain)
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"hi": 1}})
    assert r.status_code == 200
    echo_id = r.json()["run_id"]
    drain()
    assert Run.objects.get(id=echo_id).status == RunStatus.PENDING  # held behind the review
    assert Thread.objects.get(id=tid).status == "busy"

    services.tool_call_approve(run=Run.objects.get(id=refund_id), actor=reviewer)
    drain()
    refund, echo = Run.objects.get(id=refund_id), Run.objects.get(id=echo_id)
    assert refund.status == RunStatus.SUCCESS
    assert echo.status == RunStatus.SUCCESS
    # The refund finished first; the echo run started after it, from its state: nothing lost.
    assert echo.started_at >= refund.finished_at
    # The echo run continued from the refund run's last snapshot, and its state is the thread's.
    refund_last = Checkpoint.objects.filter(run_id=refund_id).order_by("-step").first()
    echo_first = Checkpoint.objects.filter(run_id=echo_id).order_by("step").first()
    assert echo_first.parent_id == refund_last.id
    state = api.get(f"/api/threads/{tid}/state").json()
    echo_last = Checkpoint.objects.filter(run_id=echo_id).order_by("-step").first()
    assert state["checkpoint"]["checkpoint_id"] == str(echo_last.id)
    assert state["values"] == echo_last.values


def test_it_rejects_a_run_on_a_thread_waiting_for_a_human(api: Client, drain: Any) -> None:
    tid, refund_id = suspended_refund_on_thread(api, drain)
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "echo", "input": {}, "multitask_strategy": "reject"},
    )
    assert r.status_code == 409
    assert r.json()["code"] == "thread_busy"
    assert Run.objects.filter(thread_id=tid).count() == 1
    assert Run.objects.get(id=refund_id).status == RunStatus.SUSPENDED


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_it_replaces_a_suspended_run_and_audits_why(api: Client, drain: Any, strategy: str) -> None:
    tid, refund_id = suspended_refund_on_thread(api, drain)
    before = Checkpoint.objects.filter(thread_id=tid).exclude(run_id=refund_id).count()
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "echo", "input": {"x": 1}, "multitask_strategy": strategy},
    )
    assert r.status_code == 200
    new_id = r.json()["run_id"]
    if strategy == "interrupt":
        assert Run.objects.get(id=refund_id).status == RunStatus.INTERRUPTED
    else:
        assert not Run.objects.filter(id=refund_id).exists()
        assert Checkpoint.objects.filter(thread_id=tid).count() == before
    entry = AuditEntry.objects.get(run_id=refund_id, action=f"cancel_{strategy}")
    assert entry.reason == f"replaced by run {new_id} (multitask_strategy={strategy})"
    drain()
    assert Run.objects.get(id=new_id).status == RunStatus.SUCCESS


def test_it_refuses_a_state_edit_while_a_run_waits_for_a_human(api: Client, drain: Any) -> None:
    tid, _ = suspended_refund_on_thread(api, drain)
    values = api.get(f"/api/threads/{tid}/state").json()["values"]
    r = post(api, f"/threads/{tid}/state", {"values": {"note": "meanwhile"}})
    assert r.status_code == 409
    assert r.json()["code"] == "thread_busy"
    assert api.get(f"/api/threads/{tid}/state").json()["values"] == values


def test_rollback_of_a_suspended_run_restores_the_thread_exactly(api: Client, drain: Any) -> None:
    tid = post(api, "/threads", {}).json()["thread_id"]
    post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"first": 1}})
    drain()
    before = api.get(f"/api/threads/{tid}/state").json()
    r = post(
        api,
        f"/threads/{tid}/runs",
        {"assistant_id": "refund", "input": {"order_id": "B2", "amount": 7}},
    )
    refund_id = r.json()["run_id"]
    drain()
    queued = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {"later": 2}})
    drain()
    assert api.get(f"/api/threads/{tid}/state").json()["values"] != before["values"]

    r = post(api, f"/threads/{tid}/runs/{refund_id}/cancel?action=rollback&wait=1")
    assert r.status_code in (200, 202, 204)
    after = api.get(f"/api/threads/{tid}/state").json()
    assert after["values"] == before["values"]
    assert after["checkpoint"]["checkpoint_id"] == before["checkpoint"]["checkpoint_id"]

    # The run queued behind it now starts from that state.
    drain()
    later = Run.objects.get(id=queued.json()["run_id"])
    assert later.status == RunStatus.SUCCESS
    first = later.checkpoints.order_by("step").first()
    assert str(first.parent_id) == before["checkpoint"]["checkpoint_id"]


def test_cancel_all_leaves_runs_waiting_for_a_human(api: Client, drain: Any) -> None:
    _, refund_id = suspended_refund_on_thread(api, drain)
    tid2 = post(api, "/threads", {}).json()["thread_id"]
    pending = post(api, f"/threads/{tid2}/runs", {"assistant_id": "echo", "input": {}}).json()
    r = post(api, "/runs/cancel", {"status": "all"})
    assert r.status_code == 204
    assert Run.objects.get(id=refund_id).status == RunStatus.SUSPENDED
    assert Run.objects.get(id=pending["run_id"]).status == RunStatus.INTERRUPTED

    r = post(api, "/runs/cancel", {"status": "suspended"})
    assert r.status_code == 204
    assert Run.objects.get(id=refund_id).status == RunStatus.INTERRUPTED


def test_cancel_by_id_includes_a_run_waiting_for_a_human(api: Client, drain: Any) -> None:
    tid, refund_id = suspended_refund_on_thread(api, drain)
    r = post(api, "/runs/cancel", {"run_ids": [refund_id], "thread_id": tid})
    assert r.status_code == 204
    assert Run.objects.get(id=refund_id).status == RunStatus.INTERRUPTED


def test_a_stateless_run_deletes_its_thread_after_it_ends(
    api: Client, drain: Any, settings
) -> None:
    settings.RUNS_STATELESS_KEEP_SECONDS = 0
    r = post(api, "/runs", {"assistant_id": "echo", "input": {"a": 1}})
    assert r.status_code == 200
    run_id, tid = r.json()["run_id"], r.json()["thread_id"]
    drain()
    assert Thread.objects.get(id=tid).expires_at is not None
    audit_before = AuditEntry.objects.count()
    assert services.runs_reap()["threads_deleted"] == 1
    assert not Thread.objects.filter(id=tid).exists()
    assert not Run.objects.filter(id=run_id).exists()
    assert AuditEntry.objects.count() == audit_before  # the audit log stays


def test_a_stateless_run_keeps_its_thread_when_asked(api: Client, drain: Any, settings) -> None:
    settings.RUNS_STATELESS_KEEP_SECONDS = 0
    r = post(api, "/runs", {"assistant_id": "echo", "input": {}, "on_completion": "keep"})
    tid = r.json()["thread_id"]
    drain()
    services.runs_reap()
    assert Thread.objects.filter(id=tid).exists()
    assert Thread.objects.get(id=tid).expires_at is None


def test_a_stateless_thread_waits_for_its_grace_period(api: Client, drain: Any, settings) -> None:
    settings.RUNS_STATELESS_KEEP_SECONDS = 3600
    tid = post(api, "/runs", {"assistant_id": "echo", "input": {}}).json()["thread_id"]
    drain()
    assert services.runs_reap()["threads_deleted"] == 0
    assert Thread.objects.filter(id=tid).exists()  # a join or stream can still read the end


def test_a_suspended_stateless_run_keeps_its_thread_until_it_ends(
    api: Client, drain: Any, settings, reviewer
) -> None:
    settings.RUNS_STATELESS_KEEP_SECONDS = 0
    r = post(api, "/runs", {"assistant_id": "refund", "input": {"order_id": "C", "amount": 1}})
    run_id, tid = r.json()["run_id"], r.json()["thread_id"]
    drain()
    services.runs_reap()
    assert Thread.objects.get(id=tid).expires_at is None
    services.tool_call_approve(run=Run.objects.get(id=run_id), actor=reviewer)
    drain()
    assert services.runs_reap()["threads_deleted"] == 1
    assert not Thread.objects.filter(id=tid).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"on_completion": "keep"}, "on_completion"),
        ({"command": {"resume": {"approved": True}, "goto": "tools"}}, "command.goto"),
    ],
)
def test_it_refuses_what_it_cannot_honour_on_a_thread(
    api: Client, body: dict[str, Any], field: str
) -> None:
    tid = post(api, "/threads", {}).json()["thread_id"]
    r = post(api, f"/threads/{tid}/runs", {"assistant_id": "echo", "input": {}, **body})
    assert r.status_code == 422
    assert r.json()["code"] == "unsupported"
    assert r.json()["field"] == field
    assert not Run.objects.filter(thread_id=tid).exists()
