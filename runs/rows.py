"""Model instances read without building a QuerySet: one row by equality on a few columns
(`row_by`), or the rows of a statement written out (`instances`); and new ones written without
it (`insert`).

`Model.objects.filter(a=x, b=y).first()` compiles its SQL on every call: ~0.35-0.6 ms of CPU
for a one-row read that PostgreSQL answers in ~0.1 ms. The reads every API request makes (its
key, the run or thread it names) are all of that shape, so `row_by` builds the statement and the
column converters once per (model, columns, database vendor) and then only executes it. The
model instance it returns is the ORM's own (`Model.from_db`), with every column loaded and
converted exactly as a QuerySet would (JSON, dates, UUIDs on SQLite). `instances` does for a
hand-written statement what `Model.objects.raw()` does, with its column mapping and converters
worked out once per statement shape instead of on every call. `write_together` sends several
writes (and a read) to PostgreSQL as one statement: one round trip instead of one each.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any, TypeVar

import psycopg
from django.db import connections, router
from django.db.models import Field, Model
from django.db.models.options import Options

M = TypeVar("M", bound=Model)


# (position in the row, the column's converters, the column expression they are given)
_Converters = tuple[int, tuple[Callable[..., Any], ...], Any]


@dataclass(frozen=True)
class _Statement:
    sql: str
    lookups: tuple[tuple[str, Field], ...]
    columns: tuple[str, ...]
    converters: tuple[_Converters, ...]


@cache
def _statement(
    model: type[Model], names: tuple[str, ...], nulls: frozenset[str], alias: str
) -> _Statement:
    meta = model._meta
    connection = connections[alias]
    quote = connection.ops.quote_name
    lookups = [(name, *_column(meta, name)) for name in names]
    if not any(f.primary_key or f.unique for _, f, _ in lookups):
        raise ValueError(
            f"row_by({model.__name__}) needs a unique column among {names}: it reads one row"
        )
    fields = meta.concrete_fields
    table = quote(meta.db_table)
    where = " AND ".join(
        f"{table}.{quote(column)} IS NULL" if name in nulls else f"{table}.{quote(column)} = %s"
        for name, _, column in lookups
    )
    columns = ", ".join(f"{table}.{quote(_column(meta, f.name)[1])}" for f in fields)
    converters = []
    for index, field in enumerate(fields):
        col = field.get_col(meta.db_table)
        found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if found:
            converters.append((index, tuple(found), col))
    return _Statement(
        sql=f"SELECT {columns} FROM {table} WHERE {where} LIMIT 1",
        lookups=tuple((name, f) for name, f, _ in lookups if name not in nulls),
        columns=tuple(f.attname for f in fields),
        converters=tuple(converters),
    )


def row_by(model: type[M], **equal: Any) -> M | None:  # noqa: UP047 - checks on Python 3.11 parse this file
    """`model.objects.filter(**equal).first()` for equality on concrete columns (None: IS NULL).

    One of the columns must be the primary key or unique: it reads at most one row, planned
    once per connection as the hot statements are (`execute_planned`). The lookups
    are the fields' names (`thread_id` or `thread` alike); values go through the field's own
    preparation, so a UUID or a model instance is accepted where the ORM accepts it.
    """
    alias = router.db_for_read(model)
    names = tuple(sorted(equal))
    nulls = frozenset(name for name in names if equal[name] is None)
    statement = _statement(model, names, nulls, alias)
    connection = connections[alias]
    params = [
        field.get_db_prep_value(_value_of(equal[name], field), connection, prepared=False)
        for name, field in statement.lookups
    ]
    with connection.cursor() as cursor:
        # By key: the generic plan is the one to keep (`execute_planned`), and a connection
        # that serves hot statements keeps their plan mode through it.
        execute_planned(cursor, statement.sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    values = _converted(row, statement.converters, connection)
    return model.from_db(alias, list(statement.columns), values)


def _converted(row: Any, converters: tuple[_Converters, ...], connection: Any) -> list[Any]:
    """The row's values as the ORM hands them over (its compiler's `apply_converters`)."""
    values = list(row)
    for index, functions, col in converters:
        value = values[index]
        for convert in functions:
            value = convert(value, col, connection)
        values[index] = value
    return values


def _column(meta: Options[Any], name: str) -> tuple[Field, str]:
    field = meta.get_field(name)
    if not isinstance(field, Field) or field.column is None:
        raise ValueError(f"row_by({meta.object_name}): {name} is not one of its columns")
    return field, field.column


def _value_of(value: Any, field: Field) -> Any:
    if isinstance(value, Model) and field.is_relation:
        return value.pk
    return value


@dataclass(frozen=True)
class _Mapping:
    model_columns: tuple[int, ...]  # positions of the model's columns in the row, in order
    attnames: tuple[str, ...]
    extras: tuple[tuple[int, str], ...]  # (position, name) of the other columns
    converters: tuple[_Converters, ...]


@cache
def _mapping(model: type[Model], names: tuple[str, ...], alias: str) -> _Mapping:
    meta = model._meta
    connection = connections[alias]
    index_of = {name: index for index, name in enumerate(names)}
    fields = meta.concrete_fields
    missing = [f.name for f in fields if _column(meta, f.name)[1] not in index_of]
    if missing:
        raise ValueError(f"instances({model.__name__}): the statement lacks columns {missing}")
    # In the model's field order, whatever the statement's (a table's `*` lists columns in the
    # order migrations added them).
    positions = tuple(index_of[_column(meta, f.name)[1]] for f in fields)
    converters = []
    for index, field in zip(positions, fields, strict=True):
        col = field.get_col(meta.db_table)
        found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
        if found:
            converters.append((index, tuple(found), col))
    extras = tuple((i, name) for i, name in enumerate(names) if i not in set(positions))
    return _Mapping(positions, tuple(f.attname for f in fields), extras, tuple(converters))


def column_names(cursor: Any) -> tuple[str, ...]:
    """The names of the columns of a DB-API cursor's last result. A psycopg cursor's are read off
    its result: its `description` makes an object per column (~60 µs for a run's 28, against
    ~7 here)."""
    result = getattr(cursor, "pgresult", None)
    if result is None:
        return tuple(column[0] for column in cursor.description or ())
    return tuple(result.fname(i).decode() for i in range(result.nfields))


def instances(  # noqa: UP047
    model: type[M],
    sql: str,
    params: Any = None,
    *,
    long: bool = False,
    planned: bool = False,
) -> list[M]:
    """The model's instances for the rows of `sql`, which selects every column of the model
    (by its column names) and may select more: those become attributes of the instances, as
    they do with `raw()`, unconverted. `long`: a statement psycopg would parse for its `%s` on
    every call (see `_fetch_numbered`), sent numbered instead on PostgreSQL, and planned once
    per connection (`_execute_planned_once`). `planned`: a hot statement that finds its rows by
    key, planned once per connection (`execute_planned`); `long` implies it."""
    alias = router.db_for_write(model)
    connection = connections[alias]
    if long and connection.vendor == "postgresql" and not connection.queries_logged:
        connection.ensure_connection()
        rows, names = _rows_numbered(connection, sql, params)
    else:
        with connection.cursor() as cursor:
            if planned:
                execute_planned(cursor, sql, params)
            else:
                cursor.execute(sql, params)
            rows = cursor.fetchall()
            names = column_names(cursor.cursor)
    if not rows:
        return []
    mapping = _mapping(model, names, alias)
    found = []
    for row in rows:
        values = _converted(row, mapping.converters, connection)
        instance = model.from_db(
            alias, list(mapping.attnames), [values[i] for i in mapping.model_columns]
        )
        for index, name in mapping.extras:
            setattr(instance, name, values[index])
        found.append(instance)
    return found


def instances_from_json(model: type[M], objects: Sequence[dict[str, Any]] | None) -> list[M]:  # noqa: UP047
    """The model's instances for rows PostgreSQL handed over as JSON objects (`to_jsonb(row)`,
    say in a `jsonb_agg` that lets one statement return another table's rows beside its own):
    each column's value made what the ORM gives by its field's `to_python` (timestamps, in
    UTC, and UUIDs from their text; JSON columns as they are)."""
    alias = router.db_for_read(model)
    fields = model._meta.concrete_fields
    attnames = [f.attname for f in fields]
    found = []
    for obj in objects or ():
        values = []
        for field in fields:
            value = obj[_column(model._meta, field.name)[1]]
            if value is not None:
                value = field.to_python(value)
                if isinstance(value, datetime):
                    value = value.astimezone(UTC)
            values.append(value)
        found.append(model.from_db(alias, attnames, values))
    return found


@dataclass(frozen=True)
class _Insert:
    fields: tuple[Field, ...]
    head: str  # INSERT INTO table (columns) VALUES
    row: str  # (%s, %s, …)
    rows_per_statement: int


@cache
def _insert(model: type[Model], with_pk: bool, alias: str) -> _Insert:
    meta = model._meta
    connection = connections[alias]
    quote = connection.ops.quote_name
    fields = tuple(f for f in meta.concrete_fields if with_pk or not f.primary_key)
    columns = ", ".join(quote(_column(meta, f.name)[1]) for f in fields)
    # SQLite caps a statement's parameters (999 in old builds): rows beyond that go in more
    # statements, as bulk_create batches them.
    per_statement = max(1, 999 // len(fields))
    return _Insert(
        fields,
        f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ",
        "(" + ", ".join(["%s"] * len(fields)) + ")",
        per_statement,
    )


def insert(objs: Sequence[Model]) -> None:
    """INSERT new instances of one model, as `bulk_create(objs)` does, without its compile.

    `bulk_create` builds its statement through the ORM on every call: ~0.4 ms of CPU for the
    three events of a step, half of what inserting them costs (docs/benchmarks.md). Here
    the statement's text is built once per model; each value is prepared by its field as
    `bulk_create` prepares it (`pre_save` then `get_db_prep_save`: defaults, `auto_now_add`,
    JSON, UUIDs on SQLite). An auto-incremented primary key is left to the database and not read
    back (`bulk_create` on PostgreSQL sets it from RETURNING): for rows nothing reads by id
    afterwards (events, audit entries). No signals, as with `bulk_create`.
    """
    if not objs:
        return
    alias = router.db_for_write(type(objs[0]))
    with connections[alias].cursor() as cursor:
        for sql, params in insert_statements(objs):
            cursor.execute(sql, params)


def insert_statements(objs: Sequence[Model]) -> list[tuple[str, list[Any]]]:
    """The statements `insert(objs)` executes, (sql, params) each: for `write_together`. The
    instances are marked saved, as `insert` marks them."""
    if not objs:
        return []
    model = type(objs[0])
    alias = router.db_for_write(model)
    connection = connections[alias]
    statement = _insert(model, _with_pk(model, objs), alias)
    per = statement.rows_per_statement
    statements = []
    for start in range(0, len(objs), per):
        chunk = objs[start : start + per]
        params = [
            field.get_db_prep_save(field.pre_save(obj, True), connection)
            for obj in chunk
            for field in statement.fields
        ]
        statements.append((statement.head + ", ".join([statement.row] * len(chunk)), params))
    _mark_saved(objs, alias)
    return statements


def _with_pk(model: type[Model], objs: Sequence[Model]) -> bool:
    """Whether `objs` (new instances of `model`) are inserted with their primary key: refused
    where they are not all of `model` or do not all agree with it."""
    if any(type(obj) is not model for obj in objs):
        raise ValueError("insert() takes instances of one model")
    with_pk = not model._meta.pk.db_returning  # an AutoField is numbered by the database
    if with_pk and any(obj.pk is None for obj in objs):
        raise ValueError(f"insert({model.__name__}): every instance needs its primary key")
    if not with_pk and any(obj.pk is not None for obj in objs):
        raise ValueError(f"insert({model.__name__}): its primary key is the database's to number")
    return with_pk


def _mark_saved(objs: Sequence[Model], alias: str) -> None:
    for obj in objs:
        obj._state.adding = False
        obj._state.db = alias


@cache
def _insert_arrays(model: type[Model], with_pk: bool, alias: str) -> str:
    statement = _insert(model, with_pk, alias)
    connection = connections[alias]
    # Each array cast to its column's type without its modifier (varchar, not varchar(32)): an
    # explicit cast to varchar(32) would cut a longer value short, where the INSERT's own
    # assignment to the column refuses it, as with a VALUES list.
    arrays = ", ".join(
        "%s::" + _TYPE_MODIFIER.sub("", f.db_type(connection) or "") + "[]"
        for f in statement.fields
    )
    return f"{statement.head.removesuffix('VALUES ')}SELECT * FROM unnest({arrays})"


_TYPE_MODIFIER = re.compile(r"\([^)]*\)")


def array_param(values: Sequence[Any], alias: str) -> str:
    """`values` as one PostgreSQL array in its text form (`{"a","b",NULL}`), each element as
    psycopg writes it as a parameter of its own (its text dumper), for a statement that casts it
    (`%s::uuid[]`).

    psycopg types a list by its first element that is not None, and an empty one (or one of
    None only) not at all; it prepares a statement per text and parameter types. So a statement
    given a list of UUIDs once and an empty list once was two statements prepared and planned
    on a connection. A text is always the same type: the statement is prepared once, whatever
    the values."""
    connection = connections[alias]
    connection.ensure_connection()
    transformer = psycopg.adapt.Transformer(connection.connection)
    items = []
    for value in values:
        if value is None:
            items.append("NULL")
            continue
        dumper = transformer.get_dumper(value, psycopg.adapt.PyFormat.TEXT)
        text = bytes(dumper.dump(value) or b"").decode()
        items.append('"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(items) + "}"


def insert_arrays_statement(model: type[Model], objs: Sequence[Model]) -> tuple[str, list[Any]]:
    """`insert_statements(objs)` as one PostgreSQL statement whose text is the same for any
    number of rows, none included: `INSERT … SELECT * FROM unnest(%s::type[], …)`, each
    column's values one array parameter. A connection then prepares and plans it once, where
    `insert_statements`' VALUES list is a new text, parsed and planned again, for each number of
    rows (a bulk cancel's events and audit entries: docs/benchmarks.md). The values are
    prepared by their fields as `insert_statements` prepares them; the instances are marked
    saved, as there."""
    alias = router.db_for_write(model)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ValueError("insert_arrays_statement() is PostgreSQL's (unnest of arrays)")
    with_pk = _with_pk(model, objs)
    fields = _insert(model, with_pk, alias).fields
    columns: list[list[Any]] = [[] for _ in fields]
    for obj in objs:
        for values, field in zip(columns, fields, strict=True):
            values.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
    _mark_saved(objs, alias)
    return _insert_arrays(model, with_pk, alias), [array_param(c, alias) for c in columns]


def insert_from_statement(
    obj: Model, source: str, expressions: dict[str, str]
) -> tuple[str, list[Any]]:
    """`insert_statements([obj])`'s INSERT as `INSERT … SELECT … FROM source` (PostgreSQL), for
    a statement whose writes depend on what one of its `WITH` parts found: a row when `source`
    has one, none when it has none. `expressions` are SQL taking a field's value from `source`
    instead of the instance (by field name: `{"resource_id": "ok.resource_id"}`); the other
    values are the instance's, prepared as `insert_statements` prepares them. The instance is
    marked saved, as there."""
    model = type(obj)
    meta = model._meta
    alias = router.db_for_write(model)
    connection = connections[alias]
    statement = _insert(model, not meta.pk.db_returning, alias)
    unknown = set(expressions) - {f.name for f in statement.fields}
    if unknown:
        raise ValueError(f"insert_from_statement({model.__name__}): no field {sorted(unknown)}")
    values, params = [], []
    for field in statement.fields:
        if field.name in expressions:
            values.append(expressions[field.name])
        else:
            values.append("%s")
            params.append(field.get_db_prep_save(field.pre_save(obj, True), connection))
    head = statement.head.removesuffix("VALUES ")
    obj._state.adding = False
    obj._state.db = alias
    return f"{head}SELECT {', '.join(values)} FROM {source}", params


def update_statement(
    model: type[Model], changes: dict[str, Any], where: str, where_params: Sequence[Any]
) -> tuple[str, list[Any]]:
    """`UPDATE table SET column = value, … WHERE where` for `write_together`: each value
    prepared by its field as `QuerySet.update` prepares it, one statement text per set of
    columns (so it is prepared once)."""
    alias = router.db_for_write(model)
    connection = connections[alias]
    meta = model._meta
    sets, params = [], []
    for name in sorted(changes):
        field, column = _column(meta, name)
        sets.append(f"{connection.ops.quote_name(column)} = %s")
        params.append(field.get_db_prep_save(changes[name], connection))
    table = connection.ops.quote_name(meta.db_table)
    return f"UPDATE {table} SET {', '.join(sets)} WHERE {where}", [*params, *where_params]


# Below PostgreSQL's limit of 65,535 parameters per statement (server-side binding).
MAX_PARAMETERS = 60_000


def _by_parameters(
    writes: Sequence[tuple[str, list[Any]]], limit: int
) -> list[list[tuple[str, list[Any]]]]:
    """`writes` in consecutive groups of at most `limit` parameters each (a part over the limit
    alone in its group)."""
    groups: list[list[tuple[str, list[Any]]]] = [[]]
    count = 0
    for write in writes:
        if groups[-1] and count + len(write[1]) > limit:
            groups.append([])
            count = 0
        groups[-1].append(write)
        count += len(write[1])
    return groups


def write_together(
    writes: Sequence[tuple[str, list[Any]]],
    select: str,
    params: Sequence[Any],
    alias: str,
    *,
    commit: bool = False,
) -> tuple[Any, ...] | None:
    """Execute the data-changing statements `writes`, then `select`; return select's row.

    On PostgreSQL all of it is one statement, one round trip: each write a data-modifying
    `WITH` part (PostgreSQL runs every such part whether or not it is referenced) and `select`
    the main query. Elsewhere (SQLite, whose round trips cost nothing) they run one after
    another. So the statements must not depend on one another's effects: in one statement
    every part and the select see the database as it was before any of them (a row inserted by
    one part is invisible to the others; a row may be changed by one part only), while run one
    after another they see each other. Write `select` so that it reads the same either way
    (e.g. leave rows the writes add or change out of its conditions explicitly). Foreign keys
    between rows inserted by different parts are checked at the end of the statement, so a run
    and its events may be inserted together.

    `commit`: the statement ends its transaction (nothing runs in it after this, and nothing
    after it may raise to roll it back): on PostgreSQL, in the outermost `atomic` block, its
    COMMIT goes in the same round trip (`commits_with_statement`)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql" and writes:
            *first, (last, last_params) = statements_together(writes, select, params)
            for sql, group_params in first:
                _fetch_numbered(connection, cursor, sql, group_params)
            return _fetch_numbered(
                connection,
                cursor,
                last,
                last_params,
                commit=commit and commits_with_statement(connection),
            )
        else:
            for sql, write_params in writes:
                cursor.execute(sql, write_params)
            cursor.execute(select, list(params))
        row = cursor.fetchone()
    return tuple(row) if row is not None else None


def statements_together(
    writes: Sequence[tuple[str, list[Any]]], select: str, params: Sequence[Any]
) -> list[tuple[str, list[Any]]]:
    """The PostgreSQL statements (`%s` placeholders) that `write_together` sends: `writes` as
    the data-modifying `WITH` parts of one statement whose main query is `select`, the last
    one. A statement takes at most 65,535 parameters with server-side binding: a big write (a
    bulk cancel of thousands of runs) goes as several statements, which `write_together`'s
    rule (no part depends on another) allows; each but the last selects 1."""
    groups = _by_parameters(writes, MAX_PARAMETERS - len(params))
    statements = []
    for n, group in enumerate(groups, start=1):
        parts = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(group))
        group_params = [p for _, ps in group for p in ps]
        if n < len(groups):
            statements.append((f"WITH {parts} SELECT 1", group_params))
        else:
            statements.append((f"WITH {parts} {select}", group_params + list(params)))
    return statements


