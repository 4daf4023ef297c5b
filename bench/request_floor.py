"""What a request costs before its own work: sequential requests against a running server, back to
back and with a pause between them (as the peers' harness leaves one between its timed calls).
Prints figures and the machine; never asserts a time.

    python bench/request_floor.py --url http://127.0.0.1:8765/api --api-key rs_… [--n 300]

Requests, each one step more than the one before:
  1. GET /api/ok: the server and the handler, no API key, no database;
  2. GET a thread with a wrong API key: plus the key's lookup (answered 401);
  3. GET a thread: plus one read;
  4. cancel (wait=true) of a run the thread does not have: plus BEGIN, the locking read and
     ROLLBACK (answered 404): a cancel but for its one write and COMMIT.
On a machine whose idle CPUs sleep (a VM), each process or thread a request wakes (the server's
loop, its thread pool, PostgreSQL's backend) costs more after a pause than back to back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the API's base URL, ending in /api")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--pause-ms", type=float, default=50.0)
    args = parser.parse_args()
    base = args.url.rstrip("/")
    client = httpx.Client(base_url=base, headers={"x-api-key": args.api_key})
    bare = httpx.Client(base_url=base)
    thread_id = client.post("/threads", json={}).raise_for_status().json()["thread_id"]

    def expect(status: int, response: httpx.Response) -> None:
        if response.status_code != status:
            raise SystemExit(f"{response.request.url}: {response.status_code}, not {status}")

    calls: dict[str, Callable[[], None]] = {
        "GET /api/ok": lambda: expect(200, bare.get("/ok")),
        "GET a thread, wrong key (401)": lambda: expect(
            401, bare.get(f"/threads/{thread_id}", headers={"x-api-key": "rs_wrong"})
        ),
        "GET a thread": lambda: expect(200, client.get(f"/threads/{thread_id}")),
        "cancel a run not on the thread (404)": lambda: expect(
            404,
            client.post(f"/threads/{thread_id}/runs/{uuid.uuid4()}/cancel?wait=1&action=interrupt"),
        ),
    }
    print("machine (client):", machine())
    print(f"{args.n} sequential requests each; p50")
    for pause in (0.0, args.pause_ms / 1000):
        print(f"pause between requests: {pause * 1000:.0f} ms")
        for name, call in calls.items():
            for _ in range(20):
                call()
            took = []
            for _ in range(args.n):
                started = time.perf_counter()
                call()
                took.append(time.perf_counter() - started)
                if pause:
                    time.sleep(pause)
            print(f"  {name:40} {statistics.median(took) * 1000:6.2f} ms")


if __name__ == "__main__":
    main()
