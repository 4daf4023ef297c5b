"""Baseline: a bare SKIP LOCKED claim + finish loop in psycopg (no Django, no engine), to put the
engine's claim throughput in context on the same machine at the same moment.

    DATABASE_URL=postgres://…/runsite_bench python bench/bare_queue.py [--jobs 20000] [--procs 4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, setup_django  # noqa: E402

CLAIM = """
WITH c AS (SELECT id FROM bench_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
UPDATE bench_jobs j SET status = 'running', owner = %s, lease = now() + interval '30 s'
  FROM c WHERE j.id = c.id RETURNING j.id
"""


def conninfo() -> dict:
    from django.db import connection

    s = connection.settings_dict
    return {
        k: v
        for k, v in {
            "dbname": s["NAME"],
            "user": s.get("USER") or None,
            "password": s.get("PASSWORD") or None,
            "host": s.get("HOST") or None,
            "port": s.get("PORT") or None,
        }.items()
        if v
    }


def work(info: dict, owner: str, counter) -> None:  # noqa: ANN001
    import psycopg

    with psycopg.connect(autocommit=True, **info) as conn:
        while True:
            with conn.transaction():
                row = conn.execute(CLAIM, (owner,)).fetchone()
            if row is None:
                return
            with conn.transaction():
                conn.execute(
                    "UPDATE bench_jobs SET status = 'done', output = %s WHERE id = %s AND owner = %s",
                    ('{"echo": 1}', row[0], owner),
                )
            with counter.get_lock():
                counter.value += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--procs", type=int, default=4)
    args = parser.parse_args()
    setup_django()
    import psycopg

    info = conninfo()
    with psycopg.connect(autocommit=True, **info) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_jobs")
        conn.execute(
            "CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, status text NOT NULL, owner text, lease timestamptz, output jsonb)"
        )
        conn.execute("CREATE INDEX ON bench_jobs (id) WHERE status = 'pending'")
        conn.execute(
            "INSERT INTO bench_jobs (status) SELECT 'pending' FROM generate_series(1, %s)",
            (args.jobs,),
        )
    counter = multiprocessing.Value("i", 0)
    procs = [
        multiprocessing.Process(target=work, args=(info, f"w{i}", counter))
        for i in range(args.procs)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    elapsed = time.monotonic() - t0
    print(f"machine: {machine()}")
    print(
        f"bare SKIP LOCKED claim+finish, {args.procs} processes: {counter.value} jobs in {elapsed:.2f}s = {counter.value / elapsed:,.0f} jobs/s"
    )
    with psycopg.connect(autocommit=True, **info) as conn:
        conn.execute("DROP TABLE bench_jobs")


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
    main()
