"""A run created on a thread this process knows, in one statement (`runs._create_at_once`), and
every case in which the hint it is built from must not be trusted."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.exceptions import Conflict, NotFound
from runs.models import Run, RunEvent, RunSearch, RunStatus, Thread
from runs.services import thread_hints

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class _AnyId:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and len(other) == 36


ANY_ID = _AnyId()


def _create(thread: Thread, **more: Any) -> tuple[Run, list[str]]:
    """`run_create` of echo on the thread, and the statements it sent (BEGIN and COMMIT aside:
    the one statement sends neither, it commits alone)."""
    with CaptureQueriesContext(connection) as queries:
        run = services.run_create(
            agent_id="echo", thread_id=thread.id, input={"text": "hello"}, actor="t", **more
        )
    sent = [q["sql"] for q in queries.captured_queries]
    return run, [sql for sql in sent if sql not in ("BEGIN", "COMMIT")]


def _written(run: Run) -> dict[str, Any]:
    """What a creation left in the database for the run and its thread (ids aside)."""
    row = Run.objects.get(id=run.id)
    thread = Thread.objects.get(id=row.thread_id)
    return {
        "run": (row.status, row.agent_id, row.resource_id, row.input, row.metadata, row.kwargs),
        "events": [
            (e.seq, e.kind, e.data, e.actor) for e in RunEvent.objects.filter(run_id=run.id)
        ],
        "document": RunSearch.objects.get(run_id=run.id).document,
        "thread": (thread.status, thread.metadata),
        "last_seq": row.last_seq,
    }


def test_a_run_on_a_thread_made_here_is_one_statement_and_writes_what_the_full_path_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metadata = {"zeta": 1, "b": {"y": True, "xx": [1, "two"]}, "resource_id": "acme"}
    hinted = services.thread_create(metadata=metadata)
    with CaptureQueriesContext(connection) as sent:
        run, statements = _create(hinted, metadata={"source": "test"})
    assert len(sent) == 1 and statements[0].startswith("WITH t AS MATERIALIZED")
    assert run.resource_id == "acme" and run.status == RunStatus.PENDING

    unknown = services.thread_create(metadata=metadata)
    monkeypatch.setattr(thread_hints, "recall", lambda thread_id: None)
    full, full_statements = _create(unknown, metadata={"source": "test"})
    assert len(full_statements) == 2  # the lock, then the write

    assert _written(run) == _written(full)
    assert Thread.objects.get(id=hinted.id).metadata["graph_id"] == "echo"
    # Its worker finds it, as any queued run.
    assert [c.run.id for c in services.run_claim(owner="w", limit=5)] == [run.id, full.id]


def test_a_second_run_follows_the_hint_the_first_left() -> None:
    thread = services.thread_create(metadata={})
    first, _ = _create(thread)
    Run.objects.filter(id=first.id).update(status=RunStatus.SUCCESS)
    Thread.objects.filter(id=thread.id).update(status="idle")
    second, statements = _create(thread)
    assert len(statements) == 1
    assert Run.objects.filter(thread_id=thread.id).count() == 2
    assert "graph_id echo" in RunSearch.objects.get(run_id=second.id).document


def test_a_hint_older_than_the_thread_takes_the_full_path_and_writes_what_the_thread_holds() -> (
    None
):
    thread = services.thread_create(metadata={"team": "old"})
    # Changed by another process: this one still holds {"team": "old"}.
    Thread.objects.filter(id=thread.id).update(metadata={"team": "new"})
    run, statements = _create(thread)
    assert len(statements) == 3  # the statement that wrote nothing, the lock, the write
    document = RunSearch.objects.get(run_id=run.id).document
    assert "team new" in document and "team old" not in document
    assert Thread.objects.get(id=thread.id).metadata["team"] == "new"
    assert Run.objects.filter(thread_id=thread.id).count() == 1
    # What the full path read is the hint now.
    _, statements = _create(thread)
    assert len(statements) == 1


def test_reject_on_a_busy_thread_is_refused_and_writes_nothing() -> None:
    thread = services.thread_create(metadata={})
    _create(thread)
    before = Thread.objects.get(id=thread.id)
    with pytest.raises(Conflict) as refused:
        _create(thread, multitask_strategy="reject")
    assert refused.value.code == "thread_busy"
    assert Run.objects.filter(thread_id=thread.id).count() == 1
    after = Thread.objects.get(id=thread.id)
    assert (after.status, after.updated_at) == (before.status, before.updated_at)


def test_reject_on_an_idle_thread_is_one_statement() -> None:
    thread = services.thread_create(metadata={})
    run, statements = _create(thread, multitask_strategy="reject")
    assert len(statements) == 1
    assert Run.objects.get(id=run.id).status == RunStatus.PENDING


def test_a_thread_outside_the_callers_scope_is_not_found_and_one_inside_is_one_statement() -> None:
    thread = services.thread_create(metadata={}, pinned_resource_id="acme")
    with pytest.raises(NotFound) as missing:
        _create(thread, pinned_resource_id="globex")
    assert missing.value.code == "thread_not_found"
    assert not Run.objects.filter(thread_id=thread.id).exists()
    run, statements = _create(thread, pinned_resource_id="acme")
    assert len(statements) == 1 and run.resource_id == "acme"


def test_a_deleted_thread_is_not_found_and_if_not_exists_create_makes_it_again() -> None:
    thread = services.thread_create(metadata={})
    Thread.objects.filter(id=thread.id).delete()
    with pytest.raises(NotFound):
        _create(thread)
    run, _ = _create(thread, if_not_exists="create")
    assert Run.objects.get(id=run.id).thread_id == thread.id


def test_new_metadata_on_a_thread_with_runs_rewrites_their_documents() -> None:
    """The one statement stamps a thread's metadata only on its first run: with earlier runs,
    their documents follow the thread's new metadata, which the full path rewrites."""
    thread = services.thread_create(metadata={})
    first, _ = _create(thread)
    Run.objects.filter(id=first.id).update(status=RunStatus.SUCCESS)
    # Its stamp taken away (by hand, as another process could), and this process knows it.
    Thread.objects.filter(id=thread.id).update(metadata={"team": "a"}, status="idle")
    thread_hints.remember(thread.id, {"team": "a"})
    services.run_create(agent_id="slow", thread_id=thread.id, input={}, actor="t")
    assert Thread.objects.get(id=thread.id).metadata["graph_id"] == "slow"
    assert "graph_id slow" in RunSearch.objects.get(run_id=first.id).document


