"""The runs' search documents, kept in step with what they are made of.

A run's document (models.RunSearch) is plain text: its input, output and error, the arguments,
answers and results of its tool calls, and its thread's metadata. Every service that changes
one of those calls `search_refresh` inside its own transaction, so a committed change is
searchable at once and a rolled-back one never is; a run's rollback deletes its document with
it (cascade). `manage.py search_reindex` rebuilds every document (after the migration that
added them, or a change of what a document holds).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import connection

from runs.models import Run, RunSearch, ToolCall

# PostgreSQL's tsvector holds at most 1 MB: a document is cut well below that (a run's huge
# output is still found by its first 100,000 characters).
MAX_DOCUMENT_CHARS = 100_000
# NUL cannot be stored in PostgreSQL text; \x02 and \x03 mark matches in highlights
# (selectors/search.py), so no document may contain them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _words(value: Any) -> Iterator[str]:
    """The text of a JSON value: keys and scalar values, in order."""
    if value is None:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _words(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _words(item)
    elif isinstance(value, bool):
        yield "true" if value else "false"
    else:
        yield str(value)


def _section(label: str, value: Any) -> str:
    text = " ".join(_words(value))
    return f"{label}: {text}" if text else ""


def search_document(
    *,
    input: Any,
    output: Any,
    error: Any,
    thread_metadata: Any,
    tool_calls: Iterable[tuple[str, Any, Any, Any]],
) -> str:
    """The document of one run; `tool_calls` are (tool_name, args, resume_data, result)."""
    parts = [_section("input", input), _section("output", output), _section("error", error)]
    for name, args, resume_data, result in tool_calls:
        parts.append(_section(f"tool {name}", args))
        parts.append(_section(f"answer {name}", resume_data))
        parts.append(_section(f"result {name}", result))
    parts.append(_section("thread", thread_metadata))
    document = "\n".join(p for p in parts if p)
    return _CONTROL.sub(" ", document)[:MAX_DOCUMENT_CHARS]


# PostgreSQL: each run with its calls as [[tool_name, args, resume_data, result], ...] in the
# order the document lists them, in one read; the documents written back in one statement.
# Written out: a worker refreshes a document on every write that touches tool calls (three
# times for a refund run to its suspension, once at every run's end), and the ORM compiled
# both statements each time (0.72 ms of CPU per refresh, 0.2 ms written out).
_DOCUMENT_ROWS_POSTGRES = """
SELECT r.id, r.input, r.output, r.error, t.metadata,
       (SELECT COALESCE(jsonb_agg(jsonb_build_array(tc.tool_name, tc.args, tc.resume_data,
                                                    tc.result)
                                  ORDER BY tc.step, tc.created_at, tc.id), '[]'::jsonb)
          FROM runs_toolcall tc WHERE tc.run_id = r.id)
  FROM runs_run r LEFT JOIN runs_thread t ON t.id = r.thread_id
 WHERE r.id = ANY(%s)
