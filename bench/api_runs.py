"""The JSON API through langgraph_sdk against a running server and its workers. Prints figures
and the machine; never asserts a time.

    python bench/api_runs.py --url http://127.0.0.1:8765 [--runs 200] [--concurrency 8]

Start the server (Daphne) and workers yourself, on PostgreSQL, with RUNS_API_AUTH=off (or pass
--api-key). With DATABASE_URL set to the same database, the machine line names its PostgreSQL
version. Server-side latencies (create → running, cancel → cancelled) are read from the runs'
timelines (GET /api/runs/{id}/events), which the server stamps on the same clock.

Measured:
  1. echo: thread create + runs.wait at concurrency C → runs/s, p50/p95 per run
  2. create → running: runs.create of an echo run → its `started` event (server clock)
  3. cancel(wait=True) of a running `slow` run, action interrupt and rollback → p50/p95
  4. cancel_many(status="running") over N running runs → time until the last is interrupted
  5. refund: runs.wait until suspended (the human pause), then resume approve → success, p50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from langgraph_sdk import get_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, setup_django, summary  # noqa: E402

# Long steps: the runs being cancelled sit inside a tool's sleep (woken at once by a cancel), so
# they measure the cancel path without loading the machine with their own checkpoints.
SLOW = {"steps": 100, "delay_ms": 1000}


def ms(seconds: float) -> float:
    return seconds * 1000.0


async def until(check: Any, timeout: float = 30.0, interval: float = 0.005) -> None:
    end = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > end:
            raise TimeoutError("condition not met")
        await asyncio.sleep(interval)


class Bench:
    def __init__(self, url: str, api_key: str | None):
        self.url = url.rstrip("/")
        self.client = get_client(url=self.url + "/api", api_key=api_key)
        headers = {"x-api-key": api_key} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.url + "/api", headers=headers, timeout=60)

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        r = await self.http.get(f"/runs/{run_id}/events", params={"limit": 1000})
        r.raise_for_status()
        return r.json()["events"]

    async def event_time(self, run_id: str, kind: str) -> datetime:
        for e in await self.events(run_id):
            if e["kind"] == kind:
                return datetime.fromisoformat(e["created_at"].replace("Z", "+00:00"))
        raise LookupError(f"run {run_id} has no {kind} event")

    async def running_slow(self, thread_id: str) -> dict[str, Any]:
        run = await self.client.runs.create(thread_id, "slow", input=SLOW)

        async def running() -> bool:
            r = await self.client.runs.get(thread_id, run["run_id"])
            return r["status"] == "running"

        await until(running)
        return run

    # 1 ------------------------------------------------------------------------------------------

    async def echo_throughput(self, runs: int, concurrency: int) -> None:
        latencies: list[float] = []
        wait_only: list[float] = []
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(runs):
            queue.put_nowait(i)

        async def worker() -> None:
            while True:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                start = time.perf_counter()
                thread = await self.client.threads.create()
                mid = time.perf_counter()
                values = await self.client.runs.wait(thread["thread_id"], "echo", input={"i": i})
                end = time.perf_counter()
                assert values["output"] == {"echo": {"i": i}}, values
                latencies.append(ms(end - start))
                wait_only.append(ms(end - mid))

        # Warm up connections and caches outside the measurement.
        for _ in range(concurrency):
            t = await self.client.threads.create()
            await self.client.runs.wait(t["thread_id"], "echo", input={})
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        print(f"echo runs (thread create + runs.wait), {runs} runs at concurrency {concurrency}:")
        print(f"  {runs / elapsed:.1f} runs/s ({elapsed:.2f}s wall)")
        print(f"  per run:          {summary(latencies)}")
        print(f"  runs.wait alone:  {summary(wait_only)}")

    # 2 ------------------------------------------------------------------------------------------

    async def create_to_running(self, samples: int) -> None:
        server: list[float] = []
        client_seen: list[float] = []
        thread = await self.client.threads.create()
        tid = thread["thread_id"]
        for _ in range(samples):
            start = time.perf_counter()
            run = await self.client.runs.create(tid, "echo", input={})
            parts = self.client.runs.join_stream(tid, run["run_id"], last_event_id="-1")
            async for part in parts:
                if part.event == "values":  # the first checkpoint: the worker is running it
                    client_seen.append(ms(time.perf_counter() - start))
                    break
            await parts.aclose()
            await self.client.runs.join(tid, run["run_id"])
            created = await self.event_time(run["run_id"], "created")
            running = await self.event_time(run["run_id"], "started")
            server.append(ms((running - created).total_seconds()))
            await asyncio.sleep(0.05)  # an idle queue each time: latency, not throughput
        print(f"create → running ({samples} echo runs, one at a time):")
        print(f"  server (created → started event): {summary(server)}")
        print(f"  client (create call → first values event): {summary(client_seen)}")

    # 3 ------------------------------------------------------------------------------------------

    async def cancel_latency(self, samples: int, action: str) -> None:
        client: list[float] = []
        server: list[float] = []
        for _ in range(samples):
            tid = (await self.client.threads.create())["thread_id"]
            run = await self.running_slow(tid)
            await asyncio.sleep(0.1)  # inside a tool's sleep, mid-step
            start = time.perf_counter()
            wall = datetime.now().astimezone()
            await self.client.runs.cancel(tid, run["run_id"], wait=True, action=action)
            client.append(ms(time.perf_counter() - start))
            if action == "interrupt":
                stopped = await self.event_time(run["run_id"], "cancelled")
                server.append(ms((stopped - wall).total_seconds()))
        print(f"cancel(wait=True, action={action}) of a running slow run ({samples} runs):")
        print(f"  client (call → response): {summary(client)}")
        if server:
            print(f"  server (call → cancelled event): {summary(server)}")

    # 4 ------------------------------------------------------------------------------------------

    async def bulk_cancel(self, n: int) -> None:
        tids = [(await self.client.threads.create())["thread_id"] for _ in range(n)]
        runs = await asyncio.gather(*(self.running_slow(t) for t in tids))
        await asyncio.sleep(0.1)
        wall = datetime.now().astimezone()
        start = time.perf_counter()
        await self.client.runs.cancel_many(status="running", action="interrupt")
        answered = ms(time.perf_counter() - start)

        async def all_stopped() -> bool:
            got = await asyncio.gather(
                *(self.client.runs.get(t, r["run_id"]) for t, r in zip(tids, runs, strict=True))
            )
            return all(r["status"] == "interrupted" for r in got)

        await until(all_stopped, interval=0.002)
        seen = ms(time.perf_counter() - start)
        stops = [await self.event_time(r["run_id"], "cancelled") for r in runs]
        last = ms((max(stops) - wall).total_seconds())
        print(f"cancel_many(status=running) over {n} running slow runs:")
        print(f"  call answered (204): {answered:.2f}ms")
        print(
            f"  until the last run is interrupted: {last:.2f}ms (server clock), "
            f"{seen:.2f}ms (client, by polling)"
        )

    # 5 ------------------------------------------------------------------------------------------

    async def human_pause(self, samples: int) -> None:
        suspend: list[float] = []
        resume: list[float] = []
        server_suspend: list[float] = []
        for i in range(samples):
            tid = (await self.client.threads.create())["thread_id"]
            start = time.perf_counter()
            paused = await self.client.runs.wait(
                tid, "refund", input={"order_id": f"B-{i}", "amount": 5}
            )
            suspend.append(ms(time.perf_counter() - start))
            assert "__interrupt__" in paused, paused
            start = time.perf_counter()
            done = await self.client.runs.wait(
                tid, "refund", command={"resume": {"approved": True}}
            )
            resume.append(ms(time.perf_counter() - start))
            assert done["output"]["refunded"] is True, done
            run = (await self.client.runs.list(tid, limit=1))[0]
            created = await self.event_time(run["run_id"], "created")
            suspended = await self.event_time(run["run_id"], "suspended")
            server_suspend.append(ms((suspended - created).total_seconds()))
        print(f"refund → suspended → approve → success ({samples} runs):")
        print(f"  runs.wait until suspended (client): {summary(suspend)}")
        print(f"  created → suspended (server):       {summary(server_suspend)}")
        print(f"  runs.wait resume approve → success: {summary(resume)}")


async def run_all(args: argparse.Namespace) -> None:
    bench = Bench(args.url, args.api_key)
    await bench.echo_throughput(args.runs, args.concurrency)
    await bench.create_to_running(args.samples)
    await bench.cancel_latency(args.samples, "interrupt")
    await bench.cancel_latency(args.samples, "rollback")
    await bench.bulk_cancel(args.bulk)
    await bench.human_pause(args.samples)
    await bench.http.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8765")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--bulk", type=int, default=10)
    args = parser.parse_args()

    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        setup_django()  # only to name the PostgreSQL version in the machine line
    print(f"machine: {machine()}")  # before the event loop: Django's ORM is sync-only
    print(f"server: {args.url}")
    asyncio.run(run_all(args))


if __name__ == "__main__":
    main()
