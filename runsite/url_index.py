"""Resolving a path without trying each route listed before its own.

Django's resolver tries an included list's routes in order until one matches. The API's routes
(django-ninja's, one flat list of ~50) put `runs.get` 30th and a run's cancel 34th: each route
before it is a regular expression's search, ~5 % of a `runs.get`'s instructions in process
(docs/benchmarks.md).

`RouteIndex` keeps, for each shape of path it meets (the number of segments after an included
list's prefix, and which of them are a literal some route has at that place), a copy of the
resolver tree in which that list holds only the routes that can match such a path, in their
order. A route is left out only when it cannot match: another number of segments, or another
literal where it has one; a route it cannot judge (a regular expression, a converter that may
match a "/", an include) is kept in every copy. So the copy resolves a path to the same route,
arguments and names as the whole tree, by Django's own code; a path it does not resolve is
resolved again by the whole tree, which raises the 404 with every route tried. What differs is
only a match's `tried`: the routes of the copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver
from django.urls.converters import IntConverter, SlugConverter, StringConverter, UUIDConverter
from django.urls.exceptions import Resolver404
from django.urls.resolvers import ResolverMatch, RoutePattern
from ninja.signature.utils import UUIDStrConverter  # a UUID kept as text ("uuidstr")

# Converters whose match never holds a "/": a route of theirs has as many segments as its text.
# Exactly these classes: a subclass may match otherwise.
_WITHIN_A_SEGMENT = frozenset(
    {StringConverter, IntConverter, SlugConverter, UUIDConverter, UUIDStrConverter}
)
_LIMIT = 512  # shapes kept per index; past it, paths of new shapes go to the whole tree
_Shape = tuple[int, tuple[str | None, ...]]


@dataclass(frozen=True)
class _Route:
    index: int
    segments: tuple[str | None, ...] | None  # None: kept for every path (not judged)


def _shape_of(pattern: Any) -> tuple[str | None, ...] | None:
    if not isinstance(pattern, URLPattern) or not isinstance(pattern.pattern, RoutePattern):
        return None
    if not all(type(c) in _WITHIN_A_SEGMENT for c in pattern.pattern.converters.values()):
        return None
    route = str(pattern.pattern)
    return tuple(None if "<" in part else part for part in route.split("/"))


class RouteIndex:
    """Resolves paths under `prefix` (an include of `root`, the project's resolver) through a
    copy of the tree with only the routes their shape can match; any other path through
    `root` itself."""

    def __init__(self, root: URLResolver, prefix: str) -> None:
        self.root = root
        self.prefix = "/" + prefix
        found = [
            (i, p)
            for i, p in enumerate(root.url_patterns)
            if isinstance(p, URLResolver)
            and isinstance(p.pattern, RoutePattern)
            and not p.pattern.converters
            and str(p.pattern) == prefix
        ]
        # The root's own pattern ("^/") must hand the include the path after the first "/".
        below = root.pattern.match(self.prefix)
        if not found or below is None or below[0] != prefix:
            raise ValueError(f"no include at {prefix!r} below {root!r}")
        self._position, self._included = found[0]
        self._routes = [_Route(i, _shape_of(p)) for i, p in enumerate(self._included.url_patterns)]
        # The literals routes of n segments have at each place: any other text there is a
        # value, for whichever route's converter takes it.
        places: dict[tuple[int, int], set[str]] = {}
        for route in self._routes:
            for place, part in enumerate(route.segments or ()):
                if part is not None:
                    places.setdefault((len(route.segments or ()), place), set()).add(part)
        self._literals = {key: frozenset(parts) for key, parts in places.items()}
        self._trees: dict[_Shape, URLResolver] = {}

    def resolve(self, path: str) -> ResolverMatch:
        if not path.startswith(self.prefix):
            return self.root.resolve(path)
        parts = path[len(self.prefix) :].split("/")
        n = len(parts)
        shape: _Shape = (
            n,
            tuple(
                part if part in self._literals.get((n, place), ()) else None
                for place, part in enumerate(parts)
            ),
        )
        tree = self._trees.get(shape)
        if tree is None:
            if len(self._trees) >= _LIMIT:
                return self.root.resolve(path)
            tree = self._trees[shape] = self._tree_for(shape)
        try:
            return tree.resolve(path)
        except Resolver404:  # raised again by the whole tree, with every route tried
            return self.root.resolve(path)

    def _tree_for(self, shape: _Shape) -> URLResolver:
        n, parts = shape
        patterns = self._included.url_patterns
        kept = [
            patterns[route.index]
            for route in self._routes
            if route.segments is None
            or (
                len(route.segments) == n
                and all(
                    mine is None or mine == part
                    for mine, part in zip(route.segments, parts, strict=True)
                )
            )
        ]
        included = self._included
        narrowed = URLResolver(
            included.pattern, kept, included.default_kwargs, included.app_name, included.namespace
        )
        root = self.root
        top = list(root.url_patterns)
        top[self._position] = narrowed
        return URLResolver(root.pattern, top, root.default_kwargs, root.app_name, root.namespace)
