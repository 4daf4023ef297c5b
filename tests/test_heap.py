"""runs/heap.py: a web process and a worker set their start-up heap aside from the garbage
collector, so a full collection under load does not walk it (a pause of the whole process)."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from runs import heap

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import gc, json, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "runsite.settings")
import runsite.asgi
gc.collect()
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}))
"""


def test_a_web_process_freezes_its_start_up_heap_when_the_application_loads() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    state = json.loads(out.stdout.strip().splitlines()[-1])
    # Django, the API, the admin, the URL map and the templates: well over 50,000 objects, and
    # nearly nothing left for a full collection to walk.
    assert state["frozen"] > 50_000
    assert state["tracked"] < state["frozen"] / 20


def test_a_worker_freezes_its_start_up_heap_before_it_takes_runs(start_worker) -> None:
    worker = start_worker(LOG_LEVEL="DEBUG")
    found = None
    end = time.monotonic() + 10
    while found is None and time.monotonic() < end:
        found = re.search(r"start-up heap: (\d+) objects frozen", worker.output())
        time.sleep(0.05)
    assert found is not None, worker.output()[-2000:]
    assert int(found.group(1)) > 20_000
    # Frozen before it says it runs (and so before its first claim).
    output = worker.output()
    assert output.index("start-up heap:") < output.index("running with concurrency")


def test_freezing_moves_what_is_alive_out_of_the_collectors_generations() -> None:
    kept = [{"i": i} for i in range(1000)]
    try:
        frozen = heap.freeze_heap()
        assert frozen >= 1000
        assert not any(obj is kept for obj in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(obj is kept for obj in gc.get_objects())
