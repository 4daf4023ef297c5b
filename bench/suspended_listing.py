"""Suspended-run listing at scale: 1,000,000 runs (~5% suspended, 50 agents, 10,000 threads).

    DATABASE_URL=postgres://…/runsite_bench python bench/suspended_listing.py [--runs 1000000]

Fills the database with set-based INSERT … SELECT generate_series (a minute or two), then times
`selectors.suspended_runs_for_agent` for one agent without and with each filter, 50 times each,
and prints p50/p95 per query and the query plan. Use a scratch database: its runs are replaced.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, pct, setup_django  # noqa: E402

setup_django()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from runs import selectors  # noqa: E402
from runs.models import Run  # noqa: E402

FILL_SQL = [
    "TRUNCATE runs_runevent, runs_toolcall, runs_checkpoint, runs_run, runs_thread CASCADE",
    # 10,000 threads over 100 resources
    """INSERT INTO runs_thread (id, resource_id, metadata, status, values, created_at, updated_at)
       SELECT md5('t' || g)::uuid, 'resource-' || (g %% 100), '{}'::jsonb, 'idle', NULL,
              now() - interval '90 days', now()
         FROM generate_series(1, 10000) g""",
    # runs: 5% suspended, the rest spread over finished statuses; 50 agents; 90 days
    """INSERT INTO runs_run (id, thread_id, agent_id, resource_id, status, input, output, error,
                            metadata, kwargs, multitask_strategy, attempt, last_seq, created_at,
                            updated_at, suspended_at, finished_at, cancel_reason)
       SELECT md5('r' || g)::uuid,
              md5('t' || (abs(hashtext('t' || g)) %% 10000 + 1))::uuid,
              'agent-' || (g %% 50),
              'resource-' || ((abs(hashtext('t' || g)) %% 10000 + 1) %% 100),
              CASE WHEN abs(hashtext('s' || g)) %% 20 = 0 THEN 'suspended'
                   WHEN abs(hashtext('s' || g)) %% 20 = 1 THEN 'error'
                   WHEN abs(hashtext('s' || g)) %% 20 = 2 THEN 'interrupted'
                   ELSE 'success' END,
              jsonb_build_object('n', g), NULL, NULL, '{}'::jsonb, '{}'::jsonb, 'enqueue', 1, 3,
              now() - (g %% 129600) * interval '1 minute',
              now() - (g %% 129600) * interval '1 minute' + interval '1 second',
              CASE WHEN abs(hashtext('s' || g)) %% 20 = 0
                   THEN now() - (g %% 129600) * interval '1 minute' + interval '1 second' END,
              CASE WHEN abs(hashtext('s' || g)) %% 20 <> 0
                   THEN now() - (g %% 129600) * interval '1 minute' + interval '2 second' END,
              ''
         FROM generate_series(1, %(runs)s) g""",
    # one waiting tool call per suspended run
    """INSERT INTO runs_toolcall (id, run_id, tool_call_id, step, tool_name, args, requires_approval,
                                 status, decided_by, decision_reason, created_at, suspended_at)
       SELECT md5('c' || r.id::text)::uuid, r.id, 'call_' || substr(r.id::text, 1, 8), 1,
              'issue_refund', jsonb_build_object('amount', 10), true, 'awaiting_approval', '', '',
              r.created_at, r.suspended_at
         FROM runs_run r WHERE r.status = 'suspended'""",
    "VACUUM ANALYZE runs_thread",
    "VACUUM ANALYZE runs_run",
    "VACUUM ANALYZE runs_toolcall",
]


def fill(runs: int) -> float:
    t0 = time.monotonic()
    with connection.cursor() as c:
        for sql in FILL_SQL:
            c.execute(sql, {"runs": runs})
    return time.monotonic() - t0


class _Timer:
    """Times every statement precisely (Django's captured times are rounded to 1 ms)."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, float]] = []

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001, ANN204
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.queries.append(
                (
                    connection.ops.compose_sql(sql, params) if params else sql,
                    (time.perf_counter() - t0) * 1000,
                )
            )


def time_listing(label: str, repeat: int, **filters: object) -> str:
    page_ms, count_ms, call_ms = [], [], []
    plan_sql = ""
    result = None
    for _ in range(repeat):
        timer = _Timer()
        with connection.execute_wrapper(timer):
            t0 = time.perf_counter()
            result = selectors.suspended_runs_for_agent(
                agent_id="agent-0", per_page=20, page=0, **filters
            )
            call_ms.append((time.perf_counter() - t0) * 1000)
        for sql, ms in timer.queries:
            if "COUNT(" in sql:
                count_ms.append(ms)
            elif "LIMIT" in sql and '"runs_run"' in sql:
                page_ms.append(ms)
                plan_sql = sql
    plan = explain(plan_sql)
    scan = "Seq Scan!" if "Seq Scan" in plan else ("index" if "Index" in plan else "-")
    print(
        f"  {label:<27} total={result.total:>5} | page query p50={pct(page_ms, 50):.2f}ms "
        f"p95={pct(page_ms, 95):.2f}ms [{scan}] | count p95={pct(count_ms, 95):.2f}ms | "
        f"whole call p50={pct(call_ms, 50):.2f}ms p95={pct(call_ms, 95):.2f}ms"
    )
    return plan


def explain(sql: str) -> str:
    if not sql:
        return "(no page query: nothing matched)"
    with connection.cursor() as c:
        c.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql)
        return "\n".join(row[0] for row in c.fetchall())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--no-fill", action="store_true", help="reuse the data already there")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/suspended_listing.py needs DATABASE_URL=postgres://… (a scratch database)")
    call_command("migrate", verbosity=0)
    print(f"machine: {machine()}")
    if not args.no_fill:
        print(f"filled {args.runs:,} runs in {fill(args.runs):.1f}s")
    total = Run.objects.count()
    suspended = Run.objects.filter(status="suspended").count()
    print(f"runs: {total:,} ({suspended:,} suspended, 50 agents, 10,000 threads)")
    now = timezone.now()
    thread = (
        Run.objects.filter(agent_id="agent-0", status="suspended")
        .values_list("thread_id", flat=True)
        .first()
    )
    plans = {}
    print("suspended_runs_for_agent(agent-0, per_page=20, page=0):")
    plans["no filter"] = time_listing("no filter", args.repeat)
    plans["thread_id"] = time_listing("thread_id", args.repeat, thread_id=thread)
    plans["resource_id"] = time_listing("resource_id", args.repeat, resource_id="resource-1")
    plans["from_date"] = time_listing(
        "from_date (last 7 days)", args.repeat, from_date=now - timedelta(days=7)
    )
    plans["to_date"] = time_listing(
        "to_date (older than 30 d)", args.repeat, to_date=now - timedelta(days=30)
    )
    plans["all"] = time_listing(
        "all filters",
        args.repeat,
        resource_id="resource-1",
        from_date=now - timedelta(days=60),
        to_date=now - timedelta(days=1),
    )
    with connection.cursor() as c:
        c.execute(
            "SELECT pg_size_pretty(pg_relation_size('run_suspended_idx')), "
            "pg_size_pretty(pg_relation_size('run_suspended_resource_idx'))"
        )
        sizes = c.fetchone()
    print(f"partial indexes: run_suspended_idx {sizes[0]}, run_suspended_resource_idx {sizes[1]}")
    print("plan (no filter):")
    print("    " + plans["no filter"].replace("\n", "\n    "))
    for name in ("thread_id", "resource_id", "all"):
        print(f"plan ({name}):")
        print("    " + plans[name].replace("\n", "\n    "))


if __name__ == "__main__":
    main()
