"""Engine benchmarks on PostgreSQL: claim throughput, wake-up latency, cancel latency, crash
recovery. Prints figures and the machine; never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench python bench/engine.py [--runs 2000]

The database is migrated and its runs are deleted first: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, setup_django, start_worker, summary  # noqa: E402

setup_django()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

from runs import services  # noqa: E402
from runs.models import Run, RunEvent, RunStatus, Thread  # noqa: E402

# Stateless runs that keep their temporary threads: the figures read the runs after they end.
KEEP = {"on_completion": "keep"}


def reset() -> None:
    with connection.cursor() as c:
        c.execute(
            "TRUNCATE runs_runevent, runs_toolcall, runs_checkpoint, runs_run, runs_thread, runs_auditentry CASCADE"
        )


def wait_until(predicate, timeout: float, interval: float = 0.01) -> bool:  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


def queue_echo_runs(n: int) -> None:
    """Queue n echo runs, each on its own thread, in one transaction (as run_create would)."""
    now = timezone.now()
    threads = [Thread(status="busy", metadata={}) for _ in range(n)]
    runs = [
        Run(thread=t, agent_id="echo", input={"i": i}, status=RunStatus.PENDING, last_seq=1)
        for i, t in enumerate(threads)
    ]
    with transaction.atomic():
        Thread.objects.bulk_create(threads, batch_size=2000)
        Run.objects.bulk_create(runs, batch_size=2000)
        RunEvent.objects.bulk_create(
            [RunEvent(run=r, seq=1, kind="created", data={}, created_at=now) for r in runs],
            batch_size=2000,
        )
        with connection.cursor() as c:
            c.execute("SELECT pg_notify(%s, '')", [services.QUEUE_CHANNEL])


def bench_throughput(n: int, workers: int, concurrency: int, *, keep: bool = False) -> float:
    """n echo runs queued at once, drained by `workers` processes. `keep`: on the table as the
    last burst left it (its ended runs are the table's history) instead of a truncated one."""
    if not keep:
        reset()
    before = Run.objects.filter(status=RunStatus.SUCCESS).count()
    starts_before = RunEvent.objects.filter(kind="started").count()
    procs = [start_worker(concurrency) for _ in range(workers)]
    time.sleep(3)  # let them start and go idle
    t0 = time.monotonic()
    queue_echo_runs(n)
    ok = wait_until(
        lambda: Run.objects.filter(status=RunStatus.SUCCESS).count() >= before + n,
        timeout=600,
        interval=0.05,
    )
    elapsed = time.monotonic() - t0
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(30)
    done = Run.objects.filter(status=RunStatus.SUCCESS).count() - before
    starts = RunEvent.objects.filter(kind="started").count() - starts_before
    rate = done / elapsed
    print(
        f"  {workers} worker process(es) x concurrency {concurrency}: {done}/{n} echo runs in "
        f"{elapsed:.2f}s = {rate:,.0f} runs/s end to end, {before:,} ended runs in the table"
        f" before (started events {starts}; "
        f"{'ok' if ok and starts == n else 'CHECK'})"
    )
    return rate


def bench_wakeup(samples: int) -> list[float]:
    reset()
    proc = start_worker(4)
    time.sleep(3)
    latencies = []
    for i in range(samples):
        run = services.run_create(
            agent_id="echo", thread_id=None, input=i, actor="bench", kwargs=KEEP
        )
        wait_until(
            lambda r=run: RunEvent.objects.filter(run_id=r.id, kind="started").exists(),
            timeout=10,
            interval=0.001,
        )
        started = RunEvent.objects.get(run_id=run.id, kind="started").created_at
        # created_at of the run is set before its insert; the event after the claim statement
        latencies.append((started - run.created_at).total_seconds() * 1000)
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return latencies


def bench_cancel(samples: int, action: str) -> tuple[list[float], list[float]]:
    """The caller's view (call -> row changed, polled) and the row's (requested -> finished)."""
    reset()
    proc = start_worker(4)
    time.sleep(3)
    latencies, on_row = [], []
    for _ in range(samples):
        run = services.run_create(
            agent_id="slow",
            thread_id=None,
            input={"steps": 1000, "delay_ms": 20},
            actor="bench",
            kwargs=KEEP,
        )
        wait_until(
            lambda r=run: Run.objects.filter(id=r.id, status=RunStatus.RUNNING).exists(),
            timeout=10,
            interval=0.002,
        )
        time.sleep(0.05)
        t0 = time.perf_counter()
        services.run_cancel(run=run, action=action, actor="bench")
        if action == "interrupt":
            wait_until(
                lambda r=run: Run.objects.filter(id=r.id, status=RunStatus.INTERRUPTED).exists(),
                timeout=10,
                interval=0.001,
            )
            row = Run.objects.get(id=run.id)
            on_row.append((row.finished_at - row.cancel_requested_at).total_seconds() * 1000)
        else:
            wait_until(
                lambda r=run: not Run.objects.filter(id=r.id).exists(), timeout=10, interval=0.001
            )
        latencies.append((time.perf_counter() - t0) * 1000)
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return latencies, on_row


def bench_sigkill(lease: float) -> float:
    reset()
    env = {
        "RUNS_LEASE_SECONDS": str(lease),
        "RUNS_HEARTBEAT_SECONDS": str(lease / 3),
        "RUNS_REAPER_SECONDS": "1",
    }
    a = start_worker(2, env)
    time.sleep(3)
    run = services.run_create(
        agent_id="slow",
        thread_id=None,
        input={"steps": 200, "delay_ms": 50},
        actor="bench",
        kwargs=KEEP,
    )
    wait_until(lambda: Run.objects.filter(id=run.id, status=RunStatus.RUNNING).exists(), timeout=10)
    b = start_worker(2, env)
    time.sleep(3)
    os.kill(a.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(
        lambda: Run.objects.filter(id=run.id, attempt=2, status=RunStatus.RUNNING).exists(),
        timeout=lease + 30,
        interval=0.01,
    )
    elapsed = time.monotonic() - killed
    b.send_signal(signal.SIGTERM)
    b.wait(30)
    a.wait(5)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="then as many more bursts with 2 workers, each on the table the last one left",
    )
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/engine.py needs DATABASE_URL=postgres://… (a scratch database)")
    call_command("migrate", verbosity=0)
    print(f"machine: {machine()}")
    print(f"claim throughput ({args.runs} queued echo runs):")
    for w in [int(x) for x in args.workers.split(",")]:
        bench_throughput(args.runs, w, args.concurrency)
    for _ in range(args.history):
        bench_throughput(args.runs, 2, args.concurrency, keep=True)
    print(f"enqueue -> claimed, idle worker: {summary(bench_wakeup(args.samples))}")
    caller, on_row = bench_cancel(30, "interrupt")
    print(f"cancel interrupt -> interrupted, seen by the caller: {summary(caller)}")
    print(f"cancel interrupt -> interrupted, on the run row: {summary(on_row)}")
    caller, _ = bench_cancel(30, "rollback")
    print(f"cancel rollback -> deleted, seen by the caller: {summary(caller)}")
    print(
        f"SIGKILL of a worker -> its run claimed again (lease {args.lease}s): {bench_sigkill(args.lease):.2f}s"
    )


if __name__ == "__main__":
    main()