_PLACEHOLDER = re.compile(r"%(.|$)", re.DOTALL)
# A statement's parts as `compact` reads them: a quoted literal or identifier (kept as it is), a
# comment (dropped), whitespace (one space), anything else.
_SQL_PARTS = re.compile(
    r"""('(?:[^']|'')*'|"(?:[^"]|"")*")|(--[^\n]*)|(\s+)|([^'"\s-]+|-)|(['"])"""
)


def compact(sql: str) -> str:
    """`sql` as sent: without its `--` comments, its whitespace outside quotes collapsed.
    psycopg converts a statement's placeholders once per text only while the text is at most
    4,096 bytes long (`MAX_CACHED_STATEMENT_LENGTH`), and on every call past that: the claim,
    explained line by line, was 6,659. Dollar quotes, block comments and a quote never closed
    are refused (none of these statements has one)."""
    if "$$" in sql or "/*" in sql:
        raise ValueError("compact(): dollar quotes and block comments are not read")
    out: list[str] = []
    for quoted, comment, space, other, unclosed in _SQL_PARTS.findall(sql):
        if unclosed:
            raise ValueError(f"compact(): a quote {unclosed} that is never closed")
        if quoted or other:
            out.append(quoted or other)
        elif (space or comment) and out and out[-1] != " ":
            out.append(" ")
    return "".join(out).strip()


