"""Pieces of the runs list page shared by its views: the paginator and the sort links."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Page, Paginator
from django.http import HttpRequest
from django.utils.functional import cached_property

from runs.list_query import SORT_LABELS
from runs.selectors.search import RunList


class ListPaginator(Paginator):
    """Offset pages over a runs list; a search's total is capped (`capped`: "1000+")."""

    def __init__(self, listing: RunList, per_page: int) -> None:
        super().__init__(listing.queryset, per_page)
        self.listing = listing

    @cached_property
    def _counted(self) -> tuple[int, bool]:
        return self.listing.count()

    @cached_property
    def count(self) -> int:
        return self._counted[0]

    @property
    def capped(self) -> bool:
        return self._counted[1]

    def page(self, number: Any) -> Page:
        # A capped count must not cut the page short: slice a full page whatever the count.
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)


def sort_links(request: HttpRequest, current: str) -> dict[str, dict[str, Any]]:
    """Per sortable column: the query string that sorts by it (descending first, then the
    other way when it is the current sort) and the arrow to show."""
    query = request.GET.copy()
    query.pop("page", None)
    links: dict[str, dict[str, Any]] = {}
    for key, label in SORT_LABELS.items():
        desc, asc = f"-{key}", key
        query["sort"] = asc if current == desc else desc
        arrow = "↓" if current == desc else "↑" if current == asc else ""
        links[key] = {"query": query.urlencode(), "arrow": arrow, "label": label}
    return links
