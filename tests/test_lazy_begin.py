"""A transaction's BEGIN goes with its first statement (runsite/postgres/lazy_begin.py): one
round trip less per transaction, and a transaction that still is one."""

from __future__ import annotations

import tempfile
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
            for line in out:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3 and parts[0] == "F":
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
