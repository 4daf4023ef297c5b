"""runsite/server_tuning.py: Daphne's per-request work that nothing reads, skipped; what Daphne
and Twisted answer is unchanged."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
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


class _Reactor:
    """What a Twisted connection asks of its reactor when it writes: to be told when its socket
    is writable (addWriter), and no longer (removeWriter)."""

    def __init__(self) -> None:
        self.writers: set[object] = set()

    def addWriter(self, selectable: object) -> None:  # noqa: N802  (Twisted's interface)
        self.writers.add(selectable)

    def removeWriter(self, selectable: object) -> None:  # noqa: N802
        self.writers.discard(selectable)


_OPEN: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _connection() -> tuple[object, socket.socket, _Reactor]:
    """A real Twisted TCP connection over one end of a socket pair (the other end returned),
    both closed after the test."""
    from twisted.internet import tcp
    from twisted.internet.protocol import Protocol

    ours, theirs = socket.socketpair()
    _OPEN.extend((ours, theirs))
    reactor = _Reactor()
    connection = tcp.Connection(ours, Protocol(), reactor)
    connection.connected = True
    return connection, theirs, reactor


def _read_all(sock: socket.socket, n: int) -> bytes:
    sock.settimeout(5)
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got


def test_what_an_answer_wrote_is_sent_in_one_send_without_a_reactor_turn() -> None:
    connection, peer, reactor = _connection()
    connection.write(b"HTTP/1.1 200 OK\r\n")  # Twisted's writes: buffered, the reactor asked
    connection.writeSequence([b"content-length: 2\r\n", b"\r\n", b"{}"])
    assert reactor.writers == {connection}
    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(10)  # nothing sent yet: it would wait for the reactor's next turn
    server_tuning.send_buffered(connection)
    assert _read_all(peer, 40) == b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    assert not reactor.writers and connection.dataBuffer == b"" and not connection._tempDataBuffer


def test_what_the_socket_does_not_take_is_left_to_the_reactor_in_order() -> None:
    """An answer bigger than the socket's buffer: sent in part at once, the rest by the
    reactor, with whatever is written meanwhile after it."""
    connection, peer, reactor = _connection()
    connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = bytes(range(256)) * 4096  # 1 MiB: more than the socket takes at once
    connection.write(big)
    server_tuning.send_buffered(connection)
    assert reactor.writers == {connection}  # the rest still buffered, the reactor still asked
    connection.writeSequence([b"after", b"wards"])
    server_tuning.send_buffered(connection)
    connection.write(b"!")
    expected = big + b"afterwards!"
    got = b""
    peer.settimeout(5)
    while len(got) < len(expected):
        if connection in reactor.writers:
            connection.doWrite()  # what the reactor does when the socket is writable
        got += peer.recv(65536)
    assert got == expected
    assert not reactor.writers


def test_tls_a_closing_connection_and_other_transports_are_left_to_the_reactor() -> None:
    for change in ("TLS", "disconnecting"):
        connection, peer, reactor = _connection()
        setattr(connection, change, True)
        connection.dataBuffer = b"waiting"
        server_tuning.send_buffered(connection)
        assert connection.dataBuffer == b"waiting"  # untouched: the reactor sends it
    server_tuning.send_buffered(SimpleNamespace(connected=True))  # not a TCP connection


def test_daphnes_reply_is_sent_once_it_has_written() -> None:
    from daphne.http_protocol import WebRequest

    assert WebRequest.handle_reply.sends_at_once  # applied once (runsite.asgi imported)
    assert server_tuning.apply() is True
    assert WebRequest.handle_reply.__wrapped__.__name__ == "handle_reply"
    assert not hasattr(WebRequest.handle_reply.__wrapped__, "sends_at_once")
    connection, peer, _ = _connection()

    def handle_reply(request: object, message: dict) -> None:
        connection.write(message["body"])

    reply = server_tuning._sent_at_once(handle_reply)
    reply(SimpleNamespace(channel=SimpleNamespace(transport=connection)), {"body": b"{}"})
    assert _read_all(peer, 2) == b"{}"
    # An answer that ended (Twisted dropped its channel): nothing to send, nothing raised.
    reply(SimpleNamespace(channel=None), {"body": b""})
