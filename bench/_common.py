"""Shared helpers for the benchmarks: Django setup, the machine description, percentiles."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
    import django

    django.setup()
    import logging

    logging.disable(logging.INFO)


def postgres_database() -> None:
    """Set Django up on a PostgreSQL database (DATABASE_URL), migrated; refuse anything else."""
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "postgresql":
        raise SystemExit("needs PostgreSQL: DATABASE_URL=postgres://…")
    call_command("migrate", verbosity=0)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    parts = [f"{cpu}, {os.cpu_count()} cores{mem}", f"Python {platform.python_version()}"]
    try:
        import django
        from django.db import connection

        parts.append(f"Django {django.get_version()}")
        if connection.vendor == "postgresql":
            with connection.cursor() as c:
                c.execute("SHOW server_version")
                parts.append(f"PostgreSQL {c.fetchone()[0].split()[0]}")
        else:
            import sqlite3

            parts.append(f"SQLite {sqlite3.sqlite_version}")
    except Exception:  # noqa: S110 - machine info is best effort
        pass
    return "; ".join(parts)


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def summary(values: list[float], unit: str = "ms") -> str:
    if not values:
        return "no samples"
    return (
        f"n={len(values)} p50={pct(values, 50):.2f}{unit} p95={pct(values, 95):.2f}{unit} "
        f"p99={pct(values, 99):.2f}{unit} max={max(values):.2f}{unit}"
    )


def start_worker(concurrency: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "runagents", "--concurrency", str(concurrency)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
