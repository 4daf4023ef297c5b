"""Load: two web instances (Daphne, or uvicorn with --server uvicorn) and two workers on PostgreSQL + Redis, 200 websocket clients and
API traffic (create runs, list suspended runs, approve, cancel) for a fixed time.

    DATABASE_URL=postgres://…/runsite_bench REDIS_URL=redis://…/0 python bench/load.py [--seconds 60] [--server daphne|uvicorn]

Prints throughput and p50/p95/p99 per endpoint, commit→websocket delivery latency, errors and
server memory before/after, with the machine. Loopback only; bounded in time. The database's
runs are deleted first: point it at a scratch database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, pct, setup_django  # noqa: E402

setup_django()

# Stateless runs whose temporary threads stay (as before they were deleted at the end): the
# workload and the delivery figure stay comparable (a deleted run's removal is not a delivery).
KEEP = {"on_completion": "keep"}

import httpx  # noqa: E402
import websockets  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.contrib.sessions.backends.db import SessionStore  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from runs import services  # noqa: E402
from runsite import servers  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_processes(
    env: dict[str, str], server: str
) -> tuple[list[tuple[str, subprocess.Popen]], list[subprocess.Popen]]:
    webs = []
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen(
            servers.command(server, host="127.0.0.1", port=port),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        webs.append((f"http://127.0.0.1:{port}", proc))
    workers = [
        subprocess.Popen(
            [sys.executable, "manage.py", "runagents", "--concurrency", "4"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    for url, _ in webs:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    return webs, workers


ROW_ID = re.compile(r'id="run-row-([0-9a-f-]{36})"')


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.status: Counter = Counter()
        self.created_at: dict[str, float] = {}
        self.delivery: list[float] = []
        self.ws_frames = 0
        self.ws_errors = 0


async def ws_client(url: str, cookie: str, stats: Stats, stop: asyncio.Event) -> None:
    ws_url = url.replace("http://", "ws://") + "/ws/runs/?view=runs"
    seen: set[str] = set()
    while not stop.is_set():
        try:
            async with websockets.connect(
                ws_url,
                additional_headers={"Cookie": f"sessionid={cookie}", "Origin": url},
                open_timeout=20,
            ) as ws:
                while not stop.is_set():
                    try:
                        frame = await asyncio.wait_for(ws.recv(), timeout=0.5)
                    except TimeoutError:
                        continue
                    now = time.monotonic()
                    stats.ws_frames += 1
                    text = frame if isinstance(frame, str) else frame.decode()
                    for run_id in ROW_ID.findall(text):
                        created = stats.created_at.get(run_id)
                        if created is not None and run_id not in seen:
                            seen.add(run_id)
                            stats.delivery.append((now - created) * 1000)
        except Exception:
            stats.ws_errors += 1
            await asyncio.sleep(0.5)


async def api_client(url: str, key: str, stats: Stats, stop: asyncio.Event, seed: int) -> None:
    rng = random.Random(seed)
    headers = {"x-api-key": key}
    async with httpx.AsyncClient(base_url=f"{url}/api", headers=headers, timeout=30) as client:

        async def timed(label: str, method: str, path: str, **kw: object) -> httpx.Response | None:
            t0 = time.monotonic()
            try:
                r = await client.request(method, path, **kw)
            except httpx.HTTPError as exc:
                stats.status[f"{label} {type(exc).__name__}"] += 1
                return None
            stats.latency[label].append((time.monotonic() - t0) * 1000)
            stats.status[r.status_code] += 1
            return r

        while not stop.is_set():
            choice = rng.random()
            if choice < 0.35:
                r = await timed(
                    "POST /runs (echo)",
                    "POST",
                    "/runs",
                    json={**KEEP, "assistant_id": "echo", "input": {"n": 1}},
                )
                if r is not None and r.status_code == 200:
                    stats.created_at[r.json()["run_id"]] = time.monotonic()
            elif choice < 0.55:
                r = await timed(
                    "POST /runs (refund)",
                    "POST",
                    "/runs",
                    json={
                        **KEEP,
                        "assistant_id": "refund",
                        "input": {"order_id": "L", "amount": 5},
                    },
                )
                if r is not None and r.status_code == 200:
                    stats.created_at[r.json()["run_id"]] = time.monotonic()
            elif choice < 0.75:
                await timed(
                    "GET suspended-runs",
                    "GET",
                    "/agents/refund/suspended-runs",
                    params={"per_page": 20, "page": 0},
                )
            elif choice < 0.90:
                listing = await timed(
                    "GET suspended-runs",
                    "GET",
                    "/agents/refund/suspended-runs",
                    params={"per_page": 5, "page": 0},
                )
                if listing is not None and listing.status_code == 200 and listing.json()["runs"]:
                    run = rng.choice(listing.json()["runs"])
                    await timed(
                        "POST approve-tool-call",
                        "POST",
                        "/agents/refund/approve-tool-call",
                        json={"run_id": run["run_id"]},
                    )
            else:
                r = await timed(
                    "POST /runs (slow)",
                    "POST",
                    "/runs",
                    json={**KEEP, "assistant_id": "slow", "input": {"steps": 20, "delay_ms": 50}},
                )
                if r is not None and r.status_code == 200:
                    body = r.json()
                    await asyncio.sleep(0.2)
                    await timed(
                        "POST cancel",
                        "POST",
                        f"/threads/{body['thread_id']}/runs/{body['run_id']}/cancel",
                        params={"action": rng.choice(["interrupt", "rollback"]), "wait": 0},
                    )


async def drive(
    webs: list[str], key: str, cookie: str, seconds: float, clients: int, api_clients: int
) -> Stats:
    stats = Stats()
    stop = asyncio.Event()
    ws_tasks = [
        asyncio.create_task(ws_client(webs[i % 2], cookie, stats, stop)) for i in range(clients)
    ]
    await asyncio.sleep(3)  # let the sockets connect
    api_tasks = [
        asyncio.create_task(api_client(webs[i % 2], key, stats, stop, i))
        for i in range(api_clients)
    ]
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*api_tasks, return_exceptions=True)
    await asyncio.sleep(1)
    for t in ws_tasks:
        t.cancel()
    await asyncio.gather(*ws_tasks, return_exceptions=True)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--api-clients", type=int, default=8)
    parser.add_argument("--server", choices=servers.SERVERS, default=servers.DEFAULT)
    args = parser.parse_args()
    if connection.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        sys.exit("bench/load.py needs DATABASE_URL=postgres://… and REDIS_URL=redis://…")
    call_command("migrate", verbosity=0)
    with connection.cursor() as c:
        c.execute(
            "TRUNCATE runs_runevent, runs_toolcall, runs_checkpoint, runs_run, runs_thread CASCADE"
        )
    services.groups_ensure()
    user, _ = User.objects.get_or_create(
        username="loadbot", defaults={"is_staff": True, "is_superuser": True}
    )
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
    session["_auth_user_hash"] = user.get_session_auth_hash()
    session.create()
    _, key = services.api_key_create(name=f"load-{int(time.time())}")
    env = {**os.environ, "ALLOWED_HOSTS": "127.0.0.1,localhost", "RUNS_API_AUTH": "on"}
    webs, workers = start_processes(env, args.server)
    try:
        mem_before = [rss_mb(p.pid) for _, p in webs]
        t0 = time.monotonic()
        stats = asyncio.run(
            drive(
                [u for u, _ in webs],
                key,
                session.session_key,
                args.seconds,
                args.clients,
                args.api_clients,
            )
        )
        elapsed = time.monotonic() - t0
        mem_after = [rss_mb(p.pid) for _, p in webs]
    finally:
        for _, p in webs:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for _, p in webs:
            p.wait(20)
        for p in workers:
            p.wait(30)
    total = sum(len(v) for v in stats.latency.values())
    print(f"machine: {machine()}")
    print(
        f"load: {args.clients} websocket clients on 2 {args.server} instances, {args.api_clients} API clients, "
        f"2 workers x concurrency 4, {args.seconds:.0f}s"
    )
    print(f"API requests: {total} in {elapsed:.1f}s = {total / elapsed:.0f} req/s")
    for label, values in sorted(stats.latency.items()):
        print(
            f"  {label:<26} n={len(values):>5} p50={pct(values, 50):7.1f}ms p95={pct(values, 95):7.1f}ms p99={pct(values, 99):7.1f}ms"
        )
    five = {k: v for k, v in stats.status.items() if isinstance(k, int) and k >= 500}
    print(f"responses: {dict(stats.status)}; 5xx: {sum(five.values())}")
    print(
        f"commit -> websocket delivery (first frame naming a new run, per client): "
        f"n={len(stats.delivery)} p50={pct(stats.delivery, 50):.1f}ms p99={pct(stats.delivery, 99):.1f}ms "
        f"(frames {stats.ws_frames}, socket errors {stats.ws_errors})"
    )
    print(
        "server memory (RSS): before "
        + ", ".join(f"{m:.0f} MB" for m in mem_before)
        + "; after "
        + ", ".join(f"{m:.0f} MB" for m in mem_after)
    )


if __name__ == "__main__":
    main()
