"""A real Runsite for end-to-end tests: Daphne on a free port (with its embedded worker, plus
optional `runagents` processes) on this test's database."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

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


def start_daphne(
    tmp_path: Path, *, name: str = "web", embedded_worker: bool = True, **env: str
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
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "runsite.asgi:application",
            ],
            cwd=ROOT,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    site = LiveRunsite(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log=log, env=full_env)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"daphne exited early:\n{site.output()}")
        try:
            if httpx.get(f"{site.url}/healthz", timeout=1).status_code == 200:
                return site
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    site.stop()
    raise TimeoutError(f"daphne did not answer:\n{site.output()}")


@pytest.fixture
def live_runsite(transactional_db, tmp_path: Path) -> Iterator[LiveRunsite]:
    """One Daphne process with the embedded worker, API auth off."""
    site = start_daphne(tmp_path)
    yield site
    site.stop()


@pytest.fixture
def daphne_factory(transactional_db, tmp_path: Path) -> Iterator[Callable[..., LiveRunsite]]:
    """Start Daphne processes with custom settings (auth on, no embedded worker, …)."""
    sites: list[LiveRunsite] = []

    def start(**kwargs: object) -> LiveRunsite:
        site = start_daphne(tmp_path, name=f"web{len(sites)}", **kwargs)  # type: ignore[arg-type]
        sites.append(site)
        return site

    yield start
    for site in sites:
        site.stop()