def test_interrupt_and_rollback_take_the_full_path() -> None:
    thread = services.thread_create(metadata={})
    first, _ = _create(thread)
    second, statements = _create(thread, multitask_strategy="interrupt")
    assert not statements[0].startswith("WITH t AS MATERIALIZED")
    assert Run.objects.get(id=first.id).status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=second.id).status == RunStatus.PENDING


def test_hints_are_kept_as_postgresql_returns_jsonb() -> None:
    thread = services.thread_create(metadata={"bb": 1, "a": {"zz": 2, "c": 3}, "ccc": [{"y": 1}]})
    stored = Thread.objects.get(id=thread.id).metadata
    hint = thread_hints.recall(thread.id)
    assert hint == stored and list(hint) == list(stored) == ["a", "bb", "ccc"]
    assert list(hint["a"]) == list(stored["a"]) == ["c", "zz"]


def test_a_stateless_run_is_written_with_its_thread_in_one_statement() -> None:
    with CaptureQueriesContext(connection) as queries:
        run = services.run_create(agent_id="echo", thread_id=None, input={"a": 1}, actor="t")
    statements = [q["sql"] for q in queries.captured_queries]
    assert [s for s in statements if s not in ("BEGIN", "COMMIT")] == [statements[1]]
    thread = Thread.objects.get(id=run.thread_id)
    assert thread.status == "busy" and thread.delete_when_done
    assert thread.metadata == {"stateless": True, "graph_id": "echo", "assistant_id": ANY_ID}
    assert RunEvent.objects.get(run_id=run.id).kind == "created"
    assert "input: a 1" in RunSearch.objects.get(run_id=run.id).document
    assert [c.run.id for c in services.run_claim(owner="w", limit=5)] == [run.id]
