"""How long the inbox takes to render its first page with 10,000 suspended runs.

    DATABASE_URL=postgres://user@host:5432/db python bench/inbox_render.py [--runs 10000]

It creates a throwaway database next to DATABASE_URL's (Django's test-database machinery, named
`runsite_bench_inbox`, dropped at the end), fills it with suspended runs (each waiting on one
tool call: approvals and questions, across agents, threads and resources), then requests
`GET /inbox/` through Django's test client as a signed-in reviewer: the whole request, with
middleware, session, permission checks, the queries and the template. Several filtered and
ordered variants are timed too. The target is a first page under 200 ms. PostgreSQL only
(the figure is about PostgreSQL's plans); `--allow-sqlite` runs it anyway for a smoke test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
os.environ["DATABASE_TEST_NAME"] = "runsite_bench_inbox"
os.environ.setdefault("LOG_LEVEL", "WARNING")

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from runs.models import Run, RunStatus, Thread, ToolCall, ToolCallStatus  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _common import machine  # noqa: E402

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
}


def database_version() -> str:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            return f"PostgreSQL {cursor.fetchone()[0]}"
        cursor.execute("select sqlite_version()")
        return f"SQLite {cursor.fetchone()[0]}"


def fill(n: int) -> None:
    """n suspended top-level runs with one waiting tool call each, in bulk."""
    now = timezone.now()
    threads = Thread.objects.bulk_create(
        Thread(resource_id=f"tenant-{i % 50}", status="interrupted") for i in range(500)
    )
    batch = 2000
    for start in range(0, n, batch):
        runs = []
        for i in range(start, min(n, start + batch)):
            thread = threads[i % len(threads)]
            runs.append(
                Run(
                    thread=thread,
                    agent_id=("refund", "weather", "support")[i % 3],
                    resource_id=thread.resource_id,
                    status=RunStatus.SUSPENDED,
                    input={"order_id": f"O-{i}", "amount": i % 500 + 0.5},
                    last_seq=13,
                    attempt=1,
                    started_at=now - timedelta(minutes=i + 1),
                    suspended_at=now - timedelta(minutes=i),
                )
            )
        Run.objects.bulk_create(runs)
        calls = []
        for i, run in enumerate(runs, start):
            if run.agent_id == "weather":
                calls.append(
                    ToolCall(
                        run=run,
                        tool_call_id=f"call_{i:08x}",
                        step=1,
                        tool_name="ask_city",
                        args={},
                        status=ToolCallStatus.AWAITING_INPUT,
                        suspend_payload={"message": "Which city?"},
                        resume_schema=CITY_SCHEMA,
                        suspended_at=run.suspended_at,
                    )
                )
            else:
                calls.append(
                    ToolCall(
                        run=run,
                        tool_call_id=f"call_{i:08x}",
                        step=3,
                        tool_name="issue_refund",
                        args=run.input,
                        requires_approval=True,
                        status=ToolCallStatus.AWAITING_APPROVAL,
                        suspended_at=run.suspended_at,
                    )
                )
        ToolCall.objects.bulk_create(calls)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def timed(client: Client, url: str, repeat: int) -> list[float]:
    for _ in range(3):  # warm-up: template loading, connection, caches
        assert client.get(url).status_code == 200
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - start) * 1000)
        assert response.status_code == 200
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--allow-sqlite", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    args = parser.parse_args()
    if connection.vendor != "postgresql" and not args.allow_sqlite:
        print("Set DATABASE_URL=postgres://… (or pass --allow-sqlite for a smoke run).")
        return 2

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        started = time.perf_counter()
        fill(args.runs)
        filled = time.perf_counter() - started
        reviewer = User.objects.create_user("bench-reviewer")
        reviewer.groups.add(Group.objects.get_or_create(name="Reviewers")[0])
        from django.contrib.auth.models import Permission

        reviewer.user_permissions.add(Permission.objects.get(codename="review_run"))
        client = Client()
        client.force_login(reviewer)

        with CaptureQueriesContext(connection) as ctx:
            body = client.get("/inbox/").content.decode()
        rows = body.count('id="inbox-row-')
        sql_ms = sum(float(q["time"]) for q in ctx.captured_queries) * 1000

        print(f"machine:  {machine()}")
        print(f"database: {database_version()}")
        print(
            f"data:     {Run.objects.filter(status=RunStatus.SUSPENDED).count()} suspended runs "
            f"(filled in {filled:.1f} s); first page shows {rows} rows"
        )
        print(
            f"queries:  {len(ctx.captured_queries)} per request, {sql_ms:.1f} ms of SQL "
            "(as Django measures it)"
        )
        print(
            f"{'GET':38} {'median':>8} {'p95':>8} {'min':>8} {'max':>8}   ms, {args.repeat} requests"
        )
        worst_median = 0.0
        for url in (
            "/inbox/",
            "/inbox/?order=oldest",
            "/inbox/?agent=refund",
            "/inbox/?tool=ask_city",
            "/inbox/?resource=tenant-7",
            "/inbox/?waiting=600",
            "/inbox/?page=50",
        ):
            times = sorted(timed(client, url, args.repeat))
            median = statistics.median(times)
            p95 = times[max(0, int(len(times) * 0.95) - 1)]
            worst_median = max(worst_median, median) if url == "/inbox/" else worst_median
            print(f"{url:38} {median:8.1f} {p95:8.1f} {times[0]:8.1f} {times[-1]:8.1f}")
        verdict = "meets" if worst_median < 200 else "MISSES"
        print(f"first page: median {worst_median:.1f} ms, {verdict} the 200 ms target")
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
