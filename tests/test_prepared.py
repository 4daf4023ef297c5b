"""Prepared statements on PostgreSQL (settings: DATABASE_PREPARE_THRESHOLD): a hot statement is
parsed and planned once per connection, not on every call; 0 turns it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection

from runs import selectors, services

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_it_prepares_a_statement_the_connection_runs_again() -> None:
    from runs.models import Thread

    thread = services.thread_create(metadata={})
    for _ in range(2):
        Thread.objects.filter(metadata__isnull=False).get(id=thread.id)
    assert not [s for s in _prepared() if 'FROM "runs_thread"' in s]
    # Run twice (DATABASE_PREPARE_THRESHOLD defaults to 2), the third call prepares it: its
    # parameter bound by the server, the plan kept on the connection.
    assert Thread.objects.filter(metadata__isnull=False).get(id=thread.id).id == thread.id
    assert [s for s in _prepared() if 'FROM "runs_thread"' in s and "$1" in s]
    assert Thread.objects.filter(metadata__isnull=False).get(id=thread.id).id == thread.id


def test_a_read_by_key_is_prepared_at_its_first_call() -> None:
    """`rows.row_by` (a run's or a thread's read by key) is planned as the hot statements are:
    prepared at its first call, with the generic plan."""
    thread = services.thread_create(metadata={})
    assert selectors.thread_get(thread.id).id == thread.id
    assert [s for s in _prepared() if 'FROM "runs_thread"' in s and "LIMIT 1" in s]


PROBE = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
import django
django.setup()
from django.conf import settings
options = settings.DATABASES["default"]["OPTIONS"]
print(json.dumps({k: options.get(k) for k in ("server_side_binding", "prepare_threshold")}))
"""


def _options(**env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_PREPARE")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**base, "DATABASE_URL": "postgres://runsite@127.0.0.1:5432/runsite", **env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    options: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return options


@pytest.mark.django_db(False)
def test_it_binds_on_the_server_and_prepares_by_default() -> None:
    assert _options() == {"server_side_binding": True, "prepare_threshold": 2}
    assert _options(DATABASE_PREPARE_THRESHOLD="5") == {
        "server_side_binding": True,
        "prepare_threshold": 5,
    }


@pytest.mark.django_db(False)
def test_zero_turns_prepared_statements_off() -> None:
    assert _options(DATABASE_PREPARE_THRESHOLD="0") == {
        "server_side_binding": None,
        "prepare_threshold": None,
    }


@pytest.mark.django_db(False)
def test_a_threshold_that_is_not_a_number_is_refused_at_start() -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_PREPARE")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={
            **base,
            "DATABASE_URL": "postgres://runsite@127.0.0.1:5432/runsite",
            "DATABASE_PREPARE_THRESHOLD": "often",
        },
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "DATABASE_PREPARE_THRESHOLD" in done.stderr


