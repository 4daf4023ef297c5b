"""CPU per echo run, the engine's own work without its threads: queued echo runs executed one after
another in this process (`drain`, the worker's claim and execution, publishing as a worker's run
thread does), with the CPU this process spent (Python, Django, psycopg) and the CPU PostgreSQL's
backends spent (read from /proc: the database must run on this machine), per run, and the wall
time. To compare two commits, run it on each in turn, and back. Prints figures and the machine;
never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench python bench/run_cpu.py [--runs 3000] [--rounds 3]

The database's runs are deleted first: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import pwd
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
WARM_RUNS = 100  # each connection's statements prepared and planned before the count starts


def _backends_cpu() -> float:
    """CPU seconds of every PostgreSQL backend process on this machine (a backend that exits
    during the round takes its share with it: this process's pooled connections stay open)."""
    total, uid = 0, pwd.getpwnam("postgres").pw_uid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def one_round(n: int) -> tuple[float, float, float]:
    """(this process's CPU, PostgreSQL's CPU, wall), ms per echo run."""
    from engine import queue_echo_runs, reset

    from runs import live
    from runs.engine.worker import drain

    reset()
    queue_echo_runs(n + WARM_RUNS)
    # As a worker's run thread: it publishes what it committed itself.
    with live.sending_thread():
        drain(max_runs=WARM_RUNS)
        cpu, db, wall = time.process_time(), _backends_cpu(), time.monotonic()
        done = drain(max_runs=n, timeout=600)
        cpu, db, wall = time.process_time() - cpu, _backends_cpu() - db, time.monotonic() - wall
    if done != n:
        sys.exit(f"only {done} of {n} runs executed")
    return cpu / n * 1000, db / n * 1000, wall / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    postgres_database()
    print(f"machine: {machine()}")
    print(f"{args.runs} echo runs a round, one at a time in this process; ms per run:")
    rounds = [one_round(args.runs) for _ in range(args.rounds)]
    for i, (cpu, db, wall) in enumerate(rounds, start=1):
        print(f"  round {i}: this process {cpu:.3f}, PostgreSQL {db:.3f}, wall {wall:.3f}")
    medians = [statistics.median(r[k] for r in rounds) for k in range(3)]
    print(
        f"  median: this process {medians[0]:.3f}, PostgreSQL {medians[1]:.3f},"
        f" wall {medians[2]:.3f}"
    )


if __name__ == "__main__":
    main()
