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
not take (a full send buffer) stays buffered for the reactor, as before. Sending each of
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
    docstring)."""

    @functools.wraps(handle_reply)
    def reply(self: Any, message: Any) -> None:
        transport = getattr(self.channel, "transport", None)  # (None once the answer ended)
        handle_reply(self, message)
        if transport is not None:
            send_buffered(transport)

    reply.sends_at_once = True  # type: ignore[attr-defined]
    return reply


def send_buffered(transport: Any) -> None:
    """What a plain TCP connection holds to send, sent now as the reactor sends it when the
    socket is writable (`doWrite`: what the socket does not take stays buffered, and a
    producer paused for a full buffer is resumed once it drained). Left to the reactor: TLS, a
    connection closing (its close follows the last send) or lost, and anything but a TCP
    connection."""
    from twisted.internet import tcp

    if (
        isinstance(transport, tcp.Connection)
        and transport.connected
        and not (transport.TLS or transport.disconnecting or transport._writeDisconnected)
        and (transport._tempDataBuffer or len(transport.dataBuffer) > transport.offset)
    ):
        # A lost connection returns its error here and again to the reactor, which still
        # watches the socket (the write asked it to) and ends the connection.
        transport.doWrite()


def _no_twisted_access_log(self: Any, request: Any) -> None:
    """Daphne writes the access log itself (Server.log_action)."""
