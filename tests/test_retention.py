"""Retention: `services.runs_prune` and `pruneruns`, the workers' periodic prune, audit retention,
LangGraph's `POST /threads/prune` and a thread's `ttl` over HTTP, and pruning while workers claim
on PostgreSQL."""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import close_old_connections, connection, transaction
from django.test import Client
from django.utils import timezone

from runs import services
from runs.exceptions import NotFound, ValidationFailed
from runs.models import (
    ACTIVE_STATUSES,
    AuditEntry,
    Checkpoint,
    Run,
    RunEvent,
    RunStatus,
    Thread,
    ToolCall,
)
from tests.helpers import wait_for

REFUND = {"order_id": "A-1", "amount": 25.0}
LONG_AGO = timedelta(days=40)


def age(*runs: Run, by: timedelta = LONG_AGO) -> None:
    """Make runs (and their threads) look as if they ended `by` ago."""
    when = timezone.now() - by
    ids = [r.id for r in runs]
    Run.objects.filter(id__in=ids).update(finished_at=when, created_at=when)
    Thread.objects.filter(runs__id__in=ids).update(updated_at=when)


def finished_run(drain: Any, agent_id: str = "echo", input: Any = None, **kw: Any) -> Run:
    thread = kw.pop("thread", None) or services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id=agent_id, thread_id=thread.id, input=input or {"q": 1}, actor="t", **kw
    )
    drain()
    run.refresh_from_db()
    return run


# --- runs_prune ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_it_prunes_old_ended_runs_with_their_records_and_emptied_threads(drain) -> None:
    thread = services.thread_create(metadata={})
    refund = services.run_create(agent_id="refund", thread_id=thread.id, input=REFUND, actor="t")
    drain()
    waiting = ToolCall.objects.get(run=refund, status="awaiting_approval")
    services.tool_call_approve(run=refund, tool_call_id=waiting.tool_call_id, actor="rita")
    drain()
    refund.refresh_from_db()
    assert refund.status == RunStatus.SUCCESS
    assert Checkpoint.objects.filter(run=refund).exists()
    recent = finished_run(drain)
    age(refund)
    audit_before = AuditEntry.objects.count()

    result = services.runs_prune(older_than=timedelta(days=30), batch_size=1)

    assert (result.runs, result.threads) == (1, 1)
    assert not Run.objects.filter(id=refund.id).exists()
    assert not Thread.objects.filter(id=thread.id).exists()
    assert not RunEvent.objects.filter(run_id=refund.id).exists()
    assert not ToolCall.objects.filter(run_id=refund.id).exists()
    assert not Checkpoint.objects.filter(thread_id=thread.id).exists()
    assert Run.objects.filter(id=recent.id).exists()
    # The audit log is kept, and says what the prune did.
    assert AuditEntry.objects.filter(run_id=refund.id, action="approve").exists()
    assert AuditEntry.objects.count() == audit_before + 1
    assert AuditEntry.objects.get(action="prune").after["runs"] == 1


@pytest.mark.django_db
def test_it_never_touches_active_runs_or_a_thread_holding_one(drain) -> None:
    pending = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    held = services.thread_create(metadata={})
    old_on_held = finished_run(drain, thread=held)
    suspended = services.run_create(agent_id="refund", thread_id=held.id, input=REFUND, actor="t")
    drain()
    suspended.refresh_from_db()
    assert suspended.status == RunStatus.SUSPENDED
    age(pending, old_on_held, suspended)

    result = services.runs_prune(older_than=timedelta(days=1))

    assert result.runs == 0
    assert Run.objects.filter(id__in=[pending.id, old_on_held.id, suspended.id]).count() == 3


@pytest.mark.django_db
def test_a_thread_used_within_the_window_keeps_its_state(drain) -> None:
    thread = services.thread_create(metadata={})
    old = finished_run(drain, thread=thread, input={"q": "state"})
    state = Thread.objects.get(id=thread.id).values
    age(old)
    services.thread_update(thread=thread, metadata={"touched": True})

    result = services.runs_prune(older_than=timedelta(days=30))

    assert (result.runs, result.threads) == (1, 0)
    assert not Run.objects.filter(id=old.id).exists()
    # The thread's latest checkpoint outlives the run that wrote it: the state does not revert.
    latest = Checkpoint.objects.get(thread_id=thread.id)
    assert latest.run_id is None
    assert latest.values == state


