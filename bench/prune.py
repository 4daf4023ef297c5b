"""Retention under load on PostgreSQL: prune N old ended runs while workers claim and finish a
steady stream of new ones, and print the claim rate before, during and after the prune.

    DATABASE_URL=postgres://…/scratch python bench/prune.py [--runs 1000000] [--workers 2]

Seeding is one INSERT … SELECT generate_series per table (ten runs per thread, each run with
three timeline events and two checkpoints). The database is migrated and emptied first: point
it at a scratch database. Prints figures and the machine; never asserts a time.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, setup_django, start_worker  # noqa: E402

setup_django()

from django.core.management import call_command  # noqa: E402
from django.db import close_old_connections, connection  # noqa: E402
from django.utils import timezone  # noqa: E402
from engine import queue_echo_runs, reset  # noqa: E402

from runs.models import Run, RunStatus  # noqa: E402

RUNS_PER_THREAD = 10

SEED_SQL = [
    # Threads and runs get deterministic ids (md5 of a counter) so runs can name their thread.
    """
    INSERT INTO runs_thread (id, metadata, status, created_at, updated_at, delete_when_done)
    SELECT md5('t' || i)::uuid, '{}', 'idle', now() - interval '60 days',
           now() - interval '60 days', false
      FROM generate_series(0, %(threads)s - 1) AS i
    """,
    """
    INSERT INTO runs_run (id, thread_id, agent_id, status, input, output, metadata, kwargs,
                          multitask_strategy, attempt, cancel_reason, last_seq, created_at,
                          started_at, finished_at, updated_at)
    SELECT md5('r' || i)::uuid, md5('t' || (i / %(per)s))::uuid, 'echo',
           (ARRAY['success', 'success', 'success', 'error', 'interrupted'])[1 + i %% 5],
           jsonb_build_object('i', i), jsonb_build_object('echo', i), '{}', '{}', 'enqueue',
           1, '', 3, now() - interval '60 days', now() - interval '60 days',
           now() - interval '60 days' + (i %% 1000) * interval '1 second',
           now() - interval '60 days'
      FROM generate_series(0, %(runs)s - 1) AS i
    """,
    """
    INSERT INTO runs_runevent (run_id, seq, kind, data, actor, created_at)
    SELECT md5('r' || i)::uuid, s, (ARRAY['created', 'started', 'finished'])[s], '{}', '',
           now() - interval '60 days'
      FROM generate_series(0, %(runs)s - 1) AS i, generate_series(1, 3) AS s
    """,
    """
    INSERT INTO runs_checkpoint (id, thread_id, run_id, step, values, pending, created_at)
    SELECT md5('c' || i || '.' || s)::uuid, md5('t' || (i / %(per)s))::uuid,
           md5('r' || i)::uuid, s, jsonb_build_object('i', i, 'step', s), '[]',
           now() - interval '60 days' + i * interval '1 millisecond'
      FROM generate_series(0, %(runs)s - 1) AS i, generate_series(0, 1) AS s
    """,
]


def seed(runs: int) -> float:
    t0 = time.monotonic()
    params = {"runs": runs, "threads": -(-runs // RUNS_PER_THREAD), "per": RUNS_PER_THREAD}
    with connection.cursor() as c:
        for sql in SEED_SQL:
            c.execute(sql, params)
        c.execute("ANALYZE runs_run; ANALYZE runs_thread; ANALYZE runs_runevent")
    return time.monotonic() - t0


class Feeder(threading.Thread):
    """Keeps the queue topped up with echo runs on fresh threads (the workers never idle)."""

    def __init__(self, backlog: int) -> None:
        super().__init__(daemon=True)
        self.backlog = backlog
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                queued = Run.objects.filter(status=RunStatus.PENDING).count()
                if queued < self.backlog:
                    queue_echo_runs(self.backlog - queued)
                self.stop.wait(0.2)
        finally:
            close_old_connections()


def claims_between(t0: float, t1: float) -> tuple[int, float]:
    """Runs claimed (first `started` event) in [t0, t1) of epoch time, and the longest gap
    between two consecutive claims in that window (seconds)."""
    with connection.cursor() as c:
        c.execute(
            """
            SELECT count(*), coalesce(max(gap), 0) FROM (
              SELECT extract(epoch FROM created_at - lag(created_at) OVER (ORDER BY created_at))
                     AS gap
                FROM runs_runevent
               WHERE kind = 'started' AND created_at >= to_timestamp(%s)
                 AND created_at < to_timestamp(%s)) g
            """,
            [t0, t1],
        )
        n, gap = c.fetchone()
    return int(n), float(gap)


def report(name: str, t0: float, t1: float) -> None:
    n, gap = claims_between(t0, t1)
    seconds = t1 - t0
    print(
        f"  {name:<7} {seconds:6.1f}s  {n:7d} claims  {n / seconds:7.1f} claims/s  "
        f"longest gap between claims {gap * 1000:7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0, help="seconds before and after")
    parser.add_argument("--batch-size", type=int, default=500)
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/prune.py needs DATABASE_URL=postgres://… (a scratch database)")
    call_command("migrate", verbosity=0)
    print(f"machine: {machine()}")
    reset()
    took = seed(args.runs)
    print(
        f"seeded {args.runs:,} ended runs (60 days old) on {-(-args.runs // RUNS_PER_THREAD):,} "
        f"threads, {3 * args.runs:,} events, {2 * args.runs:,} checkpoints in {took:.1f}s"
    )
    procs = [start_worker(args.concurrency) for _ in range(args.workers)]
    feeder = Feeder(backlog=2000)
    feeder.start()
    try:
        # Measure from the moment the workers are claiming (they start slowly on a busy box).
        started = time.monotonic()
        while claims_between(time.time() - 2, time.time() + 1)[0] < 20:
            if time.monotonic() - started > 120:
                sys.exit("the workers did not start claiming within 120 s")
            time.sleep(0.5)
        t_before = time.time()
        time.sleep(args.window)
        t_prune = time.time()
        prune = subprocess.run(
            [
                sys.executable,
                "manage.py",
                "pruneruns",
                "--older-than",
                "30",
                "--batch-size",
                str(args.batch_size),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        t_pruned = time.time()
        time.sleep(args.window)
        t_after = time.time()
    finally:
        feeder.stop.set()
        feeder.join()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
    print(f"pruneruns: {prune.stdout.strip() or prune.stderr.strip()}")
    cutoff = timezone.now() - timedelta(days=30)
    old_left = Run.objects.filter(created_at__lt=cutoff).count()
    stream = Run.objects.filter(created_at__gte=cutoff).count()
    print(
        f"prune took {t_pruned - t_prune:.1f}s = {args.runs / (t_pruned - t_prune):,.0f} runs/s "
        f"(batch {args.batch_size}); old runs left: {old_left:,}; runs of the stream: {stream:,}"
    )
    print(f"claim rate, {args.workers} worker(s) x concurrency {args.concurrency}:")
    report("before", t_before, t_prune)
    report("during", t_prune, t_pruned)
    report("after", t_pruned, t_after)


if __name__ == "__main__":
    main()
