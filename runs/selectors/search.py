"""The runs list as support staff use it: search, sort, saved views, export, a run's history.

Every query here starts from `matching_runs(user, filters)`, that is `runs_filtered(filters,
user=…)`: the one place that decides which runs a user may see (tenant scope, runs/selectors/
scope.py), so search, sorting, exports, saved-view counts and the id jump follow it.

Search (`q`) looks in each run's search document (models.RunSearch: input, output, error, tool
calls' arguments, answers and results, thread metadata, kept in step by runs/services/search.py):
on PostgreSQL full-text (`websearch_to_tsquery('simple', q)` against a GIN-indexed tsvector:
words, "quoted phrases", -excluded, or), on SQLite every word or quoted phrase as a
case-insensitive substring (-word excludes). A query that looks like the start of a run id
(8 or more hex digits) also matches the runs whose id starts with it, by a range on the primary
key (no extra index).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet
from django.db.models.expressions import OrderBy, RawSQL
from django.db.models.functions import Coalesce, Now

from runs.exceptions import NotFound
from runs.list_query import DEFAULT_SORT, MAX_VIEWS, check_query, check_sort
from runs.models import Checkpoint, Run, RunEvent, RunSearch, SavedView, ToolCall
from runs.selectors import (
    RunFilters,
    runs_filtered,
    waiting_tool_calls_prefetch,
    with_queue_holders,
)

# A search's total is counted up to this many runs ("1000+"): counting every match of a common
# word over a million documents would cost more than the page itself.
SEARCH_COUNT_CAP = 1000
MIN_ID_PREFIX = 8
# Markers ts_headline puts around a match; documents never contain them (services/search.py).
_START, _STOP = "\x02", "\x03"
_HEX_PREFIX = re.compile(r"^[0-9a-fA-F-]+$")


def matching_runs(user: Any, filters: RunFilters | None = None) -> QuerySet[Run]:
    """The runs `user` may see, filtered: the single entry point of every read in this module."""
    return runs_filtered(filters if filters is not None else RunFilters(), user=user)


@dataclass(frozen=True)
class RunListQuery:
    filters: RunFilters = field(default_factory=RunFilters)
    q: str = ""
    sort: str = DEFAULT_SORT


def id_prefix_bounds(q: str) -> tuple[UUID, UUID] | None:
    """The smallest and largest ids that start with `q`, if `q` looks like an id's start."""
    if not _HEX_PREFIX.match(q):
        return None
    digits = q.replace("-", "").lower()
    if not MIN_ID_PREFIX <= len(digits) <= 32:
        return None
    return UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f"))


def run_id_jump(user: Any, q: str) -> UUID | None:
    """The one run (top-level or not, any filter aside) whose id starts with `q`, if exactly one."""
    bounds = id_prefix_bounds(q.strip())
    if bounds is None:
        return None
    found = list(
        matching_runs(user, RunFilters(top_level_only=False))
        .filter(id__gte=bounds[0], id__lte=bounds[1])
        .values_list("id", flat=True)[:2]
    )
    return found[0] if len(found) == 1 else None


# --- text search ------------------------------------------------------------------------------


def _sqlite_terms(q: str) -> tuple[list[str], list[str]]:
    """(wanted, excluded) words and quoted phrases, as websearch_to_tsquery reads them."""
    wanted: list[str] = []
    excluded: list[str] = []
    for phrase, word in re.findall(r'(-?"[^"]*")|(\S+)', q):
        term = phrase or word
        negate = term.startswith("-") and len(term) > 1
        term = term.lstrip("-").strip('"').strip()
        if not term or term.lower() == "or":
            continue
        (excluded if negate else wanted).append(term)
    return wanted, excluded


