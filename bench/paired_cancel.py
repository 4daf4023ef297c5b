"""Two running Runsites compared on the peers' harness's cancel, request by request: a `slow` run,
350 ms after it is `running`, `runs.cancel(wait=True)`, through `langgraph_sdk`, alternating
between the two servers (A first on even rounds, B first on odd ones) so that both see the
same machine. Prints each one's p50 and the paired median difference (A − B, positive: B is
faster) and the machine; never asserts a time.

    python bench/paired_cancel.py --a ENV_FILE --b ENV_FILE [--pairs 60] [--action both]

Each ENV_FILE is what the peers' `start_runsite.sh` prints (RUNSITE_API_URL, RUNSITE_API_KEY),
for example one from a worktree of an older commit and one from the checkout. Their agents must
include the harness's `bench_slow` (the peers' `bench_agents.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from langgraph_sdk import get_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402

PRE_CANCEL_S = 0.35  # the harness's --pre-cancel-ms


def read_env(path: str) -> dict[str, str]:
    values = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.strip().partition("=")
        values[key] = value.strip('"')
    return values


async def one_cancel(client: Any, action: str) -> float:
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    run = await client.runs.create(thread_id, "bench_slow", input={"steps": 20, "delay_ms": 100})
    while (await client.runs.get(thread_id, run["run_id"]))["status"] != "running":
        await asyncio.sleep(0.02)
    await asyncio.sleep(PRE_CANCEL_S)
    started = time.perf_counter()
    await client.runs.cancel(thread_id, run["run_id"], wait=True, action=action)
    return (time.perf_counter() - started) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="env file of server A (start_runsite.sh)")
    parser.add_argument("--b", required=True, help="env file of server B")
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--action", choices=["interrupt", "rollback", "both"], default="both")
    args = parser.parse_args()
    clients = []
    for path in (args.a, args.b):
        env = read_env(path)
        clients.append(get_client(url=env["RUNSITE_API_URL"], api_key=env["RUNSITE_API_KEY"]))
    print(f"machine: {machine()}")
    actions = ["interrupt", "rollback"] if args.action == "both" else [args.action]
    for action in actions:
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(args.pairs):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for side in order:
                times[side].append(await one_cancel(clients[side], action))
        a, b = times
        diff = statistics.median(x - y for x, y in zip(a, b, strict=True))
        print(
            f"{action}: A p50 {statistics.median(a):.2f} ms, B p50 {statistics.median(b):.2f} ms,"
            f" paired median A - B {diff:+.2f} ms ({args.pairs} pairs)"
        )


if __name__ == "__main__":
    asyncio.run(main())
