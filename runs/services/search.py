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
from collections.abc import Iterable, Iterator
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
