"""`runs.rows`: the same instances a QuerySet reads, on either database."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db.models import Model

from runs import selectors, services
from runs.exceptions import NotFound
from runs.models import ApiKey, Run, Thread
from runs.rows import instances, row_by

pytestmark = pytest.mark.django_db


def _columns(instance: Model) -> dict[str, object]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_a_run_reads_as_the_orm_reads_it(drain):
    thread = services.thread_create(metadata={"resource_id": "acme", "note": "x"})
    run = services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": "O-1", "amount": 12.5, "nested": [1, {"a": None}]},
        actor="t",
    )
    drain()  # suspended: dates, JSON and the lease columns all set by the engine

    got = row_by(Run, id=run.id, thread_id=thread.id)
    want = Run.objects.get(id=run.id)

    assert got is not None
    assert _columns(got) == _columns(want)
    assert got.input == {"order_id": "O-1", "amount": 12.5, "nested": [1, {"a": None}]}
    assert got.created_at.tzinfo is not None
    assert isinstance(got.id, uuid.UUID) and isinstance(got.thread_id, uuid.UUID)
    assert got._state.adding is False and got._state.db == "default"
    # A relation given as an instance is matched by its key, as the ORM does.
    assert row_by(Run, id=run.id, thread=thread) is not None
    assert _columns(row_by(Thread, id=thread.id)) == _columns(Thread.objects.get(id=thread.id))


def test_every_column_must_match_and_none_means_null(drain):
    thread = services.thread_create(metadata={"resource_id": "acme"})
    other = services.thread_create()
    run = services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")

    assert row_by(Run, id=run.id, thread_id=other.id) is None
    assert row_by(Run, id=run.id, resource_id="globex") is None
    assert row_by(Run, id=run.id, resource_id="acme") is not None
    assert row_by(Run, id=uuid.uuid4()) is None
    assert row_by(Run, id=run.id, parent_run_id=None) is not None


def test_a_revoked_key_is_not_found_and_an_active_one_is():
    key, raw = services.api_key_create(name="k")

    assert selectors.api_key_for_raw(raw).id == key.id
    services.api_key_revoke(key=key)
    assert selectors.api_key_for_raw(raw) is None
    assert selectors.api_key_for_raw("not-a-key") is None
    assert row_by(ApiKey, key_hash=ApiKey.hash_key(raw), revoked_at=None) is None


def test_a_read_that_could_match_many_rows_is_refused():
    with pytest.raises(ValueError, match="unique column"):
        row_by(Run, agent_id="echo")


def test_scoped_gets_answer_not_found_outside_the_scope():
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(agent_id="echo", thread_id=thread.id, input={}, actor="t")

    assert selectors.run_get(run.id, pinned_resource_id="acme", thread_id=thread.id).id == run.id
    with pytest.raises(NotFound):
        selectors.run_get(run.id, pinned_resource_id="globex")
    with pytest.raises(NotFound):
        selectors.run_get(run.id, thread_id=uuid.uuid4())
    assert selectors.thread_get(thread.id, pinned_resource_id="acme").id == thread.id
    with pytest.raises(NotFound):
        selectors.thread_get(thread.id, pinned_resource_id="globex")


def test_instances_of_a_written_statement_read_as_the_orm_reads_them(drain):
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "O-7", "amount": 3}, actor="t"
    )
    drain()
    table = Run._meta.db_table
    columns = [f.column for f in Run._meta.concrete_fields]
    # The model's columns in reverse order, and one more that is not a column of the model.
    listed = ", ".join(f"r.{c}" for c in reversed(columns))
    sql = f"SELECT 7 AS extra, {listed} FROM {table} r WHERE r.agent_id = %s"

    [got] = instances(Run, sql, ["refund"])

    assert _columns(got) == _columns(Run.objects.get(id=run.id))
    assert got.input == {"order_id": "O-7", "amount": 3}
    assert got.extra == 7
    assert instances(Run, sql, ["nobody"]) == []


def test_instances_refuse_a_statement_that_lacks_a_column_of_the_model():
    services.run_create(agent_id="echo", thread_id=None, input={}, actor="t")
    with pytest.raises(ValueError, match="lacks columns"):
        instances(Run, f"SELECT id, status FROM {Run._meta.db_table}")


# --- insert ----------------------------------------------------------------------------------


def _new_run(thread: Thread, **fields: object) -> Run:
    return Run(thread=thread, agent_id="echo", status="pending", **fields)


def test_inserted_rows_read_back_as_bulk_create_writes_them() -> None:
    from runs.models import RunEvent
    from runs.rows import insert

    thread = services.thread_create(metadata={})
    payload = {"text": "naïve ünïcode", "list": [1, 2.5, None, True], "nested": {"a": {}}}
    mine, theirs = _new_run(thread, input=payload), _new_run(thread, input=payload)
    insert([mine])
    Run.objects.bulk_create([theirs])
    a, b = Run.objects.get(id=mine.id), Run.objects.get(id=theirs.id)
    skip = {"id", "created_at", "updated_at"}
    assert {k: v for k, v in _columns(a).items() if k not in skip} == {
        k: v for k, v in _columns(b).items() if k not in skip
    }
    assert a.input == payload and isinstance(a.id, uuid.UUID)
    # auto_now_add / auto_now set on the instance, as bulk_create sets them, and stored
    assert mine.created_at is not None and a.created_at == mine.created_at
    assert a.updated_at == mine.updated_at
    assert mine._state.adding is False and mine._state.db == "default"
    # an auto-numbered key is the database's: rows get consecutive ids, in order
    events = [RunEvent(run_id=mine.id, seq=i, kind="k", data={"i": i}, actor="t") for i in (1, 2)]
    insert(events)
    stored = list(RunEvent.objects.filter(run_id=mine.id).order_by("id"))
    assert [(e.seq, e.data) for e in stored] == [(1, {"i": 1}), (2, {"i": 2})]


def test_insert_writes_more_rows_than_one_statement_takes() -> None:
    from runs.models import RunEvent
    from runs.rows import insert

    run = services.run_create(agent_id="echo", thread_id=None, input=1, actor="t")
    events = [RunEvent(run_id=run.id, seq=100 + i, kind="k", data=i, actor="") for i in range(400)]
    insert(events)  # 6 columns × 400 rows: more than 999 parameters
    assert RunEvent.objects.filter(run_id=run.id, seq__gte=100).count() == 400


def test_insert_refuses_what_it_cannot_write_as_asked() -> None:
    from runs.models import RunEvent
    from runs.rows import insert

    thread = services.thread_create(metadata={})
    with pytest.raises(ValueError, match="one model"):
        insert([_new_run(thread), thread])
    with pytest.raises(ValueError, match="primary key"):
        insert([_new_run(thread, id=None)])
    with pytest.raises(ValueError, match="database's to number"):
        insert([RunEvent(id=5, run_id=uuid.uuid4(), seq=1, kind="k", data=None, actor="")])
    assert Run.objects.filter(thread=thread).count() == 0
    insert([])  # nothing to write: no statement


def test_writes_together_insert_a_run_and_its_events_and_read_as_they_were_before() -> None:
    from django.db import connection

    from runs.models import RunEvent
    from runs.rows import insert_statements, write_together

    thread = services.thread_create(metadata={})
    run = Run(id=uuid.uuid4(), thread=thread, agent_id="echo", status="pending", last_seq=2)
    events = [RunEvent(run_id=run.id, seq=n, kind="created", data={"n": n}) for n in (1, 2)]
    row = write_together(
        [*insert_statements([run]), *insert_statements(events)],
        # The select leaves the new run out by id: it reads the same in one statement
        # (PostgreSQL, where the writes are not visible to it) as after them (SQLite).
        "SELECT (SELECT count(*) FROM runs_run WHERE thread_id = %s AND id <> %s), %s",
        [thread.id.hex if connection.vendor == "sqlite" else thread.id, run.id.hex, "done"],
        connection.alias,
    )
    assert row == (0, "done")
    assert Run.objects.get(id=run.id).status == "pending"
    assert list(RunEvent.objects.filter(run_id=run.id).values_list("seq", "data")) == [
        (1, {"n": 1}),
        (2, {"n": 2}),
    ]
    assert run._state.adding is False


@pytest.mark.postgres
def test_writes_together_are_one_statement_on_postgresql() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.rows import insert_statements, write_together

    keys = [ApiKey(name=f"k{i}", key_hash=f"h{uuid.uuid4().hex}") for i in range(2)]
    with CaptureQueriesContext(connection) as queries:
        row = write_together(
            [*insert_statements(keys[:1]), *insert_statements(keys[1:])],
            "SELECT 1",
            [],
            connection.alias,
        )
    assert row == (1,)
    assert len(queries) == 1 and queries[0]["sql"].startswith("WITH w0 AS (INSERT")
    assert ApiKey.objects.filter(name__in=["k0", "k1"]).count() == 2


@pytest.mark.postgres
def test_writes_together_beyond_a_statements_parameters_go_as_several() -> None:
    """PostgreSQL binds at most 65,535 parameters per statement: 70,000 of them (a bulk cancel of
    thousands of runs writes that many) go as two statements, every row written."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.models import AuditEntry
    from runs.rows import insert_statements, write_together

    entries = [AuditEntry(actor="t", action=f"bulk-{i}") for i in range(6_400)]
    writes = insert_statements(entries)
    assert sum(len(params) for _, params in writes) > 65_535
    with CaptureQueriesContext(connection) as queries:
        assert write_together(writes, "SELECT %s", ["done"], connection.alias) == ("done",)
    assert len(queries) == 2
    assert AuditEntry.objects.filter(action__startswith="bulk-").count() == 6_400


