"""Runs search over the API: `GET /runs/search`, the dashboard's runs list for programs.

The same query keys as the runs list (and its saved views and exports): `q` (full-text on
PostgreSQL, words and phrases on SQLite, or the start of a run id), `sort`, `status` (repeat or
comma-separate), `agent`, `thread`, `resource`, `created_from`, `created_to`, `stuck`,
`pending_longer`, `subagents`, plus `limit` (1..100) and `offset`. Every value is checked as the
list checks it, but refused with 422 naming the field rather than dropped; unknown keys are
refused. A key pinned to a resource searches only that resource's runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.http import HttpRequest, QueryDict
from ninja import Field, Router, Schema

from runs import selectors
from runs.api.auth import caller_of
from runs.api.schemas import errors
from runs.exceptions import ValidationFailed
from runs.forms import RunFilterForm
from runs.list_query import LIST_QUERY_KEYS, check_query, check_sort
from runs.selectors.scope import Scope
from runs.selectors.search import RunListQuery, runs_list, search_highlights

search = Router(tags=["search"])

MAX_LIMIT = 100
KNOWN = (*LIST_QUERY_KEYS, "limit", "offset")


class SearchedRunOut(Schema):
    run_id: UUID = Field(alias="id")
    thread_id: UUID | None
    agent_id: str
    resource_id: str | None
    status: str
    attempt: int
    input: Any = None
    output: Any = None
    error: Any = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    updated_at: datetime
    # The matching passages, as (text, is a match) pieces; empty without `q`.
    match: list[tuple[str, bool]] = Field(default_factory=list, alias="search_match")


class SearchOut(Schema):
    runs: list[SearchedRunOut]
    total: int
    # A search counts up to 1,000 matches: `total_capped` says there are more.
    total_capped: bool
    limit: int
    offset: int


def _int_param(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationFailed.field(name, f"must be an integer from {low} to {high}") from None
    if not low <= value <= high:
        raise ValidationFailed.field(name, f"must be from {low} to {high}")
    return value


def _query(request: HttpRequest) -> RunListQuery:
    unknown = [name for name in request.GET if name not in KNOWN]
    if unknown:
        raise ValidationFailed.field(
            unknown[0], f"unknown query parameter; known: {', '.join(KNOWN)}"
        )
    data = QueryDict(mutable=True)
    for key in LIST_QUERY_KEYS:
        values = [v.strip() for raw in request.GET.getlist(key) for v in raw.split(",")]
        values = [v for v in values if v] if key == "status" else request.GET.getlist(key)
        if values:
            data.setlist(key, values)
    form = RunFilterForm(data)
    if not form.is_valid():
        field, messages = next(iter(form.errors.items()))
        raise ValidationFailed.field(field, " ".join(map(str, messages)))
    query = form.list_query()
    return RunListQuery(
        filters=query.filters,
        q=check_query(request.GET.get("q")),
        sort=check_sort(request.GET.get("sort")),
    )


@search.get("/runs/search", response={200: SearchOut, **errors()})
def search_runs(request: HttpRequest) -> dict[str, Any]:
    """Find runs by what they did: input, output, tool calls and their results, errors and the
    thread's metadata; filtered and sorted like the dashboard's runs list."""
    caller = caller_of(request)
    query = _query(request)
    limit = _int_param(request, "limit", 20, 1, MAX_LIMIT)
    offset = _int_param(request, "offset", 0, 0, 1_000_000)
    pin = caller.pinned_resource_id
    scope = selectors.UNSCOPED if pin is None else Scope(resources=frozenset({pin}))
    listing = runs_list(scope, query)
    total, capped = listing.count()
    rows = list(listing.queryset[offset : offset + limit])
    marks = search_highlights([r.id for r in rows], query.q) if query.q else {}
    for run in rows:
        run.search_match = marks.get(run.id, [])  # type: ignore[attr-defined]
    return {"runs": rows, "total": total, "total_capped": capped, "limit": limit, "offset": offset}
