"""Two running Runsites compared on the peers' harness's bulk cancel, round by round: ten `slow`
runs on ten threads, once all are `running`, `runs.cancel_many(status="running")` through
`langgraph_sdk`, then the ten runs read at once until all are terminal (the harness's "all
terminal"), alternating between the two servers (A first on even rounds). Prints each one's p50
of the call and of all terminal, the paired median difference (A − B, positive: B is faster)
and the machine; never asserts a time.

    python bench/paired_cancel_many.py --a ENV_FILE --b ENV_FILE [--pairs 20]

ENV_FILE as for bench/paired_cancel.py. Each server must have no other running runs (the
cancel is by status, as the harness's is).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_cancel import alternated, paired_servers, print_paired  # noqa: E402

RUNS = 10  # the harness's --many
TERMINAL = {"success", "error", "interrupted", "timeout"}


async def one_bulk_cancel(client: Any, _round: int) -> tuple[float, float]:
    """(the call, the call to all terminal), in ms."""
    threads = [(await client.threads.create())["thread_id"] for _ in range(RUNS)]
    runs = await asyncio.gather(
        *(
            client.runs.create(t, "bench_slow", input={"steps": 20, "delay_ms": 250})
            for t in threads
        )
    )
    ids = list(zip(threads, [r["run_id"] for r in runs], strict=True))
    while not all(
        r["status"] == "running"
        for r in await asyncio.gather(*(client.runs.get(t, r) for t, r in ids))
    ):
        await asyncio.sleep(0.02)
    started = time.perf_counter()
    await client.runs.cancel_many(status="running")
    call = (time.perf_counter() - started) * 1000
    while not all(
        r["status"] in TERMINAL
        for r in await asyncio.gather(*(client.runs.get(t, r) for t, r in ids))
    ):
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.3)  # the workers settle before the other server's round
    return call, (time.perf_counter() - started - 0.3) * 1000


async def main() -> None:
    args, clients = paired_servers(__doc__, 20)
    a, b = await alternated(clients, args.pairs, one_bulk_cancel)
    print_paired("cancel_many call", [x[0] for x in a], [x[0] for x in b])
    print_paired("cancel_many all terminal", [x[1] for x in a], [x[1] for x in b])


if __name__ == "__main__":
    asyncio.run(main())