def _text_match(q: str, bounds: tuple[UUID, UUID] | None) -> Q:
    if connection.vendor == "postgresql":
        # A semi-join on the GIN index: the planner starts from the index for a rare word and
        # from the list's own order (created index) for a common one. An id prefix joins as a
        # UNION inside the same subquery (an OR of two conditions would defeat both indexes).
        sql = (
            "SELECT run_id FROM runs_runsearch"
            " WHERE document_tsv @@ websearch_to_tsquery('simple', %s)"
        )
        params: list[Any] = [q]
        if bounds is not None:
            sql += " UNION SELECT id FROM runs_run WHERE id BETWEEN %s AND %s"
            params += [bounds[0], bounds[1]]
        return Q(id__in=RawSQL(sql, params))  # noqa: S611 - constant SQL, values as parameters
    wanted, excluded = _sqlite_terms(q)
    condition = Q(id__gte=bounds[0], id__lte=bounds[1]) if bounds is not None else Q(pk__in=[])
    if not wanted and not excluded:
        return condition
    documents = RunSearch.objects.all()
    for term in wanted:
        documents = documents.filter(document__icontains=term)
    for term in excluded:
        documents = documents.exclude(document__icontains=term)
    return condition | Q(id__in=documents.values("run_id"))


def search_runs(qs: QuerySet[Run], q: str) -> QuerySet[Run]:
    """`qs` narrowed to the runs whose document matches `q` (or whose id starts with it)."""
    return qs.filter(_text_match(q, id_prefix_bounds(q)))


Segments = list[tuple[str, bool]]  # (text, is a match): templates escape every piece


def _segments(marked: str) -> Segments:
    out: Segments = []
    for i, piece in enumerate(re.split(f"[{_START}{_STOP}]", marked)):
        if piece:
            out.append((piece, i % 2 == 1))
    return out


def _snippet(document: str, q: str, width: int = 90) -> Segments:
    """SQLite: the document around its first match, each match marked."""
    wanted, _ = _sqlite_terms(q)
    if not wanted:
        return []
    pattern = re.compile("|".join(re.escape(t) for t in wanted), re.IGNORECASE)
    first = pattern.search(document)
    if first is None:
        return []
    start = max(0, first.start() - width)
    end = min(len(document), first.end() + width)
    text = document[start:end]
    out: Segments = [("…", False)] if start else []
    at = 0
    for m in pattern.finditer(text):
        if m.start() > at:
            out.append((text[at : m.start()], False))
        out.append((m.group(0), True))
        at = m.end()
    if at < len(text):
        out.append((text[at:], False))
    if end < len(document):
        out.append(("…", False))
    return out


def search_highlights(run_ids: list[UUID], q: str) -> dict[UUID, Segments]:
    """The matching passages of these runs' documents (only a page's rows), marked."""
    if not run_ids or not q:
        return {}
    documents = RunSearch.objects.filter(run_id__in=run_ids)
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchHeadline, SearchQuery

        rows = documents.annotate(
            headline=SearchHeadline(
                "document",
                SearchQuery(q, config="simple", search_type="websearch"),
                config="simple",
                start_sel=_START,
                stop_sel=_STOP,
                max_words=24,
                min_words=10,
                max_fragments=2,
                fragment_delimiter=" … ",
            )
        ).values_list("run_id", "headline")
        # ts_headline returns the document's start when nothing matched (an id match): no marks.
        return {rid: _segments(h) for rid, h in rows if h and _START in h}
    return {
        rid: seg
        for rid, doc in documents.values_list("run_id", "document")
        if (seg := _snippet(doc, q))
    }


# --- the list -------------------------------------------------------------------------------


def _order(sort: str) -> tuple[Any, ...]:
    key = sort.lstrip("-")
    desc = sort.startswith("-")
    if key == "duration":
        duration = ExpressionWrapper(
            Coalesce(F("finished_at"), Now()) - F("started_at"), output_field=DurationField()
        )
        by: Any = OrderBy(duration, descending=desc, nulls_last=True)
        return (by, "-id" if desc else "id")
    fields = {"created": ("created_at",), "activity": ("updated_at",), "attempts": ("attempt",)}
    names = [*fields[key], "id"] if key != "attempts" else ["attempt", "created_at", "id"]
    return tuple(f"-{n}" if desc else n for n in names)