@lru_cache(maxsize=256)
def numbered(sql: str) -> str:
    """`sql` with PostgreSQL's own placeholders: each `%s` becomes `$1`, `$2`…, `%%` becomes
    `%`. Any other `%` sequence is refused (`%(name)s` and the like are not used here)."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        if match.group(1) != "s":
            raise ValueError(f"numbered(): only %s and %% placeholders, got {match.group(0)!r}")
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, sql)


def commits_with_statement(connection: Any) -> bool:
    """Whether a transaction's COMMIT may be sent with its last statement, in one round trip: on
    a Runsite PostgreSQL connection (runsite/postgres/lazy_begin.py, `queue_commit`), inside
    Django's outermost `atomic` block (no savepoint: a nested block's end is not the
    transaction's), not marked for rollback, with no pipeline of the caller's open, and not
    while Django logs queries (DEBUG, or a test counting statements: its plain path)."""
    pg = connection.connection
    return (
        hasattr(pg, "queue_commit")
        and connection.in_atomic_block
        and connection.commit_on_exit  # (not inside a transaction the caller began by hand)
        and not connection.savepoint_ids
        and not connection.needs_rollback
        and pg._pipeline is None
        and not connection.queries_logged
    )


def execute_last(
    connection: Any,
    cursor: Any,
    sql: str,
    params: Any,
    *,
    before: Sequence[tuple[str, list[Any]]] = (),
) -> None:
    """`cursor.execute(sql, params)` for the statement that ends its transaction: with its
    COMMIT in the same round trip where `commits_with_statement` allows (the same rule as
    `write_together(commit=True)`: nothing may run in the transaction after it, nor raise to
    roll it back). Its rows are read from `cursor` afterwards, as usual.

    `before`: statements (`%s` placeholders, their rows unread) that go first, in the same
    round trip. A statement that fails stops the ones after it, COMMIT included, and raises:
    so `sql` must fail, not merely match no row, where it must not commit what `before` wrote
    (runs_lease_held, runs/migrations/0015)."""
    if not commits_with_statement(connection):
        for before_sql, before_params in before:
            execute_planned(cursor, before_sql, before_params)
        execute_planned(cursor, sql, params)
        return
    pg = connection.connection
    raw = psycopg.RawCursor(pg)
    try:
        # Planned once per connection, as `execute_planned` does it, in the same round trip.
        with connection.wrap_database_errors, pg.generic_plans_only(), pg.pipeline():
            for before_sql, before_params in before:
                raw.execute(numbered(before_sql), before_params, prepare=True)
            cursor.cursor.execute(sql, params, prepare=True)
            pg.queue_commit()
    finally:
        raw.close()


def fetch_long(sql: str, params: list[Any], alias: str) -> tuple[Any, ...] | None:
    """The first row of a long statement written out (`%s` placeholders): on PostgreSQL sent
    numbered and planned once per connection (`_fetch_numbered`), elsewhere as it is."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            return _fetch_numbered(connection, cursor, sql, params)
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return tuple(row) if row is not None else None


