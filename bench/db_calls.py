"""What the engine's most frequent database calls cost, per call: the client's CPU, PostgreSQL's
CPU (its backend process, read from /proc) and the wall time. Prints figures and the machine;
never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench python bench/db_calls.py [--n 1000]

Calls: a claim that finds nothing (every worker makes one on each wake-up NOTIFY and after each
run's end), the pool's check before it lends a connection (every API request and every worker
database call), and a bare `SELECT 1` for scale. Run it on two commits to compare.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    args = parser.parse_args()
    postgres_database()
    from django.conf import settings
    from django.db import connection

    from runs import services
    from runs.models import Run, RunStatus

    print("machine:", machine())
    pending = Run.objects.filter(status=RunStatus.PENDING).count()
    print(f"runs in the database: {Run.objects.count()} ({pending} pending)")
    connection.ensure_connection()
    raw = connection.connection
    backend = raw.info.backend_pid
    check = settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("check")

    def measure(name: str, call: Callable[[], object]) -> None:
        call()
        pg, cpu, wall = process_cpu(backend), time.process_time(), time.perf_counter()
        for _ in range(args.n):
            call()
        n = args.n
        print(
            f"{name:34} wall {(time.perf_counter() - wall) / n * 1000:6.3f} ms"
            f"  client CPU {(time.process_time() - cpu) / n * 1000:6.3f} ms"
            f"  PostgreSQL CPU {(process_cpu(backend) - pg) / n * 1000:6.3f} ms"
        )

    measure("claim, nothing claimable", lambda: services.run_claim(owner="bench", limit=5))
    if check is not None:
        measure("pool check of an idle connection", lambda: check(raw))
    cursor = connection.cursor()
    measure("SELECT 1", lambda: cursor.execute("SELECT 1"))


if __name__ == "__main__":
    main()