"""
_WRITE_POSTGRES = """
INSERT INTO runs_runsearch (run_id, document)
SELECT * FROM unnest(%s::uuid[], %s::text[])
ON CONFLICT (run_id) DO UPDATE SET document = EXCLUDED.document
"""


def search_refresh(*, run_ids: Iterable[UUID]) -> int:
    """Rewrite the documents of these runs from the database (call inside the transaction
    that changed them). Runs that no longer exist are skipped. Returns how many were written."""
    ids = list(dict.fromkeys(run_ids))
    if not ids:
        return 0
    rows: Iterable[tuple[Any, ...]]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_DOCUMENT_ROWS_POSTGRES, [ids])
            # JSON comes back as text (Django decodes it in the field).
            rows = [
                (row[0], *(json.loads(v) if v is not None else None for v in row[1:]))
                for row in cursor.fetchall()
            ]
    else:
        calls: dict[UUID, list[tuple[str, Any, Any, Any]]] = {}
        for run_id, name, args, resume_data, result in (
            ToolCall.objects.filter(run_id__in=ids)
            .order_by("step", "created_at", "id")
            .values_list("run_id", "tool_name", "args", "resume_data", "result")
        ):
            calls.setdefault(run_id, []).append((name, args, resume_data, result))
        rows = [
            (*row, calls.get(row[0], ()))
            for row in Run.objects.filter(id__in=ids).values_list(
                "id", "input", "output", "error", "thread__metadata"
            )
        ]
    documents = {
        run_id: search_document(
            input=input,
            output=output,
            error=error,
            thread_metadata=metadata,
            tool_calls=[tuple(call) for call in tool_calls or ()],
        )
        for run_id, input, output, error, metadata, tool_calls in rows
    }
    if connection.vendor == "postgresql":
        if documents:
            with connection.cursor() as cursor:
                cursor.execute(_WRITE_POSTGRES, [list(documents), list(documents.values())])
    else:
        RunSearch.objects.bulk_create(
            [RunSearch(run_id=run_id, document=doc) for run_id, doc in documents.items()],
            update_conflicts=True,
            unique_fields=["run"],
            update_fields=["document"],
        )
    return len(documents)


@dataclass
class DocumentSource:
    """What a run's document is made of, read by the statement that fences (or locks) a write
    to the run, so that the write can carry the run's new document with it instead of reading
    it back afterwards (`search_refresh`'s two statements). `calls` are
    [tool_call_id, tool_name, args, resume_data, result] in the document's order."""

    run_id: UUID
    input: Any
    output: Any
    error: Any
    thread_metadata: Any
    calls: list[list[Any]] = field(default_factory=list)

    def ended(self, *, output: Any = None, error: Any = None) -> None:
        """The run ends in this write, with `output` or `error`."""
        self.output, self.error = as_stored(output), as_stored(error)

    def call_changed(self, tool_call_id: str, **changes: Any) -> None:
        """A call of the run changes in this write (`args`, `resume_data` or `result`)."""
        position = {"args": 2, "resume_data": 3, "result": 4}
        for call in self.calls:
            if call[0] == tool_call_id:
                for name, value in changes.items():
                    call[position[name]] = as_stored(value)

    def calls_added(self, calls: Iterable[ToolCall]) -> None:
        """Calls this write creates, after the run's others (a later step, created later)."""
        for tc in calls:
            self.calls.append(
                [
                    tc.tool_call_id,
                    tc.tool_name,
                    as_stored(tc.args),
                    as_stored(tc.resume_data),
                    as_stored(tc.result),
                ]
            )

    def document(self) -> str:
        return search_document(
            input=self.input,
            output=self.output,
            error=self.error,
            thread_metadata=self.thread_metadata,
            tool_calls=[tuple(call[1:]) for call in self.calls],
        )

    def statement(self) -> tuple[str, list[Any]]:
        """The upsert of the run's document, for `rows.write_together`."""
        return _WRITE_ONE, [_pk(self.run_id), self.document()]


# What a document is made of, as columns of a statement over the run's row (`{run}`): a fence's
# RETURNING on PostgreSQL, a SELECT on SQLite (one read more there, where reads cost nothing).
# The run's calls as its document lists them (`DocumentSource.calls`), over its id `{run_id}`.
_CALLS_SOURCE_POSTGRES = """(SELECT COALESCE(jsonb_agg(jsonb_build_array(tc.tool_call_id, tc.tool_name,
                                                    tc.args, tc.resume_data, tc.result)
                                  ORDER BY tc.step, tc.created_at, tc.id), '[]'::jsonb)
          FROM runs_toolcall tc WHERE tc.run_id = {run_id})"""
_SOURCE_POSTGRES = """{run}.input, {run}.output, {run}.error,
       (SELECT t.metadata FROM runs_thread t WHERE t.id = {run}.thread_id),
       """ + _CALLS_SOURCE_POSTGRES.replace("{run_id}", "{run}.id")
_WRITE_ONE = (
    "INSERT INTO runs_runsearch (run_id, document) VALUES (%s, %s)"
    " ON CONFLICT (run_id) DO UPDATE SET document = EXCLUDED.document"
)


def as_stored(value: Any) -> Any:
    """A JSON value as the database hands it back: on PostgreSQL, jsonb keeps an object's keys
    shorter first, then by their bytes (and the last of duplicate keys), so a document made of
    values in hand lists their words as one made of the stored row does."""
    if connection.vendor != "postgresql":
        return value
    return _jsonb_order(value)


def _jsonb_order(value: Any) -> Any:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(str(k).encode()), str(k).encode()))
        return {str(k): _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list | tuple):
        return [_jsonb_order(item) for item in value]
    return value