def _fetch_numbered(
    connection: Any, cursor: Any, sql: str, params: list[Any], *, commit: bool = False
) -> tuple[Any, ...] | None:
    """Execute `sql` (`%s` placeholders) on PostgreSQL and return its first row.

    psycopg turns `%s` into `$1`… by parsing the statement on every call once it is longer
    than 4,096 bytes or has more than 50 parameters (it caches only smaller ones), as every
    write sent together is: ~12 % of a worker's CPU in a run that suspends (docs/benchmarks.md).
    Here the numbered text is kept per statement text and sent through psycopg's RawCursor,
    which takes it as it is, planned once per connection (`_execute_planned_once`). When Django
    logs queries (DEBUG, or a test counting statements), the statement goes through Django's
    own cursor instead, which is what logs it.
    """
    if connection.queries_logged:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        return tuple(row) if row is not None else None
    rows, _ = _rows_numbered(connection, sql, params, commit=commit)
    return tuple(rows[0]) if rows else None


def _rows_numbered(
    connection: Any, sql: str, params: Any, *, commit: bool = False
) -> tuple[list[Any], tuple[str, ...]]:
    """The rows of `sql` (`%s` placeholders, sent numbered through psycopg's RawCursor and
    planned once per connection) and the names of its columns, on a connection that is open.
    `commit`: its transaction's COMMIT goes with it (`commits_with_statement` said it may)."""
    raw = psycopg.RawCursor(connection.connection)
    try:
        with connection.wrap_database_errors:
            _execute_planned_once(raw, numbered(sql), params, commit=commit)
            rows = raw.fetchall()
            names = column_names(raw)
    finally:
        raw.close()
    return rows, names


