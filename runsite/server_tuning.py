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
"""

from __future__ import annotations

import functools
from typing import Any

CONTENT_TYPES_REMEMBERED = 64


def apply() -> bool:
    """Apply both; False when Daphne is not installed (nothing to tune)."""
    try:
        from daphne import http_protocol
        from twisted.web import http
    except ImportError:
        return False
    parse = http._parseContentType
    if not hasattr(parse, "cache_info"):
        http._parseContentType = functools.lru_cache(maxsize=CONTENT_TYPES_REMEMBERED)(parse)
    http_protocol.HTTPFactory.log = _no_twisted_access_log
    return True


def _no_twisted_access_log(self: Any, request: Any) -> None:
    """Daphne writes the access log itself (Server.log_action)."""
