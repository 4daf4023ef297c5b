"""The ASGI servers Runsite supports, and the one command line that starts each.

Daphne (Channels' own) is the default everywhere: `make run`, the Dockerfile, the compose
file. uvicorn (with uvloop and httptools) is supported as documented configuration
(docs/deploy.md, figures in docs/benchmarks.md). The test suite and the benchmarks start the
web process through `command`, so both servers are exercised the same way.
"""

from __future__ import annotations

import sys

APPLICATION = "runsite.asgi:application"
DEFAULT = "daphne"
SERVERS = ("daphne", "uvicorn")
GRACE_SECONDS = 3


def command(server: str, *, host: str, port: int, proxy_headers: bool = False) -> list[str]:
    """The argv that serves Runsite with `server` on host:port (this interpreter's packages)."""
    if server == "daphne":
        options = ["-b", host, "-p", str(port)] + (["--proxy-headers"] if proxy_headers else [])
    elif server == "uvicorn":
        # uvloop and httptools are picked by uvicorn itself when installed (requirements.txt
        # installs both). Both servers write their access log to stdout, as by default. On
        # SIGTERM uvicorn waits for every open response, and a stream of a long run would hold
        # it for the run's whole length: open streams get GRACE_SECONDS (Daphne closes them at
        # once).
        options = ["--host", host, "--port", str(port)]
        options += ["--timeout-graceful-shutdown", str(GRACE_SECONDS)]
        options.append("--proxy-headers" if proxy_headers else "--no-proxy-headers")
    else:
        raise ValueError(f"server: {server!r} is not one of {', '.join(SERVERS)}")
    return [sys.executable, "-m", server, *options, APPLICATION]