def _plans(*fragments: str) -> list[tuple[int, int]]:
    """(generic plans, custom plans) of this connection's prepared statements containing every
    one of `fragments`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE ALL(%s)",
            [[f"%{fragment}%" for fragment in fragments]],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def test_the_writes_that_park_and_cancel_a_run_are_planned_once(drain) -> None:
    # PostgreSQL plans a prepared statement for its values on its first five calls, and anew at
    # each later call while its generic plan looks dearer than those; planning is most of a
    # cancel's time in the database. The thread refresh in these writes once named its one
    # thread as an array of unknown length and was planned at every call; written as an
    # equality its generic plan is the one PostgreSQL keeps, and these statements run with
    # that plan from their first prepared call (rows._execute_planned_once): planned once.
    for i in range(8):
        thread = services.thread_create(metadata={})
        services.run_create(
            agent_id="refund",
            thread_id=thread.id,
            input={"amount": 5, "order_id": f"o{i}"},
            actor="t",
        )
        drain()  # to its suspension: the checkpoint, the waiting call, the thread refreshed
        for action in ("interrupt", "rollback"):
            other = services.thread_create(metadata={})
            run = services.run_create(agent_id="echo", thread_id=other.id, input={}, actor="t")
            services.run_cancel_on_thread(
                thread_id=other.id,
                run_id=run.id,
                action=action,
                actor="t",
                answer=services.CancelAnswer(),
            )
    for write in (
        'INSERT INTO "runs_checkpoint"',  # the suspension
        "UPDATE runs_run SET status",  # the interrupt
        "DELETE FROM runs_run",  # the rollback
    ):
        plans = _plans(write, "UPDATE runs_thread")
        assert plans, write
        for generic, custom in plans:
            # Eight calls, each prepared from the first and run with its one generic plan
            # (without forcing it: two unprepared calls, five custom plans, then the generic).
            assert (generic, custom) == (8, 0), (write, generic, custom)


def test_a_bulk_cancels_locking_read_and_a_run_queued_in_one_statement_are_planned_once() -> None:
    # The bulk cancel's locking read (by status) is the ORM's query inside a written
    # statement: psycopg prepared it at its third call, PostgreSQL planned it for its values at
    # each of those; the API's bulk cancel of ten running runs paid ~4 ms of parse and plan for
    # it on every call of a fresh server (docs/benchmarks.md). A run queued in one statement
    # (`runs._create_at_once`) is planned once as well.
    for _ in range(4):
        for _ in range(2):
            thread = services.thread_create(metadata={})
            services.run_create(agent_id="slow", thread_id=thread.id, input={}, actor="t")
        services.run_claim(owner="w", limit=2)
        services.runs_cancel_many(action="interrupt", actor="t", status="running")
    assert _plans("WITH s AS MATERIALIZED", "AS fresh") == [(4, 0)]
    assert _plans("WITH t AS MATERIALIZED", "AS hinted") == [(8, 0)]


# A refund run to its suspension, its resume and its end, in a process of its own (a new
# connection: a web process's first requests, a worker's new run thread), then how often its
# connection planned each hot statement of the way, either way.
FIRST_CALLS = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
import django
django.setup()
from django.db import connection
from runs import services
from runs.engine.worker import drain

def plans(*fragments, start=""):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE ALL(%s) AND ltrim(statement, chr(10) || chr(32)) LIKE %s",
            [["%" + f + "%" for f in fragments], start + "%"],
        )
        return [list(row) for row in cursor.fetchall()]

thread = services.thread_create(metadata={})
services.run_create(
    agent_id="refund", thread_id=thread.id, input={"amount": 5, "order_id": "o1"}, actor="t"
)
drain()
services.run_create(
    agent_id="refund", thread_id=thread.id, command={"resume": {"approved": True}}, actor="t"
)
drain()
print(json.dumps({
    "the look at the queue": plans("pending", "LIMIT 1", start="SELECT 1 FROM runs_run"),
    "the claim": plans("WITH RECURSIVE queue"),
    "the suspension's fence": plans("FOR NO KEY UPDATE", "UPDATE runs_run SET last_seq"),
    "the resume's locking read": plans("s AS MATERIALIZED", "waiting"),
    # (the approved call is marked running by the resumed run's claim)
    "the approved call marked running alone": plans("WITH f AS", "w AS (UPDATE"),
    # (its document built from what the worker holds: the lock reads nothing, in the end's
    # round trip)
    "the end's lock": plans("FOR NO KEY UPDATE", start="SELECT 1 FROM runs_thread WHERE id"),
    "the end's locking read (not made)": plans(
        "JOIN runs_run r ON r.thread_id = t.id", "OF t", start="SELECT"
    ),
    "the end": plans("status = 'success'", "runs_lease_held"),
}))
"""


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_plans_the_hot_statements_of_a_run_once() -> None:
    """Each is prepared at its first call and planned once, generic, where it was planned at
    each of its first eight (two calls before psycopg prepared it, five custom plans)."""
    from tests.helpers import probe

    seen = probe(FIRST_CALLS)
    # Each drain looked twice (a run, then an empty queue) and claimed once.
    looked = seen.pop("the look at the queue")
    assert looked == [[4, 0]], looked
    assert seen.pop("the claim") == [[2, 0]], seen
    assert seen.pop("the approved call marked running alone") == [], seen
    assert seen.pop("the end's locking read (not made)") == [], seen
    for name, plans in seen.items():
        assert plans == [[1, 0]], (name, plans)


