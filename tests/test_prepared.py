"""Prepared statements on PostgreSQL (settings: DATABASE_PREPARE_THRESHOLD): a hot statement is
parsed and planned once per connection, not on every call; 0 turns it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    thread = services.thread_create(metadata={})
    for _ in range(2):
        selectors.thread_get(thread.id)
    assert not [s for s in _prepared() if 'FROM "runs_thread"' in s]
    # Run twice (DATABASE_PREPARE_THRESHOLD defaults to 2), the third call prepares it: its
    # parameter bound by the server, the plan kept on the connection.
    assert selectors.thread_get(thread.id).id == thread.id
    assert [s for s in _prepared() if 'FROM "runs_thread"' in s and "$1" in s]
    assert selectors.thread_get(thread.id).id == thread.id


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


def test_the_writes_that_park_and_cancel_a_run_keep_one_plan(drain) -> None:
    # PostgreSQL plans a prepared statement anew at each call while its generic plan looks
    # dearer than the plans it made for the values given; the thread refresh in these writes
    # named its one thread as an array of unknown length, and so was planned at every call
    # (most of a cancel's time in its write). Written as an equality, the generic plan is kept
    # after PostgreSQL's five custom ones.
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
            # Eight calls, of which the first two unprepared: five custom plans, then generic.
            assert (generic, custom) == (1, 5), (write, generic, custom)
