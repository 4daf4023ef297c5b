"""Which of the hot writes PostgreSQL plans anew at every call, and what the calls take.

    DATABASE_URL=postgres://…/runsite_bench python bench/plan_cache.py [--n 60]

A prepared statement is planned for its values (a custom plan) for its first five calls; after
that PostgreSQL keeps one generic plan unless the generic plan looks dearer than the custom
ones did, and then it plans every call again. This runs, one after another in this process, N
cancels with wait's answer (interrupt and rollback, of a claimed run) and N refund runs to
their suspension, then lists this connection's prepared statements with how often each was
planned either way, and the calls' p50 (all of them, and the first ten: a new connection's).
Run it on two commits to compare. Prints figures and the machine; never asserts a time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60)
    args = parser.parse_args()
    postgres_database()
    from django.db import close_old_connections, connection

    from runs import services
    from runs.engine.worker import drain

    def cancel(action: str) -> float:
        thread = services.thread_create(metadata={})
        run = services.run_create(
            agent_id="slow", thread_id=thread.id, input={"steps": 5}, actor="bench"
        )
        services.run_claim(owner="bench", limit=1)  # running, as a worker holds it
        close_old_connections()
        started = time.perf_counter()
        services.run_cancel_on_thread(
            thread_id=thread.id,
            run_id=run.id,
            action=action,
            actor="bench",
            answer=services.CancelAnswer(),
        )
        took = time.perf_counter() - started
        close_old_connections()
        return took * 1000

    def refund() -> float:
        services.run_create(
            agent_id="refund", thread_id=None, input={"order_id": "A1", "amount": 5}, actor="bench"
        )
        close_old_connections()
        started = time.perf_counter()
        drain()
        took = time.perf_counter() - started
        close_old_connections()
        return took * 1000

    print("machine:", machine())
    interrupts, rollbacks, refunds = [], [], []
    for _ in range(args.n):
        interrupts.append(cancel("interrupt"))
        rollbacks.append(cancel("rollback"))
        refunds.append(refund())
    print(
        f"{args.n} of each, one after another: cancel p50 {statistics.median(interrupts):.2f} ms"
        f" (interrupt), {statistics.median(rollbacks):.2f} ms (rollback);"
        f" refund claim to suspension p50 {statistics.median(refunds):.2f} ms"
    )
    # A new connection's first calls: what a process pays after a start, or a pool that grew.
    first = slice(0, 10)
    print(
        f"the first 10 of each: cancel p50 {statistics.median(interrupts[first]):.2f} ms"
        f" (interrupt), {statistics.median(rollbacks[first]):.2f} ms (rollback);"
        f" refund claim to suspension p50 {statistics.median(refunds[first]):.2f} ms"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, left(regexp_replace(statement, '\\s+', ' ', 'g'),"
            " 90) FROM pg_prepared_statements WHERE generic_plans + custom_plans > 5"
            " ORDER BY custom_plans DESC, generic_plans DESC"
        )
        rows = cursor.fetchall()
    every = [r for r in rows if r[1] > 5]
    print(f"statements planned at every call: {len(every)} of {len(rows)} prepared and reused")
    for generic, custom, text in rows:
        print(f"  generic {generic:4}  custom {custom:4}  {text}")


if __name__ == "__main__":
    main()
