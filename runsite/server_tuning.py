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
answer waited for the event loop's next turn, behind whatever else that turn ran, and cost two
more `epoll_ctl` calls. Here what one ASGI message of an HTTP answer wrote (Daphne's
`handle_reply`: the status line and headers with the first body, a body chunk, the end) is sent
at once, in one send, as Twisted's reactor would send it on its next turn; what the socket does
not take (a full send buffer) stays buffered for the reactor, as before. The reactor is asked to
watch the socket only then (or for an error, or a connection closing): asking it on every write
and telling it to stop once sent were two `epoll_ctl` calls and ~5 % of the event loop's time
per request (docs/benchmarks.md). Sending each of
Twisted's writes on its own instead (headers, then body) cost a cancel's answer 1-2 ms on a busy
machine: the event loop's thread gives up the GIL at every send and may wait for it before the
next (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from typing import Any

CONTENT_TYPES_REMEMBERED = 64


def apply() -> bool:
    """Apply all three; False when Daphne is not installed (nothing to tune)."""
    try:
        from daphne import http_protocol
        from twisted.web import http
    except ImportError:
        return False
    parse = http._parseContentType
    if not hasattr(parse, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=CONTENT_TYPES_REMEMBERED)(parse)
    http_protocol.HTTPFactory.log = _no_twisted_access_log
    reply = http_protocol.WebRequest.handle_reply
    if not getattr(reply, "sends_at_once", False):
        http_protocol.WebRequest.handle_reply = _sent_at_once(reply)
    return True


def _sent_at_once(handle_reply: Any) -> Any:
    """Daphne's `WebRequest.handle_reply`, then what it wrote sent (see the module's
    docstring). On a connection with nothing waiting to be sent, the reactor is not asked to
    watch the socket while the reply writes (Twisted's `startWriting`, an `epoll_ctl`), only to
    be told not to once it is sent (`stopWriting`, another): it is asked when something is left
    for it (a full socket, an error, a connection closing), as Twisted would have asked."""

    @functools.wraps(handle_reply)
    def reply(self: Any, message: Any) -> None:
        transport: Any = getattr(self.channel, "transport", None)  # (None: the answer ended)
        if not _sendable(transport) or _waiting(transport):
            handle_reply(self, message)
            if transport is not None:
                send_buffered(transport)
            return
        transport.startWriting = _later  # (the instance's, over its class's method)
        try:
            handle_reply(self, message)
        finally:
            del transport.startWriting
        if not _sendable(transport) or send_buffered(transport) is not None or _waiting(transport):
            transport.startWriting()  # the reactor does the rest, as it would have

    reply.sends_at_once = True  # type: ignore[attr-defined]
    return reply


def _later() -> None:
    """`startWriting` while a reply writes: `_sent_at_once` sends what it wrote itself."""


def _sendable(transport: Any) -> bool:
    """Whether `send_buffered` sends for this transport (a plain TCP connection, open)."""
    from twisted.internet import tcp

    return bool(
        isinstance(transport, tcp.Connection)
        and transport.connected
        and not (transport.TLS or transport.disconnecting or transport._writeDisconnected)
    )


def _waiting(transport: Any) -> bool:
    """Whether a TCP connection holds bytes it has not sent."""
    return bool(transport._tempDataBuffer or len(transport.dataBuffer) > transport.offset)


def send_buffered(transport: Any) -> Any:
    """What a plain TCP connection holds to send, sent now as the reactor sends it when the
    socket is writable (`doWrite`: what the socket does not take stays buffered, and a
    producer paused for a full buffer is resumed once it drained). Left to the reactor: TLS, a
    connection closing (its close follows the last send) or lost, and anything but a TCP
    connection. Returns what `doWrite` returned (an error for a lost connection), else None."""
    if _sendable(transport) and _waiting(transport):
        # A lost connection returns its error here; the reactor, asked to watch the socket,
        # gets it again and ends the connection.
        return transport.doWrite()
    return None


def _no_twisted_access_log(self: Any, request: Any) -> None:
    """Daphne writes the access log itself (Server.log_action)."""
