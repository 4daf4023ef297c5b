"""What a pause costs the next call: the same calls made back to back, and each after the
machine sat idle for a while (as the peers' harness leaves it: 350 ms before every cancel).

    DATABASE_URL=postgres://…/runsite_bench python bench/idle_wake.py [--n 40] [--gaps 0,1,20,350]

On a virtual machine an idle core is halted; waking it, and the process or thread that runs on
it, costs time the busy path never pays, once per process that slept. A request that crosses
several processes (web server, its thread pool, PostgreSQL, a worker) pays it at each. Calls,
each timed alone after the gap: a `SELECT 1` round trip, an `INSERT` and its commit (a fsync),
a bare Python loop (no waking: the CPU itself is not slower), and a cancel with wait's answer in
this process (`services.run_cancel_on_thread`: one statement that commits, of a claimed run).
Prints p50s per gap and the machine; never asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="calls of each kind per gap")
    parser.add_argument("--gaps", default="0,1,20,350", help="idle gaps before a call, in ms")
    args = parser.parse_args()
    postgres_database()
    import psycopg
    from django.db import close_old_connections, connection

    from runs import services

    gaps = [float(g) / 1000 for g in args.gaps.split(",")]
    params = connection.get_connection_params()
    for python_side in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(python_side, None)
    raw = psycopg.connect(autocommit=True, **params)
    # A logged table: its commit waits for the WAL's flush, as every write of Runsite's does.
    raw.execute("CREATE TABLE IF NOT EXISTS bench_idle_wake (x int)")

    def select_one() -> None:
        raw.execute("SELECT 1").fetchone()

    def insert_commit() -> None:
        raw.execute("INSERT INTO bench_idle_wake VALUES (1)")

    def python_loop() -> None:
        sum(range(20_000))

    def claimed_run() -> tuple[object, object]:
        thread = services.thread_create(metadata={})
        run = services.run_create(
            agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="bench"
        )
        services.run_claim(owner="bench-idle", limit=1)
        close_old_connections()
        return thread.id, run.id

    def timed(call: Callable[[], None], gap: float) -> float:
        if gap:
            time.sleep(gap)
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    print("machine:", machine())
    print(f"{args.n} calls of each kind per gap, each timed alone after the gap (p50, ms)")
    print(f"{'gap':>8} {'SELECT 1':>10} {'INSERT+commit':>14} {'Python loop':>12} {'cancel':>8}")
    for gap in gaps:
        figures: dict[str, list[float]] = {"select": [], "insert": [], "python": [], "cancel": []}
        for _ in range(args.n):
            figures["select"].append(timed(select_one, gap))
            figures["insert"].append(timed(insert_commit, gap))
            figures["python"].append(timed(python_loop, gap))
            thread_id, run_id = claimed_run()

            def cancel(thread_id: object = thread_id, run_id: object = run_id) -> None:
                services.run_cancel_on_thread(
                    thread_id=thread_id,  # type: ignore[arg-type]
                    run_id=run_id,  # type: ignore[arg-type]
                    action="interrupt",
                    actor="bench",
                    answer=services.CancelAnswer(),
                )
                close_old_connections()

            figures["cancel"].append(timed(cancel, gap))
        p50 = {k: statistics.median(v[3:]) for k, v in figures.items()}  # past the first plans
        print(
            f"{gap * 1000:6.0f}ms {p50['select']:10.3f} {p50['insert']:14.3f}"
            f" {p50['python']:12.3f} {p50['cancel']:8.3f}"
        )
    raw.execute("DROP TABLE bench_idle_wake")
    raw.close()


if __name__ == "__main__":
    main()
