"""Runs-list search at scale: N runs (default 1,000,000) with a search document each.

    DATABASE_URL=postgres://…/runsite_bench_search python bench/search.py [--runs 1000000]

Use a scratch database (its name must contain "bench"): its runs are replaced. The fill is
set-based SQL (INSERT … SELECT generate_series; the GIN index is built after the rows): each
run's document holds ~16 words drawn from a 20,000-word vocabulary with a skewed (Zipf-like)
frequency, so some words are in most documents and some in a handful, plus its thread's
customer. Documents are written by SQL here, in the shape runs/services/search.py gives them.

Then it times what one runs-list page costs with a search (`selectors.search.runs_list`: the
capped count, the page of 50 rows with their waiting tool calls, the highlights of those rows),
for rare, medium and common words, two words, a phrase, a word inside a status filter and an id
prefix; prints p50/p95 per page and the EXPLAIN ANALYZE of the count and page queries.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, pct, setup_django  # noqa: E402

setup_django()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from runs.forms import PAGE_SIZE  # noqa: E402
from runs.models import Run  # noqa: E402
from runs.selectors import RunFilters  # noqa: E402
from runs.selectors.search import RunListQuery, runs_list  # noqa: E402

VOCABULARY = 20_000
WORDS_PER_RUN = 16

FILL_SQL = [
    "TRUNCATE runs_runsearch, runs_runevent, runs_toolcall, runs_checkpoint, runs_run,"
    " runs_thread CASCADE",
    "DROP INDEX IF EXISTS runsearch_document_tsv_idx",
    """INSERT INTO runs_thread (id, resource_id, metadata, status, values, created_at, updated_at,
                               delete_when_done)
       SELECT md5('t' || g)::uuid, 'resource-' || (g %% 100),
              jsonb_build_object('customer', 'customer' || (g %% 5000)), 'idle', NULL,
              now() - interval '90 days', now(), false
         FROM generate_series(1, 10000) g""",
    # Ids ordered by creation like uuid7 (a time prefix), so an id prefix means something.
    """INSERT INTO runs_run (id, thread_id, agent_id, resource_id, status, input, output, error,
                            metadata, kwargs, multitask_strategy, attempt, last_seq, created_at,
                            updated_at, started_at, finished_at, cancel_reason)
       SELECT (lpad(to_hex(%(runs)s - g), 12, '0') || '7' || substr(md5('r' || g), 1, 3) || '8'
               || substr(md5('r' || g), 4, 15))::uuid,
              md5('t' || (g %% 10000 + 1))::uuid,
              'agent-' || (g %% 50),
              'resource-' || ((g %% 10000 + 1) %% 100),
              CASE WHEN g %% 20 = 0 THEN 'suspended' WHEN g %% 20 = 1 THEN 'error'
                   ELSE 'success' END,
              jsonb_build_object('n', g), NULL, NULL, '{}'::jsonb, '{}'::jsonb, 'enqueue',
              1 + g %% 3, 3,
              now() - (g %% 129600) * interval '1 minute',
              now() - (g %% 129600) * interval '1 minute' + interval '1 second',
              now() - (g %% 129600) * interval '1 minute',
              now() - (g %% 129600) * interval '1 minute' + (g %% 600) * interval '1 second',
              ''
         FROM generate_series(1, %(runs)s) g""",
    # The documents: words 'w<rank>' with rank ~ VOCABULARY * u^4 (u uniform): w0..w9 are in
    # most documents, w10000+ in a handful each.
    """INSERT INTO runs_runsearch (run_id, document)
       SELECT r.id,
              'input: n ' || (r.input->>'n') || ' note ' ||
              (SELECT string_agg('w' || floor(%(vocabulary)s * power(random(), 4))::int, ' ')
                 FROM generate_series(1, %(words)s + 0 * (r.input->>'n')::int))
              || E'\nthread: customer ' || (t.metadata->>'customer')
         FROM runs_run r JOIN runs_thread t ON t.id = r.thread_id""",
    "CREATE INDEX runsearch_document_tsv_idx ON runs_runsearch USING gin (document_tsv)",
    "VACUUM ANALYZE runs_thread",
    "VACUUM ANALYZE runs_run",
    "VACUUM ANALYZE runs_runsearch",
]


def fill(runs: int) -> float:
    t0 = time.monotonic()
    with connection.cursor() as c:
        for sql in FILL_SQL:
            c.execute(sql, {"runs": runs, "vocabulary": VOCABULARY, "words": WORDS_PER_RUN})
    return time.monotonic() - t0


class _Timer:
    def __init__(self) -> None:
        self.queries: list[tuple[str, float]] = []

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001, ANN204
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            composed = connection.ops.compose_sql(sql, params) if params else sql
            self.queries.append((composed, (time.perf_counter() - t0) * 1000))


def explain(sql: str) -> str:
    with connection.cursor() as c:
        c.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + sql)
        return "\n".join(row[0] for row in c.fetchall())


def time_page(label: str, user: User, query: RunListQuery, repeat: int) -> dict[str, str]:
    page_ms: list[float] = []
    parts: dict[str, list[float]] = {"count": [], "page": [], "headlines": [], "other": []}
    total = (0, False)
    sqls: dict[str, str] = {}
    for _ in range(repeat):
        timer = _Timer()
        with connection.execute_wrapper(timer):
            t0 = time.perf_counter()
            listing = runs_list(user, query)
            total = listing.count()
            rows = listing.decorate(listing.queryset[:PAGE_SIZE])
            page_ms.append((time.perf_counter() - t0) * 1000)
        spent = dict.fromkeys(parts, 0.0)
        for sql, ms in timer.queries:
            if "COUNT(" in sql:
                sqls["count"] = sql
                spent["count"] += ms
            elif "LIMIT" in sql and 'FROM "runs_run"' in sql:
                sqls["page"] = sql
                spent["page"] += ms
            elif "ts_headline" in sql:
                spent["headlines"] += ms
            else:
                spent["other"] += ms
        for name, ms in spent.items():
            parts[name].append(ms)
    marked = sum(1 for r in rows if getattr(r, "search_match", None))
    shown = f"{total[0]}{'+' if total[1] else ''}"
    print(
        f"  {label:<34} matches={shown:>6} rows={len(rows):>2} highlighted={marked:>2} | "
        f"page p50={pct(page_ms, 50):6.2f}ms p95={pct(page_ms, 95):6.2f}ms"
    )
    print(" " * 37 + " · ".join(f"{name} p50={pct(ms, 50):.2f}ms" for name, ms in parts.items()))
    return {name: explain(sql) for name, sql in sqls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--no-fill", action="store_true", help="reuse the data already there")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/search.py needs DATABASE_URL=postgres://…/runsite_bench_search")
    if "bench" not in connection.settings_dict["NAME"]:
        sys.exit("use a scratch database whose name contains 'bench': its runs are replaced")
    call_command("migrate", verbosity=0)
    print(f"machine: {machine()}")
    if not args.no_fill:
        print(f"filled {args.runs:,} runs (documents, GIN index) in {fill(args.runs):.1f}s")
    with connection.cursor() as c:
        c.execute(
            "SELECT pg_size_pretty(pg_relation_size('runsearch_document_tsv_idx')),"
            " pg_size_pretty(pg_total_relation_size('runs_runsearch'))"
        )
        index_size, table_size = c.fetchone()
    print(f"runs: {Run.objects.count():,}; GIN index {index_size}, runs_runsearch {table_size}")
    user, _ = User.objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    newest = Run.objects.order_by("-created_at").values_list("id", flat=True).first()
    prefix = str(newest)[:13]
    cases = [
        ("rare word (w19000)", RunListQuery(q="w19000")),
        ("medium word (w2000)", RunListQuery(q="w2000")),
        ("common word (w1)", RunListQuery(q="w1")),
        ("two words (w1 w300)", RunListQuery(q="w1 w300")),
        ('phrase ("note w0")', RunListQuery(q='"note w0"')),
        ("customer (thread metadata)", RunListQuery(q="customer42")),
        ("rare word, status=error", RunListQuery(q="w15000", filters=RunFilters(status=["error"]))),
        (
            "common word, status=suspended",
            RunListQuery(q="w0", filters=RunFilters(status=["suspended"])),
        ),
        ("common word, sort=-attempts", RunListQuery(q="w1", sort="-attempts")),
        (f"id prefix ({prefix})", RunListQuery(q=prefix)),
        ("no search (the list as before)", RunListQuery()),
    ]
    print(f"one runs-list page ({PAGE_SIZE} rows, capped count, highlights), {args.repeat}x each:")
    plans = {label: time_page(label, user, query, args.repeat) for label, query in cases}
    for label in (
        "rare word (w19000)",
        "common word (w1)",
        "two words (w1 w300)",
        "common word, status=suspended",
    ):
        for name, plan in plans[label].items():
            print(f"plan of the {name} query, {label}:")
            print("    " + plan.replace("\n", "\n    "))


if __name__ == "__main__":
    main()
