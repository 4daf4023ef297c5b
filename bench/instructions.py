"""Instructions per operation in the service layer and the worker, counted by valgrind: the same
count on every run of the same code, however loaded or noisy the machine. Prints figures and the
machine; never asserts anything.

    DATABASE_URL=postgres://…/runsite_bench python bench/instructions.py [--ops refund,echo,cancel]

Each operation runs in one process under `valgrind --tool=cachegrind` (no cache simulation),
at two sizes (--small and --large operations after the same start-up); the difference divided by
the difference in size is what one operation costs this process: Python, Django, psycopg,
everything but PostgreSQL's own work. PYTHONHASHSEED is fixed (with a random seed the start-up's
count varies by ~10 %). Operations, all in-process through runs/services (no HTTP):

- refund: `run_create` of the refund agent, then the worker's loop until it suspends (claim,
  three step writes, the suspension): what a HITL run costs before its reviewer.
- echo: `run_create` of echo, then the worker's loop to its end.
- cancel: `run_create` of slow, a claim, then `run_cancel(action=interrupt)` of the running run.

And requests through the ASGI application (`runsite.asgi.application`) in process, as Daphne
hands them over, with an API key (the server's own HTTP parsing and socket writes are not in it):

- api_ok: `GET /api/ok`, the API's floor (no key, no database).
- api_get: `runs.get` of a finished run.
- api_cancel: `runs.cancel(wait=true)` of a queued run (created beforehand, not counted).

Time per instruction differs between machines; compare commits on one machine. Needs valgrind
(Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, machine, postgres_database, setup_django  # noqa: E402


def workload(op: str, n: int) -> None:
    if op.startswith("api_"):
        api_workload(op, n)
        return
    setup_django()
    from runs import services
    from runs.engine.worker import drain

    for _ in range(n):
        if op == "refund":
            services.run_create(
                agent_id="refund",
                thread_id=None,
                input={"order_id": "A1", "amount": 5},
                actor="bench",
            )
            drain()
        elif op == "echo":
            services.run_create(agent_id="echo", thread_id=None, input={"n": 1}, actor="bench")
            drain()
        elif op == "cancel":
            services.run_create(
                agent_id="slow",
                thread_id=None,
                input={"steps": 5, "delay_ms": 10},
                actor="bench",
            )
            for claimed in services.run_claim(owner="bench", limit=1):
                services.run_cancel(run=claimed.run, action="interrupt", actor="bench")
        else:
            raise SystemExit(f"unknown operation {op!r}")


API_CANCEL_RUNS = 40


def api_workload(op: str, n: int) -> None:
    import asyncio

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
    from runsite.asgi import application

    setup_django()  # logging off, as for the others
    from runs import services
    from runs.engine.worker import drain

    key = services.api_key_create(name=f"instructions-{os.getpid()}")[1]
    ran = services.run_create(agent_id="echo", thread_id=None, input={"n": 1}, actor="bench")
    drain()
    # As many queued runs at every size (their creation is not the operation), n cancelled.
    if op == "api_cancel" and n > API_CANCEL_RUNS:
        raise SystemExit(f"api_cancel counts at most {API_CANCEL_RUNS} cancels")
    queued = [
        services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 5, "delay_ms": 10}, actor="bench"
        )
        for _ in range(API_CANCEL_RUNS if op == "api_cancel" else 0)
    ][:n]

    def request(method: str, path: str, query: bytes = b"") -> tuple[str, str, bytes]:
        return method, path, query

    if op == "api_ok":
        requests = [request("GET", "/api/ok")] * n
    elif op == "api_get":
        requests = [request("GET", f"/api/threads/{ran.thread_id}/runs/{ran.id}")] * n
    elif op == "api_cancel":
        requests = [
            request("POST", f"/api/threads/{r.thread_id}/runs/{r.id}/cancel", b"wait=true")
            for r in queued
        ]
    else:
        raise SystemExit(f"unknown operation {op!r}")

    # An HTTP/1.1 request as Daphne hands it over, with the key; each request sets its own
    # method, path and query string.
    base = dict(
        type="http",
        asgi={"version": "3.0"},
        http_version="1.1",
        scheme="http",
        root_path="",
        headers=[(b"host", b"127.0.0.1"), (b"x-api-key", key.encode())],
        client=("127.0.0.1", 50000),
        server=("127.0.0.1", 8000),
    )

    async def serve(method: str, path: str, query: bytes) -> None:
        scope = {**base, "method": method, "path": path, "raw_path": path.encode()}
        scope["query_string"] = query
        sent: list[dict] = []
        received = False

        async def receive() -> dict:
            nonlocal received
            if not received:
                received = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client stays
            return {}

        async def send(message: dict) -> None:
            sent.append(message)

        await application(scope, receive, send)
        if sent[0]["status"] >= 300:
            raise SystemExit(f"{method} {path}: {sent[0]['status']} {sent[1:2]}")

    async def main() -> None:
        for method, path, query in requests:
            await serve(method, path, query)

    asyncio.run(main())


def count(op: str, n: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    # Once without valgrind first: a source changed since its last import is compiled (and its
    # .pyc written) there, not in the counted start-up (hundreds of millions more).
    subprocess.run(
        [sys.executable, __file__, "--run", op, "1"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--run",
            op,
            str(n),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"{op} failed:\n{done.stderr[-3000:]}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        workload(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default="refund,echo,cancel")
    parser.add_argument("--small", type=int, default=2)
    parser.add_argument("--large", type=int, default=22)
    args = parser.parse_args()
    postgres_database()
    from django.db import connection

    connection.close()
    print("machine:", machine())
    # Each size runs alone: a drain takes whatever is pending, a parallel one's runs included.
    for op in args.ops.split(","):
        small, large = count(op, args.small), count(op, args.large)
        per = (large - small) / (args.large - args.small)
        print(f"{op:8} {per / 1e6:7.2f} M instructions per operation (this process)")


if __name__ == "__main__":
    main()
