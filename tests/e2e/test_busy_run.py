"""The page of a busy run stays usable: a `slow` run taking ten steps a second, watched for
~15 s by a Support user who then stops it.

Prints what a person would feel (click → visible effect, p50/p95), what the socket carries
(bytes per frame) and how big the page grows (DOM nodes). Asserts only structure (bounded DOM,
small frames, the buttons work): a test never asserts a wall time.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.models import Run, RunStatus
from tests.e2e.test_browser import Browser, browser, live, shot, wait_status  # noqa: F401

pytestmark = [pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api").expect

WATCH_SECONDS = 15.0
CLICKS = 12
# A bounded page: the newest 200 timeline entries (~18 nodes each) and 200 tool call cards
# (~22 each) at most, plus the rest of the page (~600).
MAX_DOM_NODES = 9500
MAX_FRAME_BYTES = 16 * 1024
IN_PAGE_LATENCY = """
window.__clicks = [];
document.addEventListener("click", (evt) => {
  const t0 = evt.timeStamp;
  requestAnimationFrame(() => setTimeout(() => window.__clicks.push(performance.now() - t0), 0));
}, true);
"""


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _main_thread(cdp: Any) -> dict[str, float]:
    """Seconds the page's main thread has spent so far: in all, in script, style, layout."""
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    names = ("TaskDuration", "ScriptDuration", "RecalcStyleDuration", "LayoutDuration")
    return {name: metrics.get(name, 0.0) for name in names}


def _dom_nodes(page: Any) -> int:
    return page.evaluate("document.getElementsByTagName('*').length")


