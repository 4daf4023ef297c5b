"""What holding writes saves a human-in-the-loop run (runs/engine/loop.py, `HeldWrites`).

    DATABASE_URL=postgres://…/runsite_bench python bench/held_writes.py [--n 30] [--rounds 2]

The built-in refund agent (a read-only `lookup_order`, an in-process `ScriptedModel`) against
the same agent with every write made as it happens (its lookup not read-only, its model not in
process): created and executed to its suspension (claim, then one transaction against three),
then approved and executed to its end (the call's `running` mark and the end against one more
transaction between them). In this process, one run at a time, in alternating rounds so a
drift of the machine shows in both. Prints p50 and mean per kind and the machine; never
asserts a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, postgres_database  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=30, help="runs of each kind per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    postgres_database()
    from django.db import close_old_connections

    from runs import services
    from runs.agents.refund import issue_refund, lookup_order, refund_script
    from runs.engine import Agent, ScriptedModel, registry
    from runs.engine.worker import drain
    from runs.models import Run

    class RemoteScript(ScriptedModel):
        in_process = False  # as an LLM over the network: nothing held across its decision

    eager = Agent(
        id="refund_eager",
        tools=[dataclasses.replace(lookup_order, read_only=False), issue_refund],
        model=RemoteScript(refund_script),
    )
    registry.register(eager)

    def one(agent_id: str) -> tuple[float, float]:
        services.run_create(
            agent_id=agent_id,
            thread_id=None,
            input={"order_id": "A1", "amount": 5},
            actor="bench",
        )
        close_old_connections()
        started = time.perf_counter()
        drain()
        suspended = time.perf_counter() - started
        close_old_connections()
        run = Run.objects.filter(agent_id=agent_id).order_by("-created_at").first()
        assert run is not None and run.status == "suspended", run
        services.tool_call_approve(run=run, actor="bench")
        close_old_connections()
        started = time.perf_counter()
        drain()
        resumed = time.perf_counter() - started
        close_old_connections()
        return suspended * 1000, resumed * 1000

    print("machine:", machine())
    print(f"{args.n} refund runs per kind and round, one at a time: to suspension, then resumed")
    for agent_id in ("refund", "refund_eager"):  # warm both (plans, caches)
        for _ in range(5):
            one(agent_id)
    for round_ in range(1, args.rounds + 1):
        for agent_id, name in (("refund", "held"), ("refund_eager", "every write")):
            figures = [one(agent_id) for _ in range(args.n)]
            to_suspension = [s for s, _ in figures]
            to_end = [r for _, r in figures]
            print(
                f"round {round_} {name:12} to suspension p50 {statistics.median(to_suspension):6.2f}"
                f" ms (mean {statistics.fmean(to_suspension):6.2f}), resume to end p50"
                f" {statistics.median(to_end):6.2f} ms (mean {statistics.fmean(to_end):6.2f})"
            )


if __name__ == "__main__":
    main()
