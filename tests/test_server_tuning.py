"""runsite/server_tuning.py: Daphne's per-request work that nothing reads, skipped; what Daphne
and Twisted answer is unchanged."""

from __future__ import annotations

import io
from types import SimpleNamespace

from daphne.http_protocol import HTTPFactory
from twisted.web import http

import runsite.asgi  # noqa: F401  (applies the tuning, as Daphne's import of it does)
from runsite import server_tuning


def test_the_content_type_parse_is_memoised_with_the_same_answers() -> None:
    assert server_tuning.apply() is True  # applying twice wraps once
    parse = http._parseContentType
    original = parse.__wrapped__
    assert not hasattr(original, "cache_info")
    values = [
        b"application/json",
        b"application/json; charset=utf-8",
        b"Application/X-WWW-Form-Urlencoded",
        b"multipart/form-data; boundary=abc",
        b"not a type",
    ]
    for value in values:
        assert parse(value) == original(value)
    hits = parse.cache_info().hits
    parse(b"application/json")
    assert parse.cache_info().hits == hits + 1


def test_daphnes_factory_writes_no_twisted_access_line() -> None:
    request = SimpleNamespace(
        method=b"POST",
        uri=b"/api/threads",
        clientproto=b"HTTP/1.1",
        code=200,
        sentLength=2,
        getClientAddress=lambda: SimpleNamespace(host="127.0.0.1"),
        getHeader=lambda name: None,
    )
    twisted_factory = http.HTTPFactory()
    twisted_factory._logFile = io.StringIO()
    twisted_factory._logDateTime = "-"
    twisted_factory.log(request)  # Twisted's own factory writes one (what the test would see)
    assert "POST /api/threads" in twisted_factory._logFile.getvalue()

    daphne_factory = HTTPFactory(server=SimpleNamespace())
    daphne_factory._logFile = io.StringIO()
    daphne_factory._logDateTime = "-"
    daphne_factory.log(request)
    assert daphne_factory._logFile.getvalue() == ""
