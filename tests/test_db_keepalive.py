"""A database peer that vanishes without a word is found on both ends (runsite/settings.py,
DATABASE_KEEPALIVE_SECONDS), on every connection Runsite opens: Django's and the worker's LISTEN
connection, which connects as Django does (runs/engine/worker.py, listen_conninfo)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import pytest
from django.db import connection

from tests.helpers import ROOT, database_url_for_subprocess, subprocess_env, wait_for

pytestmark = [pytest.mark.postgres]

_SHOW = (
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
    "idle_in_transaction_session_timeout",
    "statement_timeout",
)


def _settings_in(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    """What a process started with this DATABASE_URL (and env) finds its session set to."""
    script = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        f"    for name in {_SHOW!r}:\n"
        "        c.execute('SHOW ' + name); print(name, c.fetchone()[0])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=subprocess_env(DATABASE_URL=url, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _shown(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert result.returncode == 0, result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


@pytest.mark.django_db
def test_django_s_connections_probe_a_silent_peer_on_both_ends() -> None:
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None
    # The client's end: its kernel probes an idle connection after 30 s and gives up after
    # three unanswered probes 10 s apart, or on data unacknowledged for 60 s.
    sock = socket.socket(fileno=raw.fileno())
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000
    finally:
        sock.detach()  # the descriptor stays the connection's
    # The server's end (PostgreSQL reads these back from its socket).
    with connection.cursor() as cursor:
        shown = {}
        for name in _SHOW[:4]:
            cursor.execute(f"SHOW {name}")
            shown[name] = cursor.fetchone()[0]
    assert shown == {
        "tcp_keepalives_idle": "30",
        "tcp_keepalives_interval": "10",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "60000",
    }


@pytest.mark.django_db
def test_session_options_in_the_url_are_kept_beside_runsite_s_own() -> None:
    url = database_url_for_subprocess() + "?options=-c%20statement_timeout%3D1234"
    shown = _shown(_settings_in(url, DATABASE_KEEPALIVE_SECONDS="12"))
    assert shown["statement_timeout"] == "1234ms"
    assert shown["idle_in_transaction_session_timeout"] == "10s"
    assert shown["tcp_keepalives_idle"] == "12"
    assert shown["tcp_keepalives_interval"] == "4"
    assert shown["tcp_user_timeout"] == "24000"


@pytest.mark.django_db
def test_keepalives_can_be_left_to_the_os_and_a_bad_value_is_refused() -> None:
    shown = _shown(_settings_in(database_url_for_subprocess(), DATABASE_KEEPALIVE_SECONDS="0"))
    with open("/proc/sys/net/ipv4/tcp_keepalive_time") as os_default:  # two hours, usually
        assert shown["tcp_keepalives_idle"] == os_default.read().strip()
    assert shown["tcp_user_timeout"] == "0"
    refused = _settings_in(database_url_for_subprocess(), DATABASE_KEEPALIVE_SECONDS="-5")
    assert refused.returncode != 0
    assert "DATABASE_KEEPALIVE_SECONDS='-5' must be at least 0" in refused.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_s_listen_connection_connects_as_django_does(start_worker) -> None:
    """The worker's own LISTEN connection takes the URL's parameters and Runsite's session
    settings: here the application name the URL gives shows on the session that holds the
    first responder's lock."""
    from runs.engine.worker import RESPONDER_LOCK

    name = f"runsite-listen-{uuid.uuid4().hex[:8]}"
    start_worker(
        concurrency=1, DATABASE_URL=f"{database_url_for_subprocess()}?application_name={name}"
    )

    def responder_name() -> str | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
                " AND ((l.classid::bigint << 32) | l.objid::bigint) = %s"
                # (another Runsite on the same server holds its own database's lock)
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                [RESPONDER_LOCK],
            )
            row = cursor.fetchone()
            return row[0] if row else None

    wait_for(lambda: responder_name() is not None)
    assert responder_name() == name