@pytest.mark.timeout(900)
def test_support_can_stop_a_runaway_run_while_its_page_streams(
    browser: Any,  # noqa: F811
    live_runsite: Any,
    support: User,
) -> None:
    thread = services.thread_create(metadata={"resource_id": "e2e"})
    run = services.run_create(
        agent_id="slow", thread_id=thread.id, input={"steps": 6000, "delay_ms": 100}, actor="e2e"
    )
    wait_status(run, RunStatus.RUNNING)
    time.sleep(3)  # a run page opened on a run that has been going for a while
    web = Browser(browser, live_runsite.url)
    frames: list[int] = []
    try:
        page = web.page(support, f"/runs/{run.id}/")
        # Per socket: the socket of the page before its reload may still acknowledge a frame.
        acks_by_socket: list[list[int]] = []

        def watch(ws: Any) -> None:
            ws.on(
                "framereceived",
                lambda payload: frames.append(
                    len(payload.encode() if isinstance(payload, str) else payload)
                ),
            )
            acks: list[int] = []
            acks_by_socket.append(acks)
            ws.on("framesent", lambda payload: acks.append(int(json.loads(payload).get("ack", -1))))

        page.on("websocket", watch)
        page.reload()  # the listener sees the socket only if it is there before it opens
        cdp = page.context.new_cdp_session(page)
        if os.environ.get("THROTTLE"):
            cdp.send("Emulation.setCPUThrottlingRate", {"rate": float(os.environ["THROTTLE"])})
        cdp.send("Performance.enable")
        busy_before = _main_thread(cdp)
        live(page)
        # In the page: from the click's input event to the next frame painted after it.
        page.evaluate(IN_PAGE_LATENCY)
        dom = [_dom_nodes(page)]
        clicks: list[float] = []
        rollback = page.locator("#cancel-rollback")
        started = time.monotonic()
        for _ in range(CLICKS):
            time.sleep(WATCH_SECONDS / CLICKS)
            t0 = time.monotonic()
            rollback.locator("summary").click()
            expect(rollback.locator("form")).to_be_visible(timeout=60_000)
            clicks.append((time.monotonic() - t0) * 1000)
            print(f"click {len(clicks)}: {clicks[-1]:.0f} ms, frames so far {len(frames)}")
            rollback.locator("summary").click()  # close it again
            expect(rollback.locator("form")).to_be_hidden(timeout=30_000)
            dom.append(_dom_nodes(page))
        watched = time.monotonic() - started
        busy = {k: v - busy_before[k] for k, v in _main_thread(cdp).items()}
        in_page = [c for i, c in enumerate(page.evaluate("window.__clicks")) if i % 2 == 0]
        # The thread page and the runs list of the same busy run, a few seconds each.
        others = {}
        for path in (f"/threads/{thread.id}/", "/runs/"):
            other_frames: list[int] = []
            other = web.page(support, "/accounts/login/")
            other.on(
                "websocket",
                lambda ws, f=other_frames: ws.on(
                    "framereceived",
                    lambda p: f.append(len(p.encode() if isinstance(p, str) else p)),
                ),
            )
            other.goto(path)
            live(other)
            nodes = _dom_nodes(other)
            time.sleep(5)
            others[path] = (nodes, _dom_nodes(other), other_frames)
            other.close()
        seq_shown = int(page.locator("#run-events").get_attribute("data-seq") or 0)

        # Stop it: interrupt, then the header says so.
        interrupt = page.locator("#cancel-interrupt")
        interrupt.locator("summary").click()
        interrupt.locator("input[name=reason]").fill("runaway")
        t0 = time.monotonic()
        interrupt.get_by_role("button", name="Interrupt run").click()
        expect(page.locator("#run-header .badge").first).to_have_text("interrupted", timeout=30_000)
        stop_ms = (time.monotonic() - t0) * 1000
        dom.append(_dom_nodes(page))
        shot(page, "9-busy-run-interrupted")
        timeline_items = page.locator("#timeline-events > li[data-seq]").count()
        cards = page.locator("#tool-call-cards > article").count()
    finally:
        web.close()

    run.refresh_from_db()
    print(
        f"\nbusy run page ({platform.node()}, {os.cpu_count()} CPUs, "
        f"{'postgres' if 'postgres' in os.environ.get('DATABASE_URL', '') else 'sqlite'}), "
        f"watched {watched:.1f} s, run seq {seq_shown} when stopped:\n"
        f"  click 'Rollback…' → confirmation visible: p50 {_pct(clicks, 0.5):.0f} ms, "
        f"p95 {_pct(clicks, 0.95):.0f} ms, max {max(clicks):.0f} ms ({len(clicks)} clicks)\n"
        f"  the same in the page (input event → next frame): p50 {_pct(in_page, 0.5):.0f} ms, "
        f"p95 {_pct(in_page, 0.95):.0f} ms, max {max(in_page):.0f} ms\n"
        f"  click 'Interrupt run' → header says interrupted: {stop_ms:.0f} ms\n"
        f"  the page's main thread while watched, ms per second: busy "
        f"{busy['TaskDuration'] * 1000 / watched:.0f}, script "
        f"{busy['ScriptDuration'] * 1000 / watched:.0f}, style "
        f"{busy['RecalcStyleDuration'] * 1000 / watched:.0f}, layout "
        f"{busy['LayoutDuration'] * 1000 / watched:.0f}\n"
        f"  acknowledgements sent by the page: {sum(map(len, acks_by_socket))}\n"
        f"  websocket frames: {len(frames)}, bytes p50 {statistics.median(frames):.0f}, "
        f"max {max(frames)}, total {sum(frames)}\n"
        f"  DOM nodes: start {dom[0]}, max {max(dom)}, end {dom[-1]}; "
        f"timeline items {timeline_items}, tool call cards {cards}"
    )
    for path, (start, end, sizes) in others.items():
        print(
            f"  {path}: DOM nodes {start} → {end}; {len(sizes)} frames in 5 s, "
            f"max {max(sizes, default=0)} bytes"
        )
    assert run.status == RunStatus.INTERRUPTED
    assert Run.objects.get(id=run.id).cancel_reason == "runaway"
    assert len(clicks) == CLICKS
    # The page says what it has swapped (runs/consumers.py FLOW_WINDOW), in order.
    for acks in acks_by_socket:
        assert acks == sorted(acks) and all(0 <= a <= len(frames) for a in acks), acks
    # A socket that stayed open acknowledged from 0 on, frame after frame.
    assert any(acks[:1] == [0] and len(acks) > 1 for acks in acks_by_socket), acks_by_socket
    assert max(dom) < MAX_DOM_NODES, dom
    assert max(frames) < MAX_FRAME_BYTES, sorted(frames)[-5:]
    assert timeline_items <= 201 and cards <= 200
    for _start, end, sizes in others.values():
        # A changed region is a frame of its own (the thread's checkpoint history, ~12 KB,
        # is the biggest); the list pushes changed rows.
        assert max(sizes, default=0) < MAX_FRAME_BYTES and end < MAX_DOM_NODES
