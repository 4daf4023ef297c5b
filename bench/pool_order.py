"""Which pooled connection a request gets, and what it costs: psycopg's own pool (the connection
idle longest) against Runsite's (the one returned last, runsite/dbpool.py). Prints figures and the
machine; never asserts a time.

    DATABASE_URL=postgres://…/runsite_bench python bench/pool_order.py [--n 20] [--rounds 2]

In this process, as a server process meets it: the pool first grows to --connections (as a burst
of concurrent requests grows it), then one caller at a time does what a sequential client's
requests do, each handing its connection back at the end (as a request does): a cancel of a
running `slow` run (`services.run_cancel_on_thread`, the figure timed; its run created and claimed
before), and a refund run created and executed to its suspension (`drain`). Each order runs in
--rounds alternating rounds, each on a fresh pool, so a drift of the machine shows in both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20, help="operations of each kind per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=8, help="the pool's size first")
    args = parser.parse_args()
    postgres_database()
    from django.db import close_old_connections, connection
    from psycopg_pool import ConnectionPool

    from runs import services
    from runs.engine.worker import drain
    from runsite.dbpool import LifoConnectionPool
    from runsite.postgres.base import DatabaseWrapper

    def grow() -> None:
        barrier = threading.Barrier(args.connections)

        def hold() -> None:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            barrier.wait()
            close_old_connections()

        with ThreadPoolExecutor(args.connections) as pool:
            list(pool.map(lambda _: hold(), range(args.connections)))

    def cancel() -> float:
        run = services.run_create(
            agent_id="slow", thread_id=None, input={"steps": 5, "delay_ms": 10}, actor="bench"
        )
        close_old_connections()
        services.run_claim(owner="bench", limit=1)
        close_old_connections()
        started = time.perf_counter()
        assert run.thread_id is not None
        services.run_cancel_on_thread(
            thread_id=run.thread_id, run_id=run.id, action="interrupt", actor="bench"
        )
        took = time.perf_counter() - started
        close_old_connections()
        return took * 1000

    def refund() -> float:
        started = time.perf_counter()
        services.run_create(
            agent_id="refund", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="bench"
        )
        close_old_connections()
        drain()
        took = time.perf_counter() - started
        close_old_connections()
        return took * 1000

    print("machine:", machine())
    print(
        f"a pool grown to {args.connections} connections, then {args.n} of each operation one"
        " after another, each handing its connection back"
    )
    orders = {
        "psycopg (idle longest)": ConnectionPool,
        "Runsite (returned last)": LifoConnectionPool,
    }
    for round_ in range(1, args.rounds + 1):
        for name, pool_class in orders.items():
            connection.close()
            connection.close_pool()
            DatabaseWrapper.pool_class = pool_class
            grow()
            cancels = [cancel() for _ in range(args.n)]
            refunds = [refund() for _ in range(args.n)]
            print(
                f"round {round_} {name:24} cancel p50 {statistics.median(cancels):6.2f} ms"
                f" (mean {statistics.fmean(cancels):6.2f}),"
                f" refund to suspension p50 {statistics.median(refunds):6.2f} ms"
                f" (mean {statistics.fmean(refunds):6.2f})"
            )
    DatabaseWrapper.pool_class = LifoConnectionPool


if __name__ == "__main__":
    main()
