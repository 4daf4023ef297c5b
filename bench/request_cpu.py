"""CPU per API operation, per process: what one `langgraph_sdk` call costs the server, its
workers, PostgreSQL, Redis and the client. Prints figures and the machine; never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench REDIS_URL=redis://…/0 \
        python bench/request_cpu.py [--ops echo,join,get,refund] [--n 300] [--rounds 2]

Starts Runsite as the peers' sitting does (one Daphne, two `runagents --concurrency 5`, DEBUG
off, API keys on) on the given (migrated) database, then runs each operation sequentially N
times after 20 warm-ups, reading each process's utime+stime from /proc before and after. This
is the A/B measure used in docs/benchmarks.md: run it on two commits, alternately, minutes
apart; a shared 2-core VM varies by ±20 % between runs, so compare rounds, not single figures.

Operations: echo = threads.create + runs.wait of the `echo` agent; wait = runs.wait on one
thread (its state grows: use sparingly); join = runs.join of a finished run; get = runs.get;
tcreate = threads.create; refund = threads.create + runs.wait of `refund` until it suspends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from langgraph_sdk import get_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, setup_django  # noqa: E402

from runsite import servers  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def pids_named(name: str) -> list[int]:
    found = subprocess.run(["pgrep", name], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Site:
    """One Daphne and two workers on this database, as the peers' sitting runs them."""

    def __init__(self, server: str) -> None:
        self.port = free_port()
        env = {**os.environ, "DEBUG": "False", "RUNS_EMBEDDED_WORKER": "0"}
        env.setdefault("ALLOWED_HOSTS", "127.0.0.1")
        env.setdefault("SECRET_KEY", "bench-request-cpu")
        out = subprocess.DEVNULL
        self.web = subprocess.Popen(
            servers.command(server, host="127.0.0.1", port=self.port),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=out,
        )
        self.workers = [
            subprocess.Popen(
                [sys.executable, "manage.py", "runagents", "--concurrency", "5"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=out,
            )
            for _ in range(2)
        ]
        self.url = f"http://127.0.0.1:{self.port}/api"
        for _ in range(240):
            try:
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        else:
            self.stop()
            raise SystemExit("the server did not answer")

    def processes(self) -> dict[str, list[int]]:
        return {
            "web": [self.web.pid],
            "workers": [w.pid for w in self.workers],
            "postgres": pids_named("postgres"),
            "redis": pids_named("redis-server"),
            "client": [os.getpid()],
        }

    def stop(self) -> None:
        for proc in [self.web, *self.workers]:
            proc.terminate()
        for proc in [self.web, *self.workers]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def snapshot(processes: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(cpu_seconds(p) for p in pids) for name, pids in processes.items()}


async def measure(site: Site, key: str, op: str, n: int) -> str:
    client = get_client(url=site.url, api_key=key)
    thread = await client.threads.create()
    thread_id = thread["thread_id"]
    await client.runs.wait(thread_id, "echo", input={"n": 0})
    run_id = (await client.runs.list(thread_id, limit=1))[0]["run_id"]

    async def echo() -> None:
        t = await client.threads.create()
        await client.runs.wait(t["thread_id"], "echo", input={"n": 1})

    async def refund() -> None:
        t = await client.threads.create()
        await client.runs.wait(t["thread_id"], "refund", input={"order_id": "A1", "amount": 5})

    ops: dict[str, Callable[[], Awaitable[Any]]] = {
        "echo": echo,
        "wait": lambda: client.runs.wait(thread_id, "echo", input={"n": 1}),
        "join": lambda: client.runs.join(thread_id, run_id),
        "get": lambda: client.runs.get(thread_id, run_id),
        "tcreate": lambda: client.threads.create(),
        "refund": refund,
    }
    one = ops[op]
    for _ in range(20):
        await one()
    processes = site.processes()
    before, started = snapshot(processes), time.perf_counter()
    for _ in range(n):
        await one()
    wall = time.perf_counter() - started
    after = snapshot(processes)
    per = {name: (after[name] - before[name]) / n * 1000 for name in processes}
    parts = " ".join(f"{name}={value:.2f}" for name, value in per.items())
    return (
        f"{op:8} n={n} wall {wall / n * 1000:6.2f} ms/op; CPU ms/op: {parts} "
        f"total={sum(per.values()):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="echo,join,get,refund")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server", choices=servers.SERVERS, default=servers.DEFAULT)
    args = parser.parse_args()
    setup_django()
    from django.core.management import call_command

    from runs import services

    call_command("migrate", verbosity=0)
    key = services.api_key_create(name=f"request-cpu-{os.getpid()}")[1]
    print("machine:", machine())
    print(f"one {args.server}, two runagents --concurrency 5; sequential langgraph_sdk client")
    for round_ in range(1, args.rounds + 1):
        site = Site(args.server)
        try:
            for op in args.ops.split(","):
                print(f"round {round_}: " + asyncio.run(measure(site, key, op.strip(), args.n)))
        finally:
            site.stop()


if __name__ == "__main__":
    main()
