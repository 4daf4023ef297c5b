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
from collections.abc import Awaitable, Callable
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


def clients_of(paths: list[str]) -> list[Any]:
    """A `langgraph_sdk` client per env file."""
    clients = []
    for path in paths:
        env = read_env(path)
        clients.append(get_client(url=env["RUNSITE_API_URL"], api_key=env["RUNSITE_API_KEY"]))
    return clients


async def alternated(
    clients: list[Any], pairs: int, measure: Callable[[Any, int], Awaitable[Any]]
) -> tuple[list[Any], list[Any]]:
    """`measure(client, i)` on both servers `pairs` times, A first on even rounds."""
    results: tuple[list[Any], list[Any]] = ([], [])
    for i in range(pairs):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            results[side].append(await measure(clients[side], i))
    return results


def print_paired(name: str, a: list[float], b: list[float]) -> None:
    diff = statistics.median(x - y for x, y in zip(a, b, strict=True))
    print(
        f"{name}: A p50 {statistics.median(a):.2f} ms, B p50 {statistics.median(b):.2f} ms,"
        f" paired median A - B {diff:+.2f} ms ({len(a)} pairs)"
    )


def paired_servers(
    doc: str, pairs: int, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, list[Any]]:
    """The command line every paired bench takes (--a, --b, --pairs, and `parser`'s own
    options), parsed, with a client per server; prints the machine."""
    parser = parser or argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="env file of server A (start_runsite.sh)")
    parser.add_argument("--b", required=True, help="env file of server B")
    parser.add_argument("--pairs", type=int, default=pairs)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    return args, clients_of([args.a, args.b])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--action", choices=["interrupt", "rollback", "both"], default="both")
    args, clients = paired_servers(__doc__, 60, parser)
    actions = ["interrupt", "rollback"] if args.action == "both" else [args.action]
    for action in actions:

        async def cancel(client: Any, _: int, action: str = action) -> float:
            return await one_cancel(client, action)

        a, b = await alternated(clients, args.pairs, cancel)
        print_paired(action, a, b)


if __name__ == "__main__":
    asyncio.run(main())