@pytest.mark.django_db
def test_it_prunes_by_status_and_counts_in_a_dry_run(drain) -> None:
    ok = finished_run(drain)
    interrupted = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    services.run_cancel(run=interrupted, action="interrupt", actor="t")
    interrupted.refresh_from_db()
    age(ok, interrupted)

    dry = services.runs_prune(older_than=timedelta(days=1), dry_run=True)
    assert (dry.dry_run, dry.runs) == (True, 2)
    assert Run.objects.count() == 2
    only = services.runs_prune(older_than=timedelta(days=1), statuses=["interrupted"])
    assert only.runs == 1
    assert list(Run.objects.values_list("id", flat=True)) == [ok.id]


@pytest.mark.django_db
@pytest.mark.parametrize("statuses", [["pending"], ["suspended"], ["running"], ["nonsense"]])
def test_it_refuses_to_prune_statuses_that_have_not_ended(statuses: list[str]) -> None:
    with pytest.raises(ValidationFailed) as exc:
        services.runs_prune(older_than=timedelta(days=1), statuses=statuses)
    assert exc.value.errors[0]["field"] == "status"


@pytest.mark.django_db
def test_the_command_prunes_after_a_dry_run(drain) -> None:
    old, new = finished_run(drain), finished_run(drain)
    age(old)
    out = io.StringIO()
    call_command("pruneruns", "--older-than", "30", "--dry-run", stdout=out)
    assert "Would delete 1 run(s)" in out.getvalue()
    assert Run.objects.count() == 2
    call_command("pruneruns", "--older-than", "30", "--status", "success", stdout=out)
    assert "Deleted 1 run(s) and 1 emptied thread(s)" in out.getvalue()
    assert list(Run.objects.values_list("id", flat=True)) == [new.id]


@pytest.mark.django_db
def test_audit_entries_have_their_own_retention(drain, settings) -> None:
    run = finished_run(drain)
    services.run_retry(run=run, actor="t")
    AuditEntry.objects.update(created_at=timezone.now() - timedelta(days=400))
    fresh = services.run_retry(run=run, actor="t")
    assert fresh is not None
    settings.RUNS_RETENTION_DAYS = None
    settings.RUNS_AUDIT_RETENTION_DAYS = 365
    services.retention_apply()
    assert AuditEntry.objects.count() == 1
    assert Run.objects.count() == 3  # runs kept: RUNS_RETENTION_DAYS is unset


@pytest.mark.django_db
def test_retention_does_nothing_unless_configured(drain, settings) -> None:
    old = finished_run(drain)
    age(old, by=timedelta(days=5000))
    settings.RUNS_RETENTION_DAYS = None
    settings.RUNS_AUDIT_RETENTION_DAYS = None
    assert services.retention_apply() is None
    assert Run.objects.filter(id=old.id).exists()
    settings.RUNS_RETENTION_DAYS = 30
    result = services.retention_apply(time_budget=5)
    assert result is not None and result.runs == 1
    assert AuditEntry.objects.get(action="prune").actor == "system:retention"


@pytest.mark.django_db(transaction=True)
def test_a_worker_prunes_periodically_when_retention_is_set(start_worker) -> None:
    thread = services.thread_create(metadata={})
    old = services.run_create(
        agent_id="echo", thread_id=thread.id, input={}, after_seconds=3600, actor="t"
    )
    services.run_cancel(run=old, action="interrupt", actor="t")
    age(old)
    start_worker(concurrency=1, RUNS_RETENTION_DAYS="30", RUNS_PRUNE_INTERVAL_SECONDS="1")
    wait_for(lambda: not Run.objects.filter(id=old.id).exists(), timeout=30)
    # The summary entry is written once the pass's batches are done.
    wait_for(
        lambda: AuditEntry.objects.filter(action="prune", actor="system:retention").exists(),
        timeout=30,
    )


# --- LangGraph: POST /threads/prune and thread ttl over HTTP ---------------------------------


def post(client: Client, url: str, body: Any, key: str | None = None) -> Any:
    headers = {"x-api-key": key} if key else {}
    return client.post(url, data=json.dumps(body), content_type="application/json", headers=headers)


@pytest.fixture
def _auth_off(settings: Any) -> None:
    settings.RUNS_API_AUTH = False


@pytest.mark.django_db
@pytest.mark.usefixtures("_auth_off")
def test_threads_prune_deletes_the_threads_and_refuses_keep_latest(client: Client, drain) -> None:
    a = services.thread_create(metadata={})
    run = finished_run(drain, thread=a)
    b = services.thread_create(metadata={})
    keep = services.thread_create(metadata={})
    refused = post(
        client, "/api/threads/prune", {"thread_ids": [str(a.id)], "strategy": "keep_latest"}
    )
    assert refused.status_code == 422
    assert refused.json()["code"] == "unsupported"
    bad = post(client, "/api/threads/prune", {"thread_ids": [str(a.id)], "strategy": "all"})
    assert bad.status_code == 422
    assert Thread.objects.count() == 3
    response = post(
        client, "/api/threads/prune", {"thread_ids": [str(a.id), str(b.id)], "strategy": "delete"}
    )
    assert response.status_code == 200
    assert response.json() == {"pruned_count": 2}
    assert list(Thread.objects.values_list("id", flat=True)) == [keep.id]
    assert not Run.objects.filter(id=run.id).exists()


