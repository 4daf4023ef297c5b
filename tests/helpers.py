"""Helpers for tests that start real processes or wait for asynchronous outcomes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


# --- real processes -------------------------------------------------------------------------


def database_url_for_subprocess() -> str:
    """A DATABASE_URL that points a child process at the database this test is using."""
    s = connection.settings_dict
    if connection.vendor == "postgresql":
        user = s.get("USER") or ""
        password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
        auth = f"{user}{password}@" if user else ""
        return (
            f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"
        )
    return f"sqlite:///{s['NAME']}"


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "PYTHONUNBUFFERED": "1",
        "DJANGO_SETTINGS_MODULE": "runsite.settings",
        # Tests read their stateless runs after they end: the servers and workers they start
        # keep temporary threads for the test's lifetime (tests/test_api_thread_hold.py covers
        # the deletion itself, through the reaper).
        "RUNS_STATELESS_KEEP_SECONDS": "3600",
    }
    env.pop("DATABASE_TEST_NAME", None)
    env.update(extra)
    return env


def probe(script: str) -> Any:
    """Run `script` in a Python process of its own on this test's database; return the JSON
    document its last line prints."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


class WorkerProcess:
    def __init__(self, *, concurrency: int = 4, log: Path, **env: str):
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runagents", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=subprocess_env(**env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_started(self, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.output()}")
            if b"running with concurrency" in self.log_path.read_bytes():
                return
            time.sleep(0.05)
        raise TimeoutError(f"worker did not start:\n{self.output()}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


class WsRecorder:
    """A websocket client on a background thread that records every frame with its wall time."""

    def __init__(self, url: str, *, cookie: str | None = None, origin: str | None = None):
        import asyncio
        import threading

        self.url = url
        self.frames: list[tuple[float, str]] = []
        self.closed_code: int | None = None
        self.error: BaseException | None = None
        self.connected = threading.Event()
        self._stop = threading.Event()
        headers = {}
        if cookie:
            headers["Cookie"] = f"sessionid={cookie}"
        if origin:
            headers["Origin"] = origin
        self._headers = headers
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()

    async def _main(self) -> None:
        import asyncio

        import websockets

        while not self._stop.is_set():
            try:
                async with websockets.connect(
                    self.url, additional_headers=self._headers, open_timeout=10
                ) as ws:
                    self.connected.set()
                    while not self._stop.is_set():
                        try:
                            frame = await asyncio.wait_for(ws.recv(), timeout=0.2)
                        except TimeoutError:
                            continue
                        self.frames.append(
                            (time.time(), frame if isinstance(frame, str) else frame.decode())
                        )
            except Exception as exc:
                self.error = exc
                if getattr(exc, "response", None) is not None:
                    self.closed_code = exc.response.status_code
                    return  # refused at the handshake: do not retry
                await asyncio.sleep(0.2)

    def text(self) -> str:
        return "\n".join(f for _, f in self.frames)

    def first(self, needle: str) -> float | None:
        for t, f in self.frames:
            if needle in f:
                return t
        return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def session_cookie_for(user: Any) -> str:
    """A logged-in session for `user`, as the browser's sessionid cookie."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return session.session_key


async def asgi_request(
    method: str,
    path: str,
    key: str,
    *,
    query: bytes = b"",
    body: Any = None,
    on_send: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """One request through the ASGI application as a server calls it (`body`: sent as JSON
    when given), each message it sends handed to `on_send` as it is sent; returns the
    answer's status."""
    import asyncio
    import json

    from runsite.asgi import application

    headers = [(b"host", b"127.0.0.1"), (b"x-api-key", key.encode())]
    if body is not None:
        headers.append((b"content-type", b"application/json"))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    content = json.dumps(body).encode() if body is not None else b""
    bodies = [{"type": "http.request", "body": content, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()  # the client stays until the answer
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if on_send is not None:
            on_send(message)
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await application(scope, receive, send)
    return status[0]
