"""A full garbage collection in a web process, with its start-up heap frozen (as it runs:
runs/heap.py) and not. Prints figures and the machine; never asserts a time.

    python bench/gc_pause.py [--repeat 5]

Loads the ASGI application as a server does (URLs, templates, the API, the admin; the heap is
frozen at the end of the import), makes `--live` objects as serving does, then times `gc.collect()` (a full collection, as Python makes
one or two a minute under load) with the heap frozen, then again after `gc.unfreeze()`. A full
collection holds the GIL: a web process's event loop answers nothing meanwhile.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, setup_django  # noqa: E402


def full_collections(repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--live",
        type=int,
        default=20_000,
        help="objects made after start-up and kept (a web process under load held ~20,000)",
    )
    args = parser.parse_args()
    setup_django()
    import runsite.asgi  # noqa: F401  (loads and freezes as a server's import does)

    frozen = gc.get_freeze_count()
    kept = [{"run_id": str(i), "statuses": {"running"}} for i in range(args.live // 3)]
    tracked = len(gc.get_objects())
    with_freeze = full_collections(args.repeat)
    gc.unfreeze()
    without = full_collections(args.repeat)
    del kept
    print(f"machine: {machine()}")
    print(f"web process after start-up: {frozen} objects frozen, {tracked} tracked besides")
    for label, times in (("frozen start-up heap", with_freeze), ("nothing frozen", without)):
        print(
            f"  full collection, {label:22} median {statistics.median(times):7.2f} ms"
            f"  (min {min(times):.2f}, max {max(times):.2f}, n={len(times)})"
        )


if __name__ == "__main__":
    main()