def test_numbered_placeholders_are_postgresqls_own() -> None:
    from runs.rows import numbered

    assert numbered("SELECT %s, '%%' || %s WHERE a = %s") == "SELECT $1, '%' || $2 WHERE a = $3"
    assert numbered("SELECT 1") == "SELECT 1"
    with pytest.raises(ValueError, match="only %s and %%"):
        numbered("SELECT %(name)s")


@pytest.mark.postgres
@pytest.mark.parametrize("logged", [False, True], ids=["raw cursor", "django cursor"])
def test_writes_together_read_and_fail_alike_whether_or_not_queries_are_logged(logged) -> None:
    """Unlogged, write_together sends its numbered statement through psycopg's RawCursor;
    logged (DEBUG, tests counting statements), through Django's cursor. Same rows, same
    conversions, same errors either way."""
    from django.db import IntegrityError, connection, transaction

    from runs.models import AuditEntry
    from runs.rows import insert_statements, write_together

    run_id = uuid.uuid4()
    entries = [AuditEntry(actor="t", action="a", run_id=run_id, after={"k": [1, "%s"]})]
    connection.force_debug_cursor = logged
    try:
        row = write_together(
            insert_statements(entries),
            "SELECT %s::uuid, %s::jsonb, '100%%'",
            [run_id, json.dumps({"x": 1})],
            connection.alias,
        )
        assert row == (run_id, json.dumps({"x": 1}), "100%")  # jsonb reads as text (Django)
        assert AuditEntry.objects.get(run_id=run_id).after == {"k": [1, "%s"]}
        key_hash = f"h{uuid.uuid4().hex}"
        key = ApiKey(name="dup", key_hash=key_hash)
        write_together(insert_statements([key]), "SELECT 1", [], connection.alias)
        again = ApiKey(name="dup", key_hash=key_hash)
        with pytest.raises(IntegrityError), transaction.atomic():
            write_together(insert_statements([again]), "SELECT 1", [], connection.alias)
    finally:
        connection.force_debug_cursor = False


