"""Two running Runsites compared on the peers' harness's HITL legs, request by request: a
refund run through `runs.wait` to its suspension, then `runs.create` with `command.resume`
and `runs.join` to its success, through `langgraph_sdk`, alternating between the two servers
(A first on even rounds, B first on odd ones) so that both see the same machine. Prints each
leg's p50 per server and the paired median difference (A − B, positive: B is faster) and the
machine; never asserts a time.

    python bench/paired_hitl.py --a ENV_FILE --b ENV_FILE [--pairs 60]

Each ENV_FILE is what the peers' `start_runsite.sh` prints (RUNSITE_API_URL, RUNSITE_API_KEY),
for example one from a worktree of an older commit and one from the checkout. Their agents must
include the harness's `bench_approval` (the peers' `bench_agents.py`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_cancel import alternated, paired_servers, print_paired  # noqa: E402


async def one_hitl(client: Any, rep: int) -> tuple[float, float]:
    """(to the suspension, resume to success) in ms, as the harness times them."""
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    started = time.perf_counter()
    await client.runs.wait(
        thread_id, "bench_approval", input={"amount": 42.5, "order_id": f"ord-{rep}"}
    )
    suspended = (time.perf_counter() - started) * 1000
    # The harness reads the run, the thread and its state in between.
    await client.runs.list(thread_id, limit=10)
    await client.threads.get(thread_id)
    await client.threads.get_state(thread_id)
    started = time.perf_counter()
    run = await client.runs.create(
        thread_id, "bench_approval", command={"resume": {"approved": True, "rep": rep}}
    )
    await client.runs.join(thread_id, run["run_id"])
    return suspended, (time.perf_counter() - started) * 1000


async def main() -> None:
    args, clients = paired_servers(__doc__, 60)
    a, b = await alternated(clients, args.pairs, one_hitl)
    for index, name in ((0, "to suspension"), (1, "resume → success")):
        print_paired(name, [leg[index] for leg in a], [leg[index] for leg in b])


if __name__ == "__main__":
    asyncio.run(main())
