"""What a run ended with, as LangGraph's /wait, /join and cancel(wait=true) answer it, and the
interrupts of runs waiting for a human."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connections, router

from runs.exceptions import NotFound
from runs.models import PENDING_DECISION_STATUSES, TERMINAL_STATUSES, Run, RunStatus, ToolCall
from runs.rows import instances

# A run in one of these has an outcome (a wait or join ends); a pending or running one has none
# yet. Followers of a run's events stop on these too (runs/api/streaming.py).
STOPPED = (*TERMINAL_STATUSES, RunStatus.SUSPENDED)
_FAILED = (RunStatus.ERROR, RunStatus.TIMEOUT)


def _listed(statuses: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in statuses)


# One statement, the same on PostgreSQL and SQLite, written out: the request paths that end
# with it (every wait, join and cancel with wait) would otherwise compile a subquery, a
# COALESCE and a join through the ORM on each call. The run's last state is its newest
# checkpoint's values, else its thread's; read only for a run that stopped other than by
# failing (a failed run answers with its error), so a follower polling a long run does not
# fetch its state each time.
def _outcome_values(thread_values: str) -> str:
    """The run's last state, read only when it stopped other than by failing: its newest
    checkpoint's values, else its thread's (`thread_values`)."""
    return f"""CASE WHEN r.status IN ({_listed(tuple(s for s in STOPPED if s not in _FAILED))})
            THEN COALESCE(
                (SELECT c."values" FROM runs_checkpoint c WHERE c.run_id = r.id
                  ORDER BY c.created_at DESC, c.id DESC LIMIT 1),
                {thread_values}) END"""


_OUTCOME_SQL = f"""
SELECT r.status, r.attempt, r.agent_id,
       CASE WHEN r.status IN ({_listed(_FAILED)}) THEN r.error END,
       {_outcome_values('t."values"')}
  FROM runs_run r LEFT JOIN runs_thread t ON t.id = r.thread_id
 WHERE r.id = %s
"""
# A join's first read: the run on its thread (in the caller's scope) and what its outcome needs,
# in one statement (`run_with_outcome`).
_RUN_WITH_OUTCOME_SQL = f"""
SELECT r.*,
       {_outcome_values('(SELECT t."values" FROM runs_thread t WHERE t.id = r.thread_id)')}
       AS outcome_values
  FROM runs_run r
 WHERE r.id = %s AND r.thread_id = %s