# The hot statements' plan, made once per connection (see `_execute_planned_once`), where
# the connection cannot keep it between them itself (not a LazyBeginConnection).
_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
_PLANS_AS_BEFORE = "RESET plan_cache_mode"


def _execute_planned_once(raw: Any, sql: str, params: Any, *, commit: bool = False) -> None:
    """Execute `sql` on the psycopg cursor `raw`, planned once per connection, in one round
    trip.

    psycopg prepares a statement on its execution after `prepare_threshold` (the third, by
    default), and PostgreSQL plans a prepared statement for its values (a custom plan) on its
    first five executions and only then may keep one generic plan: a statement was planned at
    each of its first eight executions on every connection. These hand-written statements (a
    claim, a fence, a cancel, a suspension, a run's end, a decision) lock rows by key and
    write by key, so their generic plans are the ones PostgreSQL settles on anyway
    (`bench/plan_cache.py`: none is planned at every call), but planning one is most of its
    cost in the database (2-3 ms of a cancel's 3-4): every new connection, after every
    restart, paid it eight times per statement (a worker's new run thread, a web process's
    first requests). Here the statement is prepared at its first execution and runs with
    `plan_cache_mode = force_generic_plan`, set and reset around it in the same pipeline (one
    round trip): PostgreSQL plans it once. Runsite's connections keep that setting from one
    hot statement to the next and send it, or its `RESET` before any other statement with
    parameters, only when the session does not have it already (`generic_plans_only`,
    runsite/postgres/lazy_begin.py); any other connection sets and resets it around the
    statement. A SET is transactional: when the statement fails, the rollback of its
    transaction (the pipeline's own, outside one) undoes the SET with it; every other statement
    keeps the server's plan choice. With prepared statements off
    (`DATABASE_PREPARE_THRESHOLD=0`) psycopg prepares nothing, asked or not."""
    conn = raw.connection
    if not hasattr(conn, "generic_plans_only"):  # not a LazyBeginConnection
        with conn.pipeline():
            conn.execute(_GENERIC_PLANS)
            raw.execute(sql, params, prepare=True)
            conn.execute(_PLANS_AS_BEFORE)
            if commit:
                conn.queue_commit()  # refused there (no such method), as before
        return
    with conn.generic_plans_only():
        if commit or conn._pipeline is not None or conn.begin_pending or conn.plans_due():
            with conn.pipeline():  # what goes first in the same round trip
                raw.execute(sql, params, prepare=True)
                if commit:
                    conn.queue_commit()  # (runsite/postgres/lazy_begin.py)
        else:
            raw.execute(sql, params, prepare=True)


def execute_planned(cursor: Any, sql: str, params: Any) -> None:
    """`cursor.execute(sql, params)` (a Django cursor) for a hand-written hot statement that
    finds and locks its rows by key: on PostgreSQL prepared at its first execution and planned
    once per connection (`_execute_planned_once`), its rows read from `cursor` as usual;
    elsewhere, and while Django logs queries (DEBUG, a test counting statements), Django's own
    execute."""
    connection = cursor.db
    if connection.vendor != "postgresql" or connection.queries_logged:
        cursor.execute(sql, params)
        return
    connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:
        _execute_planned_once(cursor.cursor, sql, params)
