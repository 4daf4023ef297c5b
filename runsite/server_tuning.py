"""Work Daphne's HTTP layer (Twisted) does on every request that nothing reads, skipped.

Applied once when the ASGI application loads (runsite/asgi.py), and only where Daphne is
installed; other ASGI servers are untouched. Measured with py-spy on Daphne serving
`threads.create` + `runs.wait` (docs/benchmarks.md):

- Twisted parses the Content-Type of every POST with the standard library's email package,
  to fill `request.args` for form posts; Daphne never reads `request.args` (it hands the raw
  body to the application). About 5 % of the server's CPU on the API's POSTs. The parse stays,
  memoised per header value (a client sends the same one or two), so its answer is unchanged.
- Twisted's HTTPFactory formats a combined-log-format line for every request and writes it
  to Twisted's log, which Daphne discards below verbosity 2 and otherwise forwards beside its
  own access log (`--access-log`, written by Daphne itself and kept). About 2 %.

And one that is latency, not CPU: a Twisted TCP connection sends nothing when it is written to,
only buffers the bytes and asks the reactor to tell it when the socket is writable, so every
answer waited for the event loop's next turn, behind whatever else that turn ran (the rest of
Django's end of the request, other requests), and cost two more `epoll_ctl` calls. Here a write
to a connection with nothing buffered goes to the socket at once, as asyncio's own transports
(uvicorn's) do; what the socket does not take (a full send buffer), and anything written while
bytes wait, is buffered and sent by Twisted as before, in order. An answer reaches its client
~0.1-0.4 ms sooner (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from typing import Any

CONTENT_TYPES_REMEMBERED = 64


def apply() -> bool:
    """Apply all three; False when Daphne is not installed (nothing to tune)."""
    try:
        from daphne import http_protocol
        from twisted.internet import tcp
        from twisted.web import http
    except ImportError:
        return False
    parse = http._parseContentType
    if not hasattr(parse, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=CONTENT_TYPES_REMEMBERED)(parse)
    http_protocol.HTTPFactory.log = _no_twisted_access_log
    if not getattr(tcp.Connection.write, "sends_at_once", False):
        tcp.Connection.write = _sent_at_once(tcp.Connection.write, sequence=False)  # type: ignore[method-assign]
        tcp.Connection.writeSequence = _sent_at_once(  # type: ignore[method-assign]
            tcp.Connection.writeSequence, sequence=True
        )
    return True


def _sent_at_once(buffered: Any, *, sequence: bool) -> Any:
    """Twisted's `write` (or `writeSequence`, `sequence`) of a TCP connection, sending at once
    what the socket takes when nothing is buffered before it (see the module's docstring). The
    rest, and everything else (TLS started on the connection, a connection closing or lost,
    anything buffered, data that is not bytes, which Twisted refuses), goes through `buffered`,
    Twisted's own."""

    @functools.wraps(buffered)
    def write(self: Any, data: Any) -> None:
        payload = _joined(data) if sequence else data
        if _nothing_before(self) and isinstance(payload, bytes) and payload:
            sent = self.writeSomeData(payload)  # Twisted's own send: 0 when the socket is full
            if isinstance(sent, int) and sent > 0:
                if sent < len(payload):
                    rest = payload[sent:]
                    buffered(self, [rest] if sequence else rest)
                return
        buffered(self, data)

    write.sends_at_once = True  # type: ignore[attr-defined]
    return write


def _nothing_before(connection: Any) -> bool:
    """The connection is open, plain TCP, and holds no bytes waiting to be sent."""
    return bool(
        connection.connected
        and not (connection.TLS or connection.disconnecting or connection._writeDisconnected)
        and not connection._tempDataBuffer
        and len(connection.dataBuffer) == connection.offset
    )


def _joined(iovec: Any) -> bytes | None:
    if isinstance(iovec, list | tuple) and all(isinstance(i, bytes) for i in iovec):
        return b"".join(iovec)
    return None


def _no_twisted_access_log(self: Any, request: Any) -> None:
    """Daphne writes the access log itself (Server.log_action)."""