"""
_THREAD_VALUES_SQL = 'SELECT t."values" FROM runs_thread t WHERE t.id = %s'
_WAITING_SQL = (
    "SELECT * FROM runs_toolcall WHERE run_id = %s"
    f" AND status IN ({_listed(PENDING_DECISION_STATUSES)}) ORDER BY created_at, id"
)


@cache
def _json_field() -> Any:
    return Run._meta.get_field("error")


def _read_one(sql: str, key: UUID) -> tuple[Any, ...] | None:
    alias = router.db_for_read(Run)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(sql, [Run._meta.pk.get_db_prep_value(key, connection)])
        row = cursor.fetchone()
    return tuple(row) if row is not None else None


def _json(value: Any) -> Any:
    # JSON columns come back as text on both databases (Django decodes them in the field).
    alias = router.db_for_read(Run)
    return _json_field().from_db_value(value, None, connections[alias])


def run_outcome(run_id: UUID, *, thread_id: UUID | None = None) -> tuple[str | None, int, Any]:
    """(status, attempt, result) of a run in one read; the result is None while it is going.

    The result is LangGraph's: suspended → {"__interrupt__": [...]}, error/timeout →
    {"__error__": {...}}, otherwise the run's last state values. A run that no longer exists
    (rolled back) → (None, 0, its thread's reverted values or {}).
    """
    row = _read_one(_OUTCOME_SQL, run_id)
    if row is None:
        values = None
        if thread_id is not None:
            found = _read_one(_THREAD_VALUES_SQL, thread_id)
            values = _json(found[0]) if found else None
        return None, 0, values or {}
    status, attempt, agent_id, error, values = row
    return _outcome(run_id, status, attempt, agent_id, lambda: _json(error), lambda: _json(values))


def run_with_outcome(
    run_id: UUID, *, thread_id: UUID, pinned_resource_id: str | None = None
) -> tuple[Run, tuple[str | None, int, Any]]:
    """`run_get` of a run on `thread_id` (NotFound outside it or the caller's scope) and its
    `run_outcome`, read together: one statement for a run that is going or has ended (a join's
    first read), one more for a suspended run's waiting calls."""
    alias = router.db_for_read(Run)
    connection = connections[alias]
    sql, params = (
        _RUN_WITH_OUTCOME_SQL,
        [
            Run._meta.pk.get_db_prep_value(run_id, connection),
            Run._meta.pk.get_db_prep_value(thread_id, connection),
        ],
    )
    if pinned_resource_id is not None:
        sql, params = f"{sql} AND r.resource_id = %s", [*params, pinned_resource_id]
    found = instances(Run, sql, params, planned=True)
    if not found:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    run = found[0]
    values: Any = run.__dict__.pop("outcome_values")
    outcome = _outcome(
        run.id, run.status, run.attempt, run.agent_id, lambda: run.error, lambda: _json(values)
    )
    return run, outcome


def _outcome(
    run_id: UUID,
    status: str,
    attempt: int,
    agent_id: str,
    error: Callable[[], Any],
    values: Callable[[], Any],
) -> tuple[str | None, int, Any]:
    """`run_outcome` of a run that exists, from its status and what was read beside it."""
    if status not in STOPPED:
        return status, attempt, None
    if status == RunStatus.SUSPENDED:
        # Written out: every wait of a run that suspends ends with this read.
        alias = router.db_for_read(ToolCall)
        waiting = instances(
            ToolCall, _WAITING_SQL, [Run._meta.pk.get_db_prep_value(run_id, connections[alias])]
        )
        return status, attempt, {"__interrupt__": interrupts_of(waiting, agent_id=agent_id)}
    if status in _FAILED:
        return (
            status,
            attempt,
            {"__error__": error() or {"error": "Error", "message": f"run ended {status}"}},
        )
    return status, attempt, values() or {}


def run_result(run_id: UUID, *, thread_id: UUID | None = None) -> Any:
    """The value LangGraph's /wait and /join end with, for a run that stopped or was deleted
    (`run_outcome`'s result)."""
    return run_outcome(run_id, thread_id=thread_id)[2]


def interrupts_of(tool_calls: list[ToolCall], *, agent_id: str = "") -> list[dict[str, Any]]:
    """LangGraph interrupts ({"id", "value"}) for waiting tool calls (of `agent_id`'s run when
    given; each call's run otherwise)."""
    from runs.contracts import interrupt_of as _interrupt_of
    from runs.engine.registry import all_agents, tool_description
    from runs.graphs.loader import is_graph_agent

    agents = all_agents()

    return [
        # A LangGraph graph's interrupt is shown as the graph gave it (runs/graphs).
        {"id": tc.tool_call_id, "value": tc.suspend_payload}
        if is_graph_agent(agents.get(agent_id or tc.run.agent_id))
        else _interrupt_of(
            {
                "tool_call_id": tc.tool_call_id,
                "status": tc.status,
                "tool_name": tc.tool_name,
                "args": tc.args,
                "suspend_payload": tc.suspend_payload,
                "resume_schema": tc.resume_schema,
                "description": tool_description(agent_id or tc.run.agent_id, tc.tool_name),
            }
        )
        for tc in tool_calls
    ]


def threads_interrupts(thread_ids: list[UUID]) -> dict[UUID, dict[str, list[dict[str, Any]]]]:
    """{thread_id: {run_id: [interrupt, …]}} for threads whose top-level run is suspended."""
    by_thread: dict[UUID, dict[str, list[ToolCall]]] = {}
    calls = ToolCall.objects.filter(
        run__thread_id__in=thread_ids,
        run__status=RunStatus.SUSPENDED,
        run__parent_run__isnull=True,
        status__in=PENDING_DECISION_STATUSES,
    ).select_related("run")
    for tc in calls.order_by("created_at", "id"):
        if tc.run.thread_id is None:  # excluded by the filter; narrows the type
            continue
        by_thread.setdefault(tc.run.thread_id, {}).setdefault(str(tc.run_id), []).append(tc)
    return {
        tid: {rid: interrupts_of(tcs) for rid, tcs in runs.items()}
        for tid, runs in by_thread.items()
    }
