"""A transaction's BEGIN goes with its first statement (runsite/postgres/lazy_begin.py): one
round trip less per transaction, and a transaction that still is one."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction

from runs.engine.worker import listen_conninfo
from runs.models import Thread
from runsite.postgres.lazy_begin import LazyBeginConnection

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@contextmanager
def traced() -> Iterator[list[str]]:
    """The messages this connection sends (libpq's trace), as "<type> <text>" lines."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile("w+") as out:
        pgconn.trace(out.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            pgconn.untrace()
            out.seek(0)
            messages: list[list[str]] = []
            for line in out:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3 and parts[0] in ("F", "B") and parts[1].isdigit():
                    messages.append(parts)
                elif messages:  # a statement's text goes on over lines of its own
                    messages[-1][-1] += "\n" + line.rstrip("\n")
            for parts in messages:
                if parts[0] == "F":
                    text = parts[3].strip() if len(parts) > 3 else ""
                    sent.append(f"{parts[2]} {text}".strip())


def round_trips(sent: list[str]) -> list[list[str]]:
    """The messages sent, cut where the client waits: after a Sync or a simple Query."""
    trips, trip = [], []
    for message in sent:
        if message == "Flush":  # asks the server to send what it has; nothing waits on it
            continue
        trip.append(message)
        if message.startswith(("Sync", "Query")):
            trips.append(trip)
            trip = []
    return trips


def other_connection() -> Any:
    return psycopg.connect(autocommit=True, **listen_conninfo())


def test_the_pool_lends_connections_that_begin_lazily() -> None:
    connection.ensure_connection()
    assert isinstance(connection.connection, LazyBeginConnection)


def test_a_transaction_begins_in_the_round_trip_of_its_first_statement() -> None:
    thread = Thread.objects.create(metadata={})
    with traced() as sent, transaction.atomic():
        Thread.objects.select_for_update().filter(id=thread.id).update(metadata={"a": 1})
    trips = round_trips(sent)
    assert len(trips) == 2, trips  # BEGIN with the UPDATE, then COMMIT (3 with BEGIN alone)
    assert any('"BEGIN"' in m for m in trips[0]) and any("UPDATE" in m for m in trips[0])
    assert trips[1] == ['Query "COMMIT"']


def test_what_the_first_statement_locks_stays_locked_until_the_commit() -> None:
    thread = Thread.objects.create(metadata={})
    with other_connection() as other:
        with transaction.atomic():
            list(Thread.objects.select_for_update().filter(id=thread.id))
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(
                    "SELECT 1 FROM runs_thread WHERE id = %s FOR UPDATE NOWAIT", [thread.id]
                )
            Thread.objects.filter(id=thread.id).update(metadata={"seen": False})
            row = other.execute("SELECT metadata FROM runs_thread WHERE id = %s", [thread.id])
            assert row.fetchone()[0] == {}  # not committed yet
        row = other.execute("SELECT metadata FROM runs_thread WHERE id = %s", [thread.id])
        assert row.fetchone()[0] == {"seen": False}


def test_a_rolled_back_transaction_leaves_nothing_and_the_connection_works() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Thread.objects.create(metadata={"gone": True})
        raise RuntimeError("undo")
    assert not Thread.objects.filter(metadata={"gone": True}).exists()
    kept = Thread.objects.create(metadata={})
    with pytest.raises(IntegrityError), transaction.atomic():  # the first statement fails
        Thread.objects.create(id=kept.id, metadata={})
    assert Thread.objects.filter(id=kept.id).count() == 1
    with transaction.atomic():
        Thread.objects.filter(id=kept.id).update(metadata={"after": True})
    assert Thread.objects.get(id=kept.id).metadata == {"after": True}


def test_savepoints_nest_inside_a_lazily_begun_transaction() -> None:
    with transaction.atomic():
        with transaction.atomic():  # the savepoint is the transaction's first statement
            Thread.objects.create(metadata={"outer": False})
        with pytest.raises(RuntimeError), transaction.atomic():
            Thread.objects.create(metadata={"inner": True})
            raise RuntimeError("to the savepoint")
    assert Thread.objects.filter(metadata={"outer": False}).exists()
    assert not Thread.objects.filter(metadata={"inner": True}).exists()


def test_a_named_cursor_is_held_only_outside_a_transaction() -> None:
    for _ in range(3):
        Thread.objects.create(metadata={})

    def holdable() -> list[bool]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT is_holdable FROM pg_cursors")
            return [row[0] for row in cursor.fetchall()]

    with transaction.atomic():  # the DECLARE opens the transaction (its BEGIN sent alone)
        rows = Thread.objects.order_by("id").iterator(chunk_size=1)
        next(rows)
        assert holdable() == [False]
        assert len([next(rows), next(rows)]) == 2
    rows = Thread.objects.order_by("id").iterator(chunk_size=1)
    next(rows)
    assert holdable() == [True]
    assert len(list(rows)) == 2


def test_autocommit_cannot_be_switched_inside_an_open_transaction() -> None:
    thread = Thread.objects.create(metadata={})
    with transaction.atomic():
        Thread.objects.filter(id=thread.id).update(metadata={"open": True})
        with pytest.raises(ProgrammingError, match="in transaction status INTRANS"):
            connection._set_autocommit(True)  # Django's public one refuses in atomic first
        # The transaction is untouched: it still commits what it wrote.
    assert Thread.objects.get(id=thread.id).metadata == {"open": True}


# A transaction's COMMIT with its last statement (`queue_commit`, rows.write_together(commit=True),
# rows.execute_last).


def _write_thread_metadata(thread_id: Any, metadata: str) -> tuple[str, list[Any]]:
    return ("UPDATE runs_thread SET metadata = %s::jsonb WHERE id = %s", [metadata, thread_id])


def test_a_transactions_last_write_carries_its_commit() -> None:
    from runs.rows import write_together

    thread = Thread.objects.create(metadata={})
    committed: list[bool] = []
    with other_connection() as other, traced() as sent, transaction.atomic():
        list(Thread.objects.select_for_update().filter(id=thread.id))
        transaction.on_commit(lambda: committed.append(True))
        row = write_together(
            [_write_thread_metadata(thread.id, '{"last": true}')],
            "SELECT %s",
            ["done"],
            connection.alias,
            commit=True,
        )
        assert row == ("done",)
        # Committed already: another connection sees it, and the lock is gone.
        seen = other.execute("SELECT metadata FROM runs_thread WHERE id = %s", [thread.id])
        assert seen.fetchone()[0] == {"last": True}
        other.execute("SELECT 1 FROM runs_thread WHERE id = %s FOR UPDATE NOWAIT", [thread.id])
        assert committed == []  # on-commit hooks still run when the block ends
    assert committed == [True]
    trips = round_trips(sent)
    # BEGIN with the locking read, then the write with its COMMIT: no COMMIT of its own.
    assert len(trips) == 2, trips
    assert any('"COMMIT"' in m for m in trips[1]) and any("UPDATE" in m for m in trips[1])
    assert Thread.objects.get(id=thread.id).metadata == {"last": True}


def test_nothing_runs_in_a_transaction_after_its_commit_went_with_a_statement() -> None:
    from runs.rows import write_together

    thread = Thread.objects.create(metadata={})
    refused = pytest.raises(ProgrammingError, match="committed with its last statement")
    with refused, transaction.atomic():
        write_together(
            [_write_thread_metadata(thread.id, '{"a": 1}')],
            "SELECT 1",
            [],
            connection.alias,
            commit=True,
        )
        # Would run outside any transaction: refused instead.
        Thread.objects.filter(id=thread.id).update(metadata={"b": 2})
    assert Thread.objects.get(id=thread.id).metadata == {"a": 1}  # the committed write
    with transaction.atomic():  # the connection goes on as usual
        Thread.objects.filter(id=thread.id).update(metadata={"c": 3})
    assert Thread.objects.get(id=thread.id).metadata == {"c": 3}


def test_a_last_write_that_fails_commits_nothing_of_its_transaction() -> None:
    from runs.rows import insert_statements, write_together

    kept = Thread.objects.create(metadata={})
    with pytest.raises(IntegrityError), transaction.atomic():
        Thread.objects.filter(id=kept.id).update(metadata={"earlier": True})
        write_together(
            insert_statements([Thread(id=kept.id, metadata={})]),  # a duplicate key
            "SELECT 1",
            [],
            connection.alias,
            commit=True,
        )
    assert Thread.objects.get(id=kept.id).metadata == {}
    with transaction.atomic():
        Thread.objects.filter(id=kept.id).update(metadata={"after": True})
    assert Thread.objects.get(id=kept.id).metadata == {"after": True}


def test_a_deferred_constraint_failing_at_the_commit_raises_from_the_write() -> None:
    import uuid

    from runs.models import RunEvent
    from runs.rows import insert_statements, write_together

    thread = Thread.objects.create(metadata={})
    orphan = RunEvent(run_id=uuid.uuid4(), seq=1, kind="created", data={}, actor="test")
    with pytest.raises(IntegrityError), transaction.atomic():
        Thread.objects.filter(id=thread.id).update(metadata={"earlier": True})
        # The foreign key is checked at the COMMIT, which went with the write.
        write_together(insert_statements([orphan]), "SELECT 1", [], connection.alias, commit=True)
    assert Thread.objects.get(id=thread.id).metadata == {}
    assert not RunEvent.objects.filter(run_id=orphan.run_id).exists()


def test_in_a_nested_block_the_commit_waits_for_the_outermost() -> None:
    from runs.rows import execute_last, write_together

    thread = Thread.objects.create(metadata={})
    with other_connection() as other, traced() as sent, transaction.atomic():
        with transaction.atomic():  # a savepoint: its end is not the transaction's
            write_together(
                [_write_thread_metadata(thread.id, '{"nested": true}')],
                "SELECT 1",
                [],
                connection.alias,
                commit=True,
            )
            with connection.cursor() as cursor:
                execute_last(
                    connection,
                    cursor,
                    "SELECT metadata ->> 'nested' FROM runs_thread WHERE id = %s",
                    [thread.id],
                )
                assert cursor.fetchone()[0] == "true"
        seen = other.execute("SELECT metadata FROM runs_thread WHERE id = %s", [thread.id])
        assert seen.fetchone()[0] == {}  # not committed yet
        Thread.objects.filter(id=thread.id).update(values={"more": True})
    assert round_trips(sent)[-1] == ['Query "COMMIT"']
    found = Thread.objects.get(id=thread.id)
    assert (found.metadata, found.values) == ({"nested": True}, {"more": True})


def test_execute_last_sends_a_statement_with_its_commit_and_reads_its_rows() -> None:
    from runs.rows import execute_last

    thread = Thread.objects.create(metadata={})
    with traced() as sent, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT id FROM runs_thread WHERE id = %s FOR UPDATE", [thread.id])
        execute_last(
            connection,
            cursor,
            "UPDATE runs_thread SET metadata = %(m)s::jsonb WHERE id = %(id)s RETURNING id",
            {"m": '{"x": 1}', "id": thread.id},
        )
        assert cursor.fetchone()[0] == thread.id
    trips = round_trips(sent)
    assert len(trips) == 2 and any('"COMMIT"' in m for m in trips[1]), trips
    assert Thread.objects.get(id=thread.id).metadata == {"x": 1}


@pytest.mark.usefixtures("drain")
def test_a_runs_hot_transactions_send_no_commit_of_their_own(drain: Any) -> None:
    """A run's create, its suspension, the decision that resumes it and a run's end each send
    their COMMIT with their last statement (no `Query "COMMIT"` round trip of their own)."""
    from runs import services
    from runs.models import Run

    def standalone_commits(sent: list[str]) -> int:
        return sum(trip == ['Query "COMMIT"'] for trip in round_trips(sent))

    thread = services.thread_create()
    with traced() as sent:
        services.run_create(
            agent_id="refund",
            thread_id=thread.id,
            input={"order_id": "A1", "amount": 5},
            actor="test",
        )
    assert standalone_commits(sent) == 0, round_trips(sent)  # the thread's first run
    with traced() as sent:
        drain()
    run = Run.objects.get(thread_id=thread.id)
    assert run.status == "suspended"
    assert standalone_commits(sent) == 0, round_trips(sent)  # the claim, the suspension
    with traced() as sent:
        services.thread_resume(thread_id=thread.id, resume={"approved": True}, actor="test")
    assert standalone_commits(sent) == 0, round_trips(sent)
    with traced() as sent:
        drain()
    assert Run.objects.get(id=run.id).status == "success"
    assert standalone_commits(sent) == 0, round_trips(sent)  # the claim, the end
    # The approved call's `running` mark went with the claim: no statement of its own.
    assert not any("w AS (UPDATE" in m for m in sent), round_trips(sent)
    # The end: its held writes (the refund's outcome), its fenced statement and, queued behind
    # it, its COMMIT, in one round trip; no plan mode's reset (the connection keeps it for the
    # next hot statement: runsite/postgres/lazy_begin.py).
    [end] = [trip for trip in round_trips(sent) if any("runs_lease_held" in m for m in trip)]
    assert any('UPDATE "runs_toolcall"' in m for m in end), end
    after_end = end[next(i for i, m in enumerate(end) if "runs_lease_held" in m) :]
    assert sum(m.startswith("Execute") for m in after_end) == 2, end
    assert not any("plan_cache_mode" in m for m in after_end), end
    with traced() as sent:
        services.run_create(agent_id="echo", thread_id=thread.id, input={"x": 1}, actor="test")
        drain()
    assert standalone_commits(sent) == 0, round_trips(sent)  # a later run's create; its end
    assert Run.objects.filter(thread_id=thread.id, status="success").count() == 2


def _prepared_texts(messages: list[str]) -> list[str]:
    """The statements the Bind messages among `messages` name, as this connection prepared
    them."""
    names = [m.split('"')[3] for m in messages if m.startswith("Bind ") and m.split('"')[3]]
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name = ANY(%s)", [names])
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
def test_a_bulk_cancel_takes_two_round_trips(action: str) -> None:
    """A bulk cancel of running runs on their threads: the runs the call selects, their threads'
    locks and theirs, read, with the BEGIN in one round trip; their end (or deletion), events,
    audit entries, threads and the workers' notices with the COMMIT in the other."""
    from runs import services

    threads = [services.thread_create() for _ in range(3)]
    for thread in threads:
        services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="t")
    assert len(services.run_claim(owner="w", limit=3)) == 3
    with traced() as sent:
        result = services.runs_cancel_many(action=action, actor="t", status="running")
    assert result.count == 3
    trips = round_trips(sent)
    assert len(trips) == 2, trips
    lock, write = trips
    assert any("BEGIN" in m for m in lock), lock
    # The locking read is planned once per connection: sent as its text, or bound by the name
    # of the statement prepared from it (an earlier bulk cancel on this connection).
    texts = [*lock, *_prepared_texts(lock)]
    assert any("FOR NO KEY UPDATE" in m and "runs_thread" in m for m in texts), lock
    # The write, then the COMMIT: no round trip of its own for the COMMIT, yet committed
    # (another connection sees it).
    at = next(i for i, m in enumerate(write) if "WITH w0 AS" in m)
    assert sum(m.startswith("Execute") for m in write[at:]) == 2, write
    assert connection.in_atomic_block is False
    with other_connection() as other:
        ids = [str(t.id) for t in threads]
        left = other.execute(
            "SELECT status FROM runs_run WHERE thread_id = ANY(%s::uuid[])", [ids]
        ).fetchall()
    assert [row[0] for row in left] == ([] if action == "rollback" else ["interrupted"] * 3)


def test_a_bulk_cancel_with_deliveries_to_write_commits_after_them() -> None:
    """A bulk cancel where a run's end is announced (a notification rule for its agent): the
    deliveries are written after the cancel's statement, in its transaction, so its COMMIT does
    not go with that statement; the runs and the delivery are committed together."""
    from runs import services
    from runs.models import Delivery, NotificationRule

    NotificationRule.objects.create(
        name="stops", agent_id="slow", events=["interrupted"], webhook_url="https://hooks.test/x"
    )
    threads = [services.thread_create() for _ in range(2)]
    for thread in threads:
        services.run_create(agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="t")
    assert len(services.run_claim(owner="w", limit=2)) == 2
    with traced() as sent:
        result = services.runs_cancel_many(action="interrupt", actor="t", status="running")
    assert result.count == 2
    assert round_trips(sent)[-1] == ['Query "COMMIT"'], round_trips(sent)
    with other_connection() as other:
        ids = [str(t.id) for t in threads]
        statuses = other.execute(
            "SELECT status FROM runs_run WHERE thread_id = ANY(%s::uuid[])", [ids]
        ).fetchall()
    assert [row[0] for row in statuses] == ["interrupted"] * 2
    assert Delivery.objects.filter(event="interrupted").count() == 2


def test_a_transaction_begun_by_hand_keeps_its_commit() -> None:
    from runs.rows import write_together

    thread = Thread.objects.create(metadata={})
    transaction.set_autocommit(False)
    try:
        with other_connection() as other:
            with transaction.atomic():  # inside the caller's own transaction: not its end
                write_together(
                    [_write_thread_metadata(thread.id, '{"by": "hand"}')],
                    "SELECT 1",
                    [],
                    connection.alias,
                    commit=True,
                )
            seen = other.execute("SELECT metadata FROM runs_thread WHERE id = %s", [thread.id])
            assert seen.fetchone()[0] == {}  # the caller commits, or not
            transaction.rollback()
    finally:
        transaction.set_autocommit(True)
    assert Thread.objects.get(id=thread.id).metadata == {}


def test_the_plan_mode_of_hot_statements_is_sent_only_when_it_changes() -> None:
    """Hot statements one after another send no plan mode after the first; the next statement
    with parameters sends its reset in its own round trip, and one without none at all."""
    from runs.rows import execute_planned

    hot = "SELECT id FROM runs_thread WHERE id = %s"
    other = "SELECT id FROM runs_thread WHERE id <> %s LIMIT 1"
    key = uuid.uuid4()

    def modes(trip: list[str]) -> list[str]:
        return [m for m in trip if "plan_cache_mode" in m]

    with connection.cursor() as cursor:
        cursor.execute(other, [key])  # the server's choice, whatever came before
        with traced() as sent:
            execute_planned(cursor, hot, [key])
            execute_planned(cursor, hot, [key])
            cursor.execute("SELECT 1")
            cursor.execute(other, [key])
    first, second, plain, after = round_trips(sent)
    assert len(modes(first)) == 1 and "SET plan_cache_mode" in modes(first)[0], first
    assert modes(second) == [] and modes(plain) == [], sent
    assert len(modes(after)) == 1 and "RESET plan_cache_mode" in modes(after)[0], after
    assert any("id <> $1" in m for m in after), after


def test_a_pipeline_raises_the_error_not_the_aborted_statements_behind_it() -> None:
    """A statement fails and its error is back before anything queued behind it is sent (a
    command of the connection's own, sent at the Sync: a COMMIT, a plan mode): the pipeline
    raises that error, not the `pipeline aborted` of what the server skipped."""
    import time

    connection.ensure_connection()
    conn = connection.connection
    for _ in range(5):
        with pytest.raises(psycopg.errors.DivisionByZero), conn.pipeline():
            conn.execute("SELECT 1 / (%s + 0 * length(pg_sleep(0.01)::text))", [0])
            time.sleep(0.05)  # its error is back
            conn.wait(conn._exec_command(b"SELECT 1"))  # queued behind it, skipped
    assert conn.execute("SELECT %s::int", [1]).fetchone() == (1,)