@pytest.mark.django_db
def test_threads_prune_with_a_pinned_key_prunes_only_its_resource(client: Client) -> None:
    mine = services.thread_create(metadata={"resource_id": "acme"})
    theirs = services.thread_create(metadata={"resource_id": "globex"})
    _key, raw = services.api_key_create(name="acme", resource_id="acme")
    response = post(
        client, "/api/threads/prune", {"thread_ids": [str(mine.id), str(theirs.id)]}, raw
    )
    assert response.status_code == 200
    assert response.json() == {"pruned_count": 1}
    assert list(Thread.objects.values_list("id", flat=True)) == [theirs.id]


@pytest.mark.django_db
@pytest.mark.usefixtures("_auth_off")
@pytest.mark.parametrize(
    ("ttl", "field"),
    [
        ({"ttl": 5, "strategy": "keep_latest"}, "ttl.strategy"),
        ({"ttl": 5, "strategy": "never"}, "ttl.strategy"),
        ({"ttl": -1}, "ttl.ttl"),
        ({"ttl": "soon"}, "ttl.ttl"),
        ({"minutes": 5}, "ttl.minutes"),
        (0, "ttl"),
    ],
)
def test_a_thread_ttl_it_cannot_honour_is_refused(client: Client, ttl: Any, field: str) -> None:
    response = post(client, "/api/threads", {"ttl": ttl})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == field
    assert not Thread.objects.exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("_auth_off")
def test_a_thread_with_a_ttl_is_deleted_once_idle_that_long(client: Client, drain) -> None:
    response = post(client, "/api/threads", {"ttl": {"ttl": 1, "strategy": "delete"}})
    assert response.status_code == 200
    thread = Thread.objects.get(id=response.json()["thread_id"])
    assert thread.ttl_minutes == 1
    assert thread.expires_at is not None
    services.runs_reap()
    assert Thread.objects.filter(id=thread.id).exists()  # not expired yet
    # Expired, but a run is in flight on it: kept, expiry pushed past now.
    run = services.run_create(
        agent_id="echo", thread_id=thread.id, input={}, after_seconds=3600, actor="t"
    )
    past = timezone.now() - timedelta(minutes=5)
    Thread.objects.filter(id=thread.id).update(expires_at=past, updated_at=past)
    services.runs_reap()
    thread.refresh_from_db()
    assert thread.expires_at > timezone.now()
    services.run_cancel(run=run, action="interrupt", actor="t")
    Thread.objects.filter(id=thread.id).update(expires_at=past, updated_at=past)
    services.runs_reap()
    assert not Thread.objects.filter(id=thread.id).exists()
    assert not Run.objects.filter(id=run.id).exists()


@pytest.mark.django_db
@pytest.mark.usefixtures("_auth_off")
def test_patching_a_thread_ttl_rearms_it(client: Client) -> None:
    thread = services.thread_create(metadata={})
    assert thread.expires_at is None
    response = client.patch(
        f"/api/threads/{thread.id}", data=json.dumps({"ttl": 10}), content_type="application/json"
    )
    assert response.status_code == 200
    thread.refresh_from_db()
    assert thread.ttl_minutes == 10
    assert thread.expires_at > timezone.now() + timedelta(minutes=9)