def _plan_mode() -> str:
    """The plan mode a statement with parameters (any but a hot one) runs with."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('plan_cache_mode') WHERE %s", [True])
        return str(cursor.fetchone()[0])


def _hot_plan_mode() -> str:
    """The plan mode a hot statement (rows.execute_planned) runs with."""
    from runs.rows import execute_planned

    with connection.cursor() as cursor:
        execute_planned(cursor, "SELECT current_setting('plan_cache_mode') WHERE %s", [True])
        return str(cursor.fetchone()[0])


def _hot_write(divisor: int, *, fails_after: float = 0.0) -> None:
    """A statement sent as the hot writes are (rows.write_together): a write, then a read that
    divides by `divisor` (0: the statement fails in the database, `fails_after` seconds in:
    long enough for the pipeline's statements after it to be sent before its error is back)."""
    from runs.rows import write_together

    write_together(
        [("UPDATE runs_thread SET updated_at = updated_at WHERE false", [])],
        "SELECT 1 / (%s + 0 * length(pg_sleep(%s)::text))",
        [divisor, fails_after],
        connection.alias,
    )


@pytest.mark.django_db(transaction=True)
def test_forcing_the_generic_plan_ends_with_the_statement_that_asked_for_it() -> None:
    """Only the hot writes run with `force_generic_plan`: after one, succeeded or failed, in a
    transaction or on its own, the connection plans every other statement as before."""
    from django.db import DataError, transaction

    _hot_write(1)
    assert _plan_mode() == "auto"
    with pytest.raises(DataError):
        _hot_write(0)  # on its own: its implicit transaction rolled back, the SET with it
    assert _plan_mode() == "auto"
    with transaction.atomic():
        _hot_write(1)
        assert _plan_mode() == "auto"
        with pytest.raises(DataError), transaction.atomic():
            _hot_write(0)  # in a savepoint, rolled back to
        assert _plan_mode() == "auto"
    assert _plan_mode() == "auto"


@pytest.mark.django_db(transaction=True)
def test_a_statement_prepared_in_a_pipeline_that_failed_before_it_is_prepared_again() -> None:
    """psycopg names a statement it has counted as prepared when it queues its Parse; when the
    pipeline failed before the Parse ran, the name must not stay (runsite/postgres/prepared.py),
    or every later call fails with `prepared statement "_pg3_…" does not exist`."""
    import psycopg

    connection.ensure_connection()
    conn = connection.connection
    probe = "SELECT %s::int AS a_statement_counted_then_skipped"
    for _ in range(conn.prepare_threshold):
        conn.execute(probe, [1])  # counted, not prepared yet
    with pytest.raises(psycopg.errors.DivisionByZero), conn.pipeline():
        # Fails once the probe behind it is sent (not before its error could come back).
        conn.execute("SELECT 1 / (%s + 0 * length(pg_sleep(0.05)::text))", [0])
        conn.execute(probe, [2])  # prepared now, but the server skips it
    assert conn.execute(probe, [3]).fetchone() == (3,)
    assert conn.execute(probe, [4]).fetchone() == (4,)


@pytest.mark.django_db(transaction=True)
def test_hot_writes_that_fail_on_a_new_connection_leave_it_able_to_run_them() -> None:
    """On a new connection, hot writes that fail (their pipelines' statements counted towards
    psycopg's threshold, then skipped by the server) leave it able to run them; the plan mode
    sent with them is never counted (a command of the connection's own)."""
    from django.db import DataError

    connection.close()
    connection.close_pool()  # a new connection: its statements counted from none
    connection.ensure_connection()
    prepared = connection.connection._prepared
    assert not [k for k in [*prepared._counts, *prepared._names] if b"plan_cache_mode" in k[0]]
    _hot_write(1)  # its statement prepared
    for _ in range(4):
        with pytest.raises(DataError):
            _hot_write(0, fails_after=0.05)
    _hot_write(1)
    assert _plan_mode() == "auto"


@pytest.mark.django_db(transaction=True)
def test_hot_statements_run_with_the_generic_plan_and_the_rest_as_before_after_any_rollback() -> (
    None
):
    """The connection keeps the hot statements' plan mode between them and sends it, or its
    reset, only when needed (runsite/postgres/lazy_begin.py): whatever a rollback undid (of a
    transaction, to a savepoint, of a failed hot write's own), a hot statement still runs with
    the generic plan and any other statement with parameters with the server's choice."""
    from django.db import DataError, transaction

    assert (_plan_mode(), _hot_plan_mode(), _hot_plan_mode()) == (
        "auto",
        "force_generic_plan",
        "force_generic_plan",
    )
    assert _plan_mode() == "auto"

    class Undo(Exception):
        pass

    def rolled_back(mode: Callable[[], str], expected: str) -> None:
        """`mode` in a block rolled back: a transaction, or a savepoint inside one."""
        with pytest.raises(Undo), transaction.atomic():
            assert mode() == expected
            raise Undo

    # Set, then reset, each in a transaction that is rolled back: each undone.
    rolled_back(_hot_plan_mode, "force_generic_plan")
    assert _hot_plan_mode() == "force_generic_plan"
    rolled_back(_plan_mode, "auto")
    assert _plan_mode() == "auto"
    # The same in savepoints that are rolled back to.
    with transaction.atomic():
        rolled_back(_hot_plan_mode, "force_generic_plan")
        assert _hot_plan_mode() == "force_generic_plan"
        rolled_back(_plan_mode, "auto")
        assert _plan_mode() == "auto"
    # A hot write that fails on its own: its implicit transaction, the SET in it, rolled back.
    assert _plan_mode() == "auto"
    with pytest.raises(DataError):
        _hot_write(0)
    assert _hot_plan_mode() == "force_generic_plan"
    assert _plan_mode() == "auto"
