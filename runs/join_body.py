"""The body LangGraph's join answers for a run just cancelled, read in the cancel's own statement
(runs/services/cancel.py): the same value `selectors.run_result` reads once the cancel is
committed (runs/selectors/results.py; tests/test_api_langgraph.py compares the two)."""

from __future__ import annotations

from typing import Any

from django.db import connections, router

from runs.models import Run

_NEWEST_OF_RUN = (
    '(SELECT c."values" FROM runs_checkpoint c WHERE c.run_id = %s'
    " ORDER BY c.created_at DESC, c.id DESC LIMIT 1)"
)
_NEWEST_OF_THREAD = (
    '(SELECT c."values" FROM runs_checkpoint c WHERE c.thread_id = %s{besides}'
    " ORDER BY c.created_at DESC, c.id DESC LIMIT 1)"
)


def result_after_cancel_sql(*, deleted: bool) -> str:
    """`run_result` of a top-level run on a thread as its cancel leaves it, as one SQL expression
    for the cancel's own statement to read (params: `result_after_cancel_params`), so that a
    cancel with wait answers without another read. It reads the same whether it runs before the
    cancel's writes or after them: the cancel adds and changes no checkpoint, and sets the
    thread's values to its newest checkpoint's (the run's excluded once `deleted`).

    Interrupted: the run's newest checkpoint, else its thread's (`run_outcome`'s COALESCE, the
    thread's values being that checkpoint's). Rolled back: the thread's newest checkpoint of
    another run. Decode what it reads with `result_from_column`."""
    if deleted:
        return _NEWEST_OF_THREAD.format(besides=" AND (c.run_id IS NULL OR c.run_id <> %s)")
    return f"COALESCE({_NEWEST_OF_RUN}, {_NEWEST_OF_THREAD.format(besides='')})"


def result_after_cancel_params(run_id: Any, thread_id: Any, *, deleted: bool) -> list[Any]:
    """The parameters of `result_after_cancel_sql`, ids as the database takes them."""
    alias = router.db_for_read(Run)
    prep = Run._meta.pk.get_db_prep_value
    run, thread = prep(run_id, connections[alias]), prep(thread_id, connections[alias])
    return [thread, run] if deleted else [run, thread]


def result_from_column(value: Any) -> Any:
    """The join body from the column `result_after_cancel_sql` read (as `run_outcome` decodes
    its values: none → {})."""
    # JSON columns come back as text on both databases (Django decodes them in the field).
    field: Any = Run._meta.get_field("error")
    return field.from_db_value(value, None, connections[router.db_for_read(Run)]) or {}