# --- pruning while the engine works (PostgreSQL, real worker processes) ----------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pruning_while_workers_claim_never_deletes_an_active_run(start_worker) -> None:
    # Old ended runs to prune, spread over threads that new work also lands on.
    threads = [services.thread_create(metadata={}) for _ in range(20)]
    old = []
    for i in range(200):
        run = services.run_create(
            agent_id="echo", thread_id=threads[i % 20].id, input={}, after_seconds=3600, actor="t"
        )
        services.run_cancel(run=run, action="interrupt", actor="t")
        old.append(run)
    age(*old)
    start_worker(concurrency=4)
    stop = threading.Event()
    created: list[Any] = []
    pruned_threads: list[Any] = []

    def produce() -> None:
        # New work on every thread, as fast as the workers take it: a thread gets its next run
        # once its last one ended (a producer outrunning four slots built a backlog that kept
        # every thread busy, so nothing was ever prunable, once run_create got faster).
        live = list(threads)
        last: dict[Any, Any] = {}
        try:
            while not stop.is_set() and live:
                started = time.monotonic()
                for t in list(live):
                    if (
                        t.id in last
                        and Run.objects.filter(id=last[t.id], status__in=ACTIVE_STATUSES).exists()
                    ):
                        continue  # one run in flight per thread: no backlog, idle gaps
                    try:
                        run = services.run_create(
                            agent_id="slow",
                            thread_id=t.id,
                            input={"steps": 2, "delay_ms": 5},
                            actor="t",
                        )
                    except NotFound:
                        # Pruned before anything new landed on it (all its runs were old):
                        # the create waited for the batch's lock, then found it gone.
                        pruned_threads.append(t.id)
                        live.remove(t)
                        continue
                    created.append(run.id)
                    last[t.id] = run.id
                stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))
        finally:
            close_old_connections()

    lock_waits: list[tuple[float, str]] = []
    polls: list[int] = []

    def watch_locks() -> None:
        # Every 20 ms: who in this database is waiting for a lock, and for how long so far.
        try:
            while not stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT extract(epoch FROM now() - query_start), query "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'"
                    )
                    lock_waits.extend((float(w), q) for w, q in cursor.fetchall())
                polls.append(1)
                time.sleep(0.02)
        finally:
            close_old_connections()

    producer = threading.Thread(target=produce)
    watcher = threading.Thread(target=watch_locks)
    producer.start()
    watcher.start()
    try:
        total = 0
        while total < 200:
            result = services.runs_prune(older_than=timedelta(days=30), batch_size=7)
            total += result.runs
            if not result.runs:
                time.sleep(0.05)
    finally:
        stop.set()
        producer.join()
        watcher.join()
    assert total == 200
    assert len(polls) > 10  # the watcher was looking the whole time
    # Claims never wait for a prune (it takes only ended runs and idle threads, SKIP LOCKED),
    # and nothing waits long: a run created on a thread a batch holds waits for that batch.
    claim_waits = [w for w, q in lock_waits if "candidate AS" in q]
    assert claim_waits == []
    assert max((w for w, _ in lock_waits), default=0.0) < 2.0, lock_waits[:5]
    # Everything created while pruning is still there, and the engine finishes it.
    assert len(created) >= 20, (len(created), len(pruned_threads))
    assert Run.objects.filter(id__in=created).count() == len(created)
    assert not Run.objects.filter(thread_id__in=pruned_threads).exists()
    wait_for(
        lambda: not Run.objects.filter(id__in=created, status__in=ACTIVE_STATUSES).exists(),
        timeout=120,
    )
    assert Run.objects.filter(id__in=created, status=RunStatus.SUCCESS).count() == len(created)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_pruning_skips_a_thread_someone_holds_and_says_it_is_not_done(drain) -> None:
    held_thread = services.thread_create(metadata={})
    held = finished_run(drain, thread=held_thread)
    free = finished_run(drain)
    age(held, free)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        # Another session holding the thread row (as a run being created on it would).
        try:
            with transaction.atomic():
                list(Thread.objects.select_for_update().filter(id=held_thread.id))
                locked.set()
                release.wait(30)
        finally:
            close_old_connections()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        result = services.runs_prune(older_than=timedelta(days=30), batch_size=1)
    finally:
        release.set()
        holder.join()
    assert result.runs == 1
    assert result.complete is False
    assert Run.objects.filter(id=held.id).exists()
    assert not Run.objects.filter(id=free.id).exists()
    again = services.runs_prune(older_than=timedelta(days=30))
    assert (again.runs, again.complete) == (1, True)


# --- LangGraph graph threads -------------------------------------------------------------------


def test_pruning_graph_runs_keeps_a_live_threads_state_and_deletes_an_emptied_one(
    transactional_db: Any, register_agent: Any, drain: Any, settings: Any
) -> None:
    from runs.graphs.loader import load_graphs
    from runs.models import GraphCheckpoint
    from tests.test_graphs import graphs_config

    settings.RUNS_API_AUTH = False
    register_agent(load_graphs(graphs_config())["slow"])
    gone, kept = services.thread_create(), services.thread_create()
    runs = [
        services.run_create(
            agent_id="slow", thread_id=t.id, input={"steps": 2, "delay_ms": 1}, actor="t"
        )
        for t in (gone, kept)
    ]
    drain()
    age(*runs)
    services.thread_update(thread=kept, metadata={"touched": True})
    before = Client().get(f"/api/threads/{kept.id}/state").json()

    result = services.runs_prune(older_than=timedelta(days=30))

    assert (result.runs, result.threads) == (2, 1)
    assert not GraphCheckpoint.objects.filter(thread_id=gone.id).exists()
    after = Client().get(f"/api/threads/{kept.id}/state")
    assert after.status_code == 200
    assert (
        after.json()["values"] == before["values"] == {"steps": 2, "delay_ms": 1, "items": [0, 1]}
    )
