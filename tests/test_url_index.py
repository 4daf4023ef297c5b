"""A path resolved through the API's route index (runsite/url_index.py) as Django's resolver
resolves it: the same view, arguments, names and route, or the same 404."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.http import HttpResponse
from django.urls import URLResolver, get_resolver, include, path, re_path
from django.urls.exceptions import Resolver404

from runsite.url_index import RouteIndex


def _same(index: Any, root: URLResolver, url: str) -> str:
    """What both resolve `url` to (a description), after checking they agree."""
    try:
        expected = root.resolve(url)
    except Resolver404:
        with pytest.raises(Resolver404):
            index.resolve(url)
        return "404"
    found = index.resolve(url)
    for field in (
        "func",
        "args",
        "kwargs",
        "url_name",
        "app_names",
        "namespaces",
        "route",
        "captured_kwargs",
        "extra_kwargs",
    ):
        assert getattr(found, field) == getattr(expected, field), (url, field)
    return expected.route


def _samples(route: str, literals: set[str]) -> list[str]:
    """Paths for a route: each value place filled with a sample, then in turn with every
    literal the API has anywhere (a value that reads as another route's literal)."""
    parts = route.split("/")
    values = ["x-1", str(uuid.uuid4())]
    found = ["/".join(values[0] if "<" in p else p for p in parts)]
    for place, part in enumerate(parts):
        if "<" not in part:
            continue
        for value in [*values, *sorted(literals)]:
            filled = [values[1] if "<" in p else p for p in parts]
            filled[place] = value
            found.append("/".join(filled))
    return found


def test_every_api_route_resolves_as_djangos_resolver_resolves_it() -> None:
    root = get_resolver()
    index = RouteIndex(root, "api/")
    api = next(p for p in root.url_patterns if str(p.pattern) == "api/")
    routes = [str(p.pattern) for p in api.url_patterns]
    literals = {part for r in routes for part in r.split("/") if part and "<" not in part}
    resolved: set[str] = set()
    for route in routes:
        for url in _samples(route, literals):
            for variant in (url, url + "/", url + "/extra", url.rsplit("/", 1)[0]):
                resolved.add(_same(index, root, "/api/" + variant))
    # Every route is reached (none shadowed by the index), and some paths are 404s.
    assert {"api/" + r for r in routes} <= resolved
    assert "404" in resolved
    # A literal that another route reads as a value goes to the route listed first.
    assert (
        index.resolve("/api/threads/search").url_name
        == root.resolve("/api/threads/search").url_name
    )
    # A run's read tries the routes of its shape only, not the thirty listed before it.
    run = f"/api/threads/{uuid.uuid4()}/runs/{uuid.uuid4()}"
    assert len(root.resolve(run).tried) > 20
    assert len(index.resolve(run).tried) <= 3
    for url in ("/api/", "/api", "/healthz", "/admin/", "/", "/runs/", "/api//", "/nothing"):
        _same(index, root, url)


def test_a_route_it_cannot_judge_is_kept_for_every_path() -> None:
    def view(request: Any, **kwargs: Any) -> HttpResponse:
        return HttpResponse()

    api = [
        path("files/<path:rest>", view, name="files"),  # may hold a "/"
        re_path(r"^raw/(?P<n>[0-9]+)/x$", view, name="raw"),  # a regular expression
        path("nested/", include([path("<int:n>", view, name="nested")])),  # an include
        path("items/<int:n>", view, name="item"),
        path("items/all", view, name="all"),
        path("<slug:kind>/<int:n>", view, name="kind"),
    ]
    root = URLResolver(get_resolver().pattern, [path("api/", include((api, "t"), namespace="t"))])
    index = RouteIndex(root, "api/")
    for url in (
        "/api/files/a/b/c",
        "/api/files/a",
        "/api/raw/12/x",
        "/api/nested/4",
        "/api/items/4",
        "/api/items/all",
        "/api/items/x",
        "/api/files/7",
        "/api/other/7",
        "/api/raw/12",
    ):
        _same(index, root, url)
    assert index.resolve("/api/files/a/b/c").kwargs == {"rest": "a/b/c"}
    assert index.resolve("/api/items/4").url_name == "item"
    assert index.resolve("/api/files/7").url_name == "files"  # listed before the slug's
    assert index.resolve("/api/other/7").url_name == "kind"
    assert index.resolve("/api/raw/12/x").kwargs == {"n": "12"}
    assert index.resolve("/api/nested/4").url_name == "nested"


def test_it_refuses_a_resolver_without_the_include() -> None:
    root = URLResolver(get_resolver().pattern, [path("healthz", lambda r: HttpResponse())])
    with pytest.raises(ValueError, match="no include"):
        RouteIndex(root, "api/")