@dataclass
class RunList:
    """A runs list page's query: filters, search and sort applied, in order."""

    queryset: QuerySet[Run]
    query: RunListQuery
    # The order as field names when a live page may insert a new run at its place (by
    # creation only: a search page, or one sorted by something that changes, updates the rows
    # it shows and inserts none; reload to see new matches).
    live_ordering: tuple[str, ...] | None

    @property
    def searching(self) -> bool:
        return bool(self.query.q)

    def count(self) -> tuple[int, bool]:
        """(total, capped): a search counts up to SEARCH_COUNT_CAP + 1 runs."""
        if not self.searching:
            return self.queryset.count(), False
        n = self.queryset.order_by()[: SEARCH_COUNT_CAP + 1].count()
        return min(n, SEARCH_COUNT_CAP), n > SEARCH_COUNT_CAP

    def decorate(self, runs: Iterable[Run]) -> list[Run]:
        """Rows as the list shows them: queue holders, and the search's matching passages."""
        rows = with_queue_holders(runs)
        marks = search_highlights([r.id for r in rows], self.query.q) if self.searching else {}
        for run in rows:
            run.search_match = marks.get(run.id, [])  # type: ignore[attr-defined]
        return rows


def runs_list(user: Any, query: RunListQuery) -> RunList:
    sort = check_sort(query.sort)
    q = check_query(query.q)
    qs = matching_runs(user, query.filters)
    if q:
        qs = search_runs(qs, q)
    order = _order(sort)
    live = order if not q and sort in ("-created", "created") else None
    return RunList(
        queryset=qs.order_by(*order).prefetch_related(waiting_tool_calls_prefetch()),
        query=RunListQuery(filters=query.filters, q=q, sort=sort),
        live_ordering=live,
    )


def run_export_rows(user: Any, query: RunListQuery, chunk_size: int = 2000) -> Iterator[Run]:
    """Every run of the list, in its order, streamed from the database (no prefetch)."""
    qs = runs_list(user, query).queryset.prefetch_related(None)
    return qs.iterator(chunk_size=chunk_size)


# --- a run's history ------------------------------------------------------------------------


@dataclass
class RunHistory:
    run: Run
    tool_calls: Iterator[ToolCall]
    checkpoints: Iterator[Checkpoint]
    events: Iterator[RunEvent]


def run_history(user: Any, run_id: UUID, chunk_size: int = 500) -> RunHistory:
    """A run with all of its tool calls, checkpoints and events, each streamed in order."""
    run = matching_runs(user, RunFilters(top_level_only=False)).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    return RunHistory(
        run=run,
        tool_calls=ToolCall.objects.filter(run_id=run.id)
        .order_by("step", "created_at", "id")
        .iterator(chunk_size=chunk_size),
        checkpoints=Checkpoint.objects.filter(run_id=run.id)
        .order_by("step", "created_at", "id")
        .iterator(chunk_size=chunk_size),
        events=RunEvent.objects.filter(run_id=run.id).order_by("seq").iterator(chunk_size),
    )


# --- saved views ----------------------------------------------------------------------------


def saved_views_for(user: Any, *, limit: int = MAX_VIEWS) -> list[SavedView]:
    """The user's own views, then those shared with a group of theirs, by name."""
    own = list(SavedView.objects.filter(owner_id=user.pk).order_by("name", "id")[:limit])
    shared = list(
        SavedView.objects.filter(shared_with_group__in=user.groups.all())
        .exclude(owner_id=user.pk)
        .select_related("owner", "shared_with_group")
        .order_by("name", "id")[: max(0, limit - len(own))]
    )
    return own + shared


def saved_view_get(user: Any, view_id: int) -> SavedView:
    """A view the user owns or that is shared with one of their groups."""
    view = (
        SavedView.objects.filter(id=view_id)
        .filter(Q(owner_id=user.pk) | Q(shared_with_group__in=user.groups.all()))
        .select_related("owner", "shared_with_group")
        .first()
    )
    if view is None:
        raise NotFound(f"Saved view {view_id} not found", code="saved_view_not_found")
    return view
