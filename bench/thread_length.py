"""What a run costs as its thread grows: a chat thread gets a run per message, and the thread's
status is derived from its runs at every create, end, cancel and suspension. Prints figures and
the machine; never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench python bench/thread_length.py [--runs 2000] [--every 500]

In this process (no server): one thread, then `--runs` echo runs on it one after another, each
created (`services.run_create`) and executed to its end by the engine (`drain`). Prints the
p50 and p90 wall time of a run (create + claim + end) per block of `--every` runs, so a cost
that grows with the thread shows as a rising figure.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, pct, postgres_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--every", type=int, default=500)
    args = parser.parse_args()
    postgres_database()
    from runs import services
    from runs.engine.worker import drain

    thread = services.thread_create()
    print("machine:", machine())
    print(f"one thread, {args.runs} echo runs on it in turn (create, claim, end), in process")
    walls: list[float] = []
    for n in range(1, args.runs + 1):
        started = time.perf_counter()
        services.run_create(agent_id="echo", thread_id=thread.id, input={"n": n}, actor="bench")
        drain(max_runs=1)
        walls.append((time.perf_counter() - started) * 1000)
        if n % args.every == 0:
            block = slice(n - args.every, n)
            print(
                f"runs {n - args.every + 1:>5}–{n:<5} run p50 {pct(walls[block], 50):6.2f} ms,"
                f" p90 {pct(walls[block], 90):6.2f} ms"
            )


if __name__ == "__main__":
    main()