def test_column_names_are_what_the_cursors_description_names() -> None:
    """`rows.column_names` reads a psycopg result's names off the result itself; they are the
    description's, aliases and repeated names included, on either database."""
    from django.db import connection

    from runs.rows import column_names

    with connection.cursor() as cursor:
        cursor.execute('SELECT 1 AS "one", 2 AS "Two", 3 AS "one", %s AS "ünï"', ["x"])
        cursor.fetchall()
        assert column_names(cursor.cursor) == tuple(c[0] for c in cursor.description)
        assert column_names(cursor.cursor) == ("one", "Two", "one", "ünï")


def test_compact_drops_comments_and_spaces_but_not_inside_quotes() -> None:
    from runs.rows import compact

    sql = """
    SELECT 'a  -- kept', "an  id" -- it's a comment, quote and all
      FROM t   WHERE a-1 = %(x)s  -- another
    """
    assert compact(sql) == """SELECT 'a  -- kept', "an  id" FROM t WHERE a-1 = %(x)s"""
    with pytest.raises(ValueError):
        compact("SELECT $$ a $$")
    with pytest.raises(ValueError):
        compact("SELECT 'never closed FROM t")


def test_the_claim_is_short_enough_for_psycopg_to_convert_once() -> None:
    """psycopg converts a statement's placeholders on every call past this length; a claim is
    made once or more per run."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    from runs.services.queue import _claim_sql_postgres

    assert len(_claim_sql_postgres(10).encode()) <= MAX_CACHED_STATEMENT_LENGTH


# Values a text form must carry through untouched: quotes, backslashes, braces, commas, spaces,
# NULL spelled out, unicode.
AWKWARD = ['a "quoted" \\ back,slash', "{braces}", "", " spaced ", "NULL", "naïve ✓"]


@pytest.mark.postgres
def test_rows_inserted_from_arrays_read_back_as_a_values_list_writes_them() -> None:
    from runs.models import AuditEntry
    from runs.rows import insert_arrays_statement, insert_statements, write_together

    def entries(tag: str) -> list[AuditEntry]:
        return [
            AuditEntry(
                actor=text,
                action=tag,
                run_id=uuid.uuid4() if i % 2 else None,
                reason=text,
                resource_id=None if i % 3 else text,
                before={"text": text, "i": [i, None]},
                after=None,
            )
            for i, text in enumerate(AWKWARD)
        ]

    mine, theirs = entries("arrays"), entries("values")
    sql, params = insert_arrays_statement(AuditEntry, mine)
    write_together([(sql, params), *insert_statements(theirs)], "SELECT 1", [], "default")
    assert mine[0]._state.adding is False

    def stored(tag: str) -> list[tuple[object, ...]]:
        rows = AuditEntry.objects.filter(action=tag).order_by("id")
        return [(e.actor, e.reason, e.resource_id, e.before, e.after) for e in rows]

    assert (
        stored("arrays")
        == stored("values")
        == [
            (t, t, None if i % 3 else t, {"text": t, "i": [i, None]}, None)
            for i, t in enumerate(AWKWARD)
        ]
    )
    assert [e.run_id for e in AuditEntry.objects.filter(action="arrays").order_by("id")] == [
        e.run_id for e in mine
    ]
    # One text for any number of rows, none included.
    assert insert_arrays_statement(AuditEntry, [])[0] == sql
    assert insert_arrays_statement(AuditEntry, entries("more")[:1])[0] == sql


@pytest.mark.postgres
def test_a_value_too_long_for_its_column_is_refused_from_arrays_not_cut_short() -> None:
    from django.db import DataError, transaction

    from runs.models import AuditEntry
    from runs.rows import insert_arrays_statement, write_together

    statement = insert_arrays_statement(AuditEntry, [AuditEntry(actor="x" * 151, action="long")])
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        write_together([statement], "SELECT 1", [], "default")
    assert not AuditEntry.objects.filter(action="long").exists()


@pytest.mark.postgres
def test_an_array_parameter_is_one_type_whatever_its_values() -> None:
    from django.db import connection

    from runs.rows import array_param, execute_planned

    ids = [uuid.uuid4(), None, uuid.uuid4()]
    sql = "SELECT %s::uuid[], %s::text[] /* array_param */"
    with connection.cursor() as cursor:
        for uuids, texts in ((ids, AWKWARD), ([], []), ([None], [None])):
            execute_planned(
                cursor, sql, [array_param(uuids, "default"), array_param(texts, "default")]
            )
            assert cursor.fetchone() == (uuids, texts)
        # psycopg keys a prepared statement by its text and its parameters' types: one here.
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%array_param%"],
        )
        assert cursor.fetchone()[0] == 1


def test_insert_from_a_statement_refuses_a_field_the_model_does_not_have() -> None:
    from runs.models import RunEvent
    from runs.rows import insert_from_statement

    event = RunEvent(run_id=uuid.uuid4(), seq=1, kind="k", data={}, actor="")
    with pytest.raises(ValueError, match=r"no field \['sequence'\]"):
        insert_from_statement(event, "ok", {"sequence": "ok.last_seq + 1"})
    assert event._state.adding is True  # not marked saved: nothing was built
    sql, params = insert_from_statement(event, "ok", {"seq": "ok.last_seq + 1"})
    assert "SELECT" in sql and "ok.last_seq + 1" in sql and "FROM ok" in sql
    assert event._state.adding is False
