"""What a runs-list query string may hold, checked the same way by the list page, exports and
saved views (a leaf module: selectors and services both use it)."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from runs.exceptions import ValidationFailed

DEFAULT_SORT = "-created"
# sort value → what it orders by. "x" is ascending, "-x" descending (newest, latest activity,
# longest, most attempts first); ties end on the id so pages never overlap.
SORT_LABELS = {
    "created": "created",
    "activity": "last activity",
    "duration": "duration",
    "attempts": "attempts",
}
SORTS = tuple(f"{sign}{key}" for key in SORT_LABELS for sign in ("-", ""))
MAX_QUERY_CHARS = 500
# The query-string keys a runs list (and so a saved view or an export) understands.
LIST_QUERY_KEYS = (
    "q",
    "sort",
    "status",
    "agent",
    "thread",
    "resource",
    "created_from",
    "created_to",
    "stuck",
    "pending_longer",
    "subagents",
)


def check_sort(sort: str | None) -> str:
    if not sort:
        return DEFAULT_SORT
    if sort not in SORTS:
        raise ValidationFailed(
            f"unknown sort {sort!r}; use one of {', '.join(SORTS)}",
            errors=[{"field": "sort", "message": f"must be one of {', '.join(SORTS)}"}],
            code="invalid_sort",
        )
    return sort


def check_query(q: str | None) -> str:
    q = (q or "").strip()
    if len(q) > MAX_QUERY_CHARS:
        raise ValidationFailed(
            f"q is longer than {MAX_QUERY_CHARS} characters",
            errors=[{"field": "q", "message": f"at most {MAX_QUERY_CHARS} characters"}],
            code="invalid_query",
        )
    return q


# The navigation lists this many views, each with one COUNT: a page costs at most this many.
NAV_VIEWS = 10
# The views page lists every view a user has (own and shared), up to this many.
MAX_VIEWS = 50


def normalise_list_query(query: str) -> str:
    """A runs-list query string as a saved view keeps it: known keys only (unknown ones are
    refused), empty values and the page dropped, keys and repeated values in a fixed order."""
    pairs = parse_qsl(query.lstrip("?"), keep_blank_values=False)
    unknown = sorted({k for k, _ in pairs if k not in LIST_QUERY_KEYS and k != "page"})
    if unknown:
        raise ValidationFailed(
            f"unknown runs-list parameter {', '.join(map(repr, unknown))}",
            errors=[{"field": "query", "message": f"unknown parameter {', '.join(unknown)}"}],
        )
    kept = sorted(
        (k, v.strip()) for k, v in pairs if k in LIST_QUERY_KEYS and v.strip() and k != "page"
    )
    for key, value in kept:
        if key == "sort":
            check_sort(value)
        if key == "q":
            check_query(value)
    return urlencode(list(dict.fromkeys(kept)))
