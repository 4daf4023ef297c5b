"""A bulk cancel's statements (`services.runs_cancel_many` by status or ids through the API) have
one text whatever the number of runs, so a connection prepares and plans each once; a web
process plans them as it starts (`services.bulk_cancel_planned`, runsite/warmup.py), on the
connection its pool lends first."""

from __future__ import annotations

import pytest
from django.db import connection

from runs import services
from runs.models import AuditEntry, Run, RunEvent, RunStatus, Thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

# Fragments naming each statement of a bulk cancel in pg_prepared_statements.
READ_BY_STATUS = ("WITH s AS MATERIALIZED", "parent_run_id IS NULL AND status = ANY(", "AS fresh")
READ_BY_IDS = (*READ_BY_STATUS, "AND id = ANY(")
INTERRUPT = ("UPDATE runs_run SET status", 'INSERT INTO "runs_runevent"', "unnest(")
ROLLBACK = ("DELETE FROM runs_run WHERE", 'INSERT INTO "runs_auditentry"', "unnest(")


def _plans(*fragments: str, without: str = "(none)") -> list[tuple[int, int]]:
    """(generic plans, custom plans) of this connection's prepared statements holding every
    one of `fragments` (and not `without`)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE ALL(%s) AND statement NOT LIKE %s",
            [[f"%{fragment}%" for fragment in fragments], f"%{without}%"],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def _running(count: int) -> list[Run]:
    runs = []
    for _ in range(count):
        thread = services.thread_create(metadata={})
        runs.append(services.run_create(agent_id="slow", thread_id=thread.id, input={}, actor="t"))
    services.run_claim(owner="w", limit=count)
    return runs


def test_bulk_cancels_of_any_size_are_each_one_statement_planned_once() -> None:
    # The events' and audit entries' VALUES lists, the notices and a single run's equality
    # made a new text per number of runs: parsed and planned again on each.
    for count in (1, 2, 3, 5):
        _running(count)
        services.runs_cancel_many(action="interrupt", actor="t", status="running")
    assert Run.objects.filter(status=RunStatus.INTERRUPTED).count() == 11
    assert _plans(*READ_BY_STATUS, without="AND id = ANY(") == [(4, 0)]
    assert _plans(*INTERRUPT) == [(4, 0)]
    for count in (1, 4):
        runs = _running(count)
        services.runs_cancel_many(action="rollback", actor="t", run_ids=[r.id for r in runs])
    assert _plans(*READ_BY_IDS) == [(2, 0)]
    assert _plans(*ROLLBACK) == [(2, 0)]
    assert Run.objects.count() == 11


def test_planning_the_bulk_cancel_changes_nothing_and_is_what_a_bulk_cancel_runs() -> None:
    runs = _running(3)
    before = (
        list(Run.objects.order_by("id").values_list("id", "status", "last_seq")),
        RunEvent.objects.count(),
        AuditEntry.objects.count(),
        list(Thread.objects.order_by("id").values_list("id", "status", "updated_at")),
    )
    services.bulk_cancel_planned()
    after = (
        list(Run.objects.order_by("id").values_list("id", "status", "last_seq")),
        RunEvent.objects.count(),
        AuditEntry.objects.count(),
        list(Thread.objects.order_by("id").values_list("id", "status", "updated_at")),
    )
    assert after == before
    for statement in (INTERRUPT, ROLLBACK, READ_BY_IDS):
        assert _plans(*statement) == [(1, 0)], statement
    assert _plans(*READ_BY_STATUS, without="AND id = ANY(") == [(1, 0)]

    services.runs_cancel_many(action="interrupt", actor="t", status="running")
    assert _plans(*READ_BY_STATUS, without="AND id = ANY(") == [(2, 0)]
    assert _plans(*INTERRUPT) == [(2, 0)]
    assert {r.status for r in Run.objects.filter(id__in=[r.id for r in runs])} == {
        RunStatus.INTERRUPTED
    }
    assert AuditEntry.objects.filter(action="cancel_interrupt").count() == 3
    assert RunEvent.objects.filter(kind="cancelled").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_bulk_cancel_tells_the_worker_of_each_running_run() -> None:
    runs = _running(3)
    with connection.cursor() as cursor:
        cursor.execute("LISTEN " + connection.ops.quote_name(services.cancel_channel("w")))
    services.runs_cancel_many(action="interrupt", actor="t", status="all")
    told = connection.connection.notifies(timeout=2, stop_after=1)
    payloads = {n.payload for n in told}
    # `<run id>=<action>` each: the worker stops them without asking the database.
    assert payloads == {",".join(f"{r.id}=interrupt" for r in sorted(runs, key=lambda r: r.id))}


# A web process's start (runsite/asgi.py runs the warm-up), then the bulk cancel the API runs,
# on the connection its pool lends next: the statements planned at the start serve it.
STARTED = """
import json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
import runsite.asgi  # the warm-up
from django.db import connection
from runs import services

def plans(*fragments, without="(none)"):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE ALL(%s) AND statement NOT LIKE %s",
            [["%" + f + "%" for f in fragments], "%" + without + "%"],
        )
        return [list(row) for row in cursor.fetchall()]

seen = {"at start": plans(*INTERRUPT)}
threads = [services.thread_create(metadata={}) for _ in range(4)]
for thread in threads:
    services.run_create(agent_id="slow", thread_id=thread.id, input={}, actor="t")
services.run_claim(owner="w", limit=4)
services.runs_cancel_many(action="interrupt", actor="t", status="running")
seen["read"] = plans(*READ_BY_STATUS, without="AND id = ANY(")
seen["write"] = plans(*INTERRUPT)
print(json.dumps(seen))
"""


@pytest.mark.django_db(transaction=True)
def test_a_web_process_plans_the_bulk_cancel_as_it_starts_on_the_connection_lent_next() -> None:
    from tests.helpers import probe

    seen = probe(f"READ_BY_STATUS = {READ_BY_STATUS!r}\nINTERRUPT = {INTERRUPT!r}\n{STARTED}")
    assert seen == {"at start": [[1, 0]], "read": [[2, 0]], "write": [[2, 0]]}, seen