def source_columns(run: str) -> str | None:
    """The columns `source_of` reads, over the run's row named `run` (PostgreSQL); None
    elsewhere (`source_read` reads them)."""
    return _SOURCE_POSTGRES.format(run=run) if connection.vendor == "postgresql" else None


def calls_source_sql(run_id: str) -> str:
    """The run's calls as `source_columns` reads them (its document's order), as an SQL
    expression over `run_id` (a column or a placeholder): what a write built from a source in
    hand compares with (`finish._end_at_once`)."""
    return _CALLS_SOURCE_POSTGRES.format(run_id=run_id)


def source_of(run_id: UUID, values: Sequence[Any]) -> DocumentSource:
    """The `DocumentSource` of the five `source_columns` values (JSON as text)."""
    input, output, error, metadata, calls = (
        json.loads(v) if isinstance(v, str) else v for v in values
    )
    return DocumentSource(run_id, input, output, error, metadata, [list(c) for c in calls])


def source_in_hand(run: Run, calls: Iterable[ToolCall]) -> DocumentSource | None:
    """The `DocumentSource` of a run its worker holds, from what the worker has in hand: the
    run as its claim read it (with its thread's metadata, `services.run_claim` on PostgreSQL)
    and its tool calls as the step loop keeps them. None without the thread's metadata
    (SQLite's claim), for a run whose end has deliveries to write, or with a call not yet given
    its creation time. Whoever writes a document built from it checks the source against the
    database in the same statement (`finish._end_at_once`): the thread's metadata can change
    while the run runs."""
    if "thread_metadata" not in run.__dict__ or run.__dict__.get("ends_announced", True):
        return None  # (an end with deliveries writes them after it: the two round trips)
    held = list(calls)
    if any(tc.created_at is None or tc.id is None for tc in held):
        return None
    held.sort(key=lambda tc: (tc.step, tc.created_at, tc.id))
    return DocumentSource(
        run.id,
        as_stored(run.input),
        None,
        None,
        as_stored(run.thread_metadata),
        [
            [
                tc.tool_call_id,
                tc.tool_name,
                as_stored(tc.args),
                as_stored(tc.resume_data),
                as_stored(tc.result),
            ]
            for tc in held
        ],
    )


def source_read(run_id: UUID) -> DocumentSource | None:
    """The `DocumentSource` of a run, read on its own (where a fence cannot return it)."""
    row = (
        Run.objects.filter(id=run_id)
        .values_list("input", "output", "error", "thread__metadata")
        .first()
    )
    if row is None:
        return None
    calls = [
        list(c)
        for c in ToolCall.objects.filter(run_id=run_id)
        .order_by("step", "created_at", "id")
        .values_list("tool_call_id", "tool_name", "args", "resume_data", "result")
    ]
    return DocumentSource(run_id, *row, calls)


def _pk(run_id: UUID) -> Any:
    return Run._meta.pk.get_db_prep_value(run_id, connection)


def new_run_document(*, run_id: UUID, input: Any, thread_metadata: Any) -> RunSearch:
    """The document of a run being created (no output, error or tool call yet), from what the
    caller holds, without reading it back; the caller inserts it with the run."""
    document = search_document(
        input=input, output=None, error=None, thread_metadata=thread_metadata, tool_calls=()
    )
    return RunSearch(run_id=run_id, document=document)


def search_refresh_thread(*, thread_id: UUID) -> int:
    """A thread's metadata changed: rewrite the documents of all its runs."""
    # One query for the ids (a thread's runs are few enough to hold; a server-side cursor
    # costs three round trips even for a thread without runs).
    run_ids = list(Run.objects.filter(thread_id=thread_id).values_list("id", flat=True))
    return sum(search_refresh(run_ids=run_ids[i : i + 500]) for i in range(0, len(run_ids), 500))
