"""A real Runsite for end-to-end tests: a web server on a free port (with its embedded worker,
plus optional `runagents` processes) on this test's database.

The server is Daphne; tests marked `every_server` run once under each supported server
(runsite/servers.py), which all start through the same command line as in production."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from runsite import servers
from tests.helpers import ROOT, subprocess_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveRunsite:
    url: str
    port: int
    proc: subprocess.Popen
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_site(
    tmp_path: Path,
    *,
    name: str = "web",
    server: str = servers.DEFAULT,
    embedded_worker: bool = True,
    **env: str,
) -> LiveRunsite:
    port = free_port()
    log = tmp_path / f"{name}-{port}.log"
    full_env = subprocess_env(
        RUNS_EMBEDDED_WORKER="1" if embedded_worker else "0",
        WHITENOISE_USE_FINDERS="1",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        RUNS_API_AUTH=env.pop("RUNS_API_AUTH", "off"),
        **env,
    )
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            servers.command(server, host="127.0.0.1", port=port),
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    site = LiveRunsite(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log=log, env=full_env)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{server} exited early:\n{site.output()}")
        try:
            if httpx.get(f"{site.url}/healthz", timeout=1).status_code == 200:
                return site
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    site.stop()
    raise TimeoutError(f"{server} did not answer:\n{site.output()}")


@pytest.fixture
def server() -> str:
    """The ASGI server the e2e tests start: Daphne, or each one for tests marked every_server."""
    return servers.DEFAULT


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests of what depends on the server (the SDK's calls, disconnects, websockets, shutdown)
    # run once per supported server; the rest run under the default.
    if metafunc.definition.get_closest_marker("every_server") and "server" in metafunc.fixturenames:
        metafunc.parametrize("server", servers.SERVERS)


@pytest.fixture
def live_runsite(transactional_db, tmp_path: Path, server: str) -> Iterator[LiveRunsite]:
    """One web process with the embedded worker, API auth off."""
    site = start_site(tmp_path, server=server)
    yield site
    site.stop()


@pytest.fixture
def site_factory(
    transactional_db, tmp_path: Path, server: str
) -> Iterator[Callable[..., LiveRunsite]]:
    """Start web processes with custom settings (auth on, no embedded worker, …)."""
    sites: list[LiveRunsite] = []

    def start(**kwargs: object) -> LiveRunsite:
        kwargs.setdefault("server", server)
        site = start_site(tmp_path, name=f"web{len(sites)}", **kwargs)  # type: ignore[arg-type]
        sites.append(site)
        return site

    yield start
    for site in sites:
        site.stop()
