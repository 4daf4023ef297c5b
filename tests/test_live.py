"""Websocket consumers: who may connect, which sockets hear a committed change, what they get."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.consumers import RunsConsumer
from runs.models import Run, RunStatus, ToolCallStatus
from runsite.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True)]

XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def connect(
    path: str, user: User | None = None, origin: str = "http://127.0.0.1"
) -> tuple[WebsocketCommunicator, bool]:
    headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1")]
    if user is not None:
        cookie = await database_sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


async def receive_until(
    communicator: WebsocketCommunicator, predicate: Callable[[str], bool], timeout: float = 5.0
) -> str:
    """The first push matching `predicate` (other processes may publish on a shared Redis)."""
    end = time.monotonic() + timeout
    seen = []
    while time.monotonic() < end:
        try:
            text = await communicator.receive_from(timeout=max(0.05, end - time.monotonic()))
        except TimeoutError:
            break
        if predicate(text):
            return text
        seen.append(text[:200])
    raise AssertionError(f"no matching push within {timeout}s; got {seen}")


async def receive_all_until(
    communicator: WebsocketCommunicator, predicate: Callable[[str], bool], timeout: float = 8.0
) -> str:
    """Pushes received until, together, they match `predicate` (batches may split a change)."""
    end = time.monotonic() + timeout
    received = ""
    while time.monotonic() < end:
        try:
            received += await communicator.receive_from(timeout=max(0.05, end - time.monotonic()))
        except TimeoutError:
            break
        if predicate(received):
            return received
    raise AssertionError(f"pushes did not match within {timeout}s: {received[-2000:]}")


def db(fn: Callable[..., Any]) -> Callable[..., Any]:
    return database_sync_to_async(fn)


def refund_run(order_id: str = "A-1") -> Run:
    thread = services.thread_create(metadata={"resource_id": "acme"})
    return services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": order_id, "amount": 5.0},
        actor="t",
    )


def suspended_refund(drain: Any, order_id: str = "A-1") -> Run:
    run = refund_run(order_id)
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def pending_echo() -> Run:
    return services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")


# --- who may connect ------------------------------------------------------------------------


async def test_it_refuses_anonymous_sockets() -> None:
    run = await db(pending_echo)()
    for path in ["/ws/runs/?view=inbox", f"/ws/runs/{run.id}/", f"/ws/threads/{run.thread_id}/"]:
        communicator, connected = await connect(path)
        assert connected is False, path
        await communicator.disconnect()


async def test_it_refuses_a_socket_from_another_origin(reviewer) -> None:
    communicator, connected = await connect(
        "/ws/runs/?view=runs", reviewer, origin="http://evil.example"
    )
    assert connected is False
    await communicator.disconnect()


async def test_it_refuses_an_unknown_view(reviewer) -> None:
    communicator, connected = await connect("/ws/runs/?view=nope", reviewer)
    assert connected is False
    await communicator.disconnect()


# --- which sockets hear a change ------------------------------------------------------------


async def test_a_committed_change_reaches_the_runs_group_and_that_run_only(support) -> None:
    run_a, run_b = await db(pending_echo)(), await db(pending_echo)()
    listing, ok1 = await connect("/ws/runs/?view=runs", support)
    page_a, ok2 = await connect(f"/ws/runs/{run_a.id}/?seq={run_a.last_seq}", support)
    page_b, ok3 = await connect(f"/ws/runs/{run_b.id}/?seq={run_b.last_seq}", support)
    assert ok1 and ok2 and ok3
    try:
        await db(services.run_cancel)(run=run_a, action="interrupt", actor=support, reason="x")
        row = await receive_until(listing, lambda t: f'id="run-row-{run_a.id}"' in t)
        assert "s-interrupted" in row
        header = await receive_until(page_a, lambda t: 'id="run-header"' in t)
        assert "s-interrupted" in header
        seq = int(re.search(r'id="run-header"[^>]*data-seq="(\d+)"', header).group(1))
        assert seq > run_a.last_seq  # every push carries the run's event number
        assert await page_b.receive_nothing(timeout=0.6)
    finally:
        for communicator in (listing, page_a, page_b):
            await communicator.disconnect()


async def test_the_runs_list_inserts_new_runs_and_drops_those_leaving_its_filter(support) -> None:
    old = await db(pending_echo)()
    listing, ok = await connect("/ws/runs/?view=runs&status=pending", support)
    assert ok
    try:
        new = await db(pending_echo)()
        row = await receive_until(listing, lambda t: f'id="run-row-{new.id}"' in t)
        assert 'data-insert-into="runs-rows" data-insert-at="0"' in row
        assert re.search(r'id="runs-total"[^>]*>2 runs<', row)
        await db(services.run_cancel)(run=old, action="interrupt", actor=support)
        gone = await receive_until(listing, lambda t: f'id="run-row-{old.id}"' in t)
        assert f'<div id="run-row-{old.id}" hx-swap-oob="delete"' in gone
        assert re.search(r'id="runs-total"[^>]*>1 run<', gone)
    finally:
        await listing.disconnect()


async def test_a_list_told_to_resync_shows_what_changed_while_it_heard_nothing(
    support, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes whose messages were lost (the hub's subscription was down: runs/hub.py) reach
    the page when its hub says to resync: a run queued meanwhile is inserted, a run rolled
    back meanwhile is removed, read from the database."""
    from runs import live
    from runs.hub import hub

    old = await db(pending_echo)()
    listing, ok = await connect("/ws/runs/?view=runs&status=pending", support)
    assert ok
    try:
        assert await listing.receive_nothing(timeout=0.3)
        since = time.time()
        monkeypatch.setattr(live, "publish", lambda change: None)  # every message lost
        new = await db(pending_echo)()
        await db(services.run_cancel)(run=old, action="rollback", actor=support)
        assert await listing.receive_nothing(timeout=0.3)
        hub().resync(since)
        pushed = await receive_all_until(
            listing,
            lambda t: (
                f'id="run-row-{new.id}"' in t
                and f'<div id="run-row-{old.id}" hx-swap-oob="delete"' in t
            ),
        )
        assert 'data-insert-into="runs-rows" data-insert-at="0"' in pushed
    finally:
        await listing.disconnect()


async def three_alike_and_one_other(user: User) -> list[WebsocketCommunicator]:
    """Three sockets on one list (pending runs), one on another (every run)."""
    pages = []
    for path in ["/ws/runs/?view=runs&status=pending"] * 3 + ["/ws/runs/?view=runs"]:
        page, ok = await connect(path, user)
        assert ok
        pages.append(page)
    return pages


async def test_sockets_showing_the_same_list_hear_each_change_once_between_them(support) -> None:
    """The hub hands a change once to the sockets of a process that show the same list (their
    group), not once per socket; each socket still gets the row. A socket on another list hears
    through a group of its own, and the group stops listening when its last socket leaves."""
    from runs.hub import hub
    from runs.live import RUNS_GROUP

    before = hub().listening(RUNS_GROUP)
    pages = await three_alike_and_one_other(support)
    try:
        assert hub().listening(RUNS_GROUP) == before + 2
        new = await db(pending_echo)()
        for page in pages:
            await receive_until(page, lambda t: f'id="run-row-{new.id}"' in t)
    finally:
        for page in pages:
            await page.disconnect()
    assert hub().listening(RUNS_GROUP) == before


async def test_sockets_showing_the_same_list_share_one_read_when_told_to_resync(
    support, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a gap every socket is told to resync at once: the sockets of a process that show
    the same list (same view, filters, page and permissions) read what changed once between
    them, and each still gets the rows; a socket with other filters reads for itself."""
    from runs import live
    from runs.hub import hub

    reads: list[str] = []
    changed_since = RunsConsumer.changed_since

    def counted(self: RunsConsumer, since: float) -> list[dict[str, Any]]:
        reads.append(self.view)
        return changed_since(self, since)

    monkeypatch.setattr(RunsConsumer, "changed_since", counted)
    pages = await three_alike_and_one_other(support)
    try:
        for page in pages:
            assert await page.receive_nothing(timeout=0.2)
        since = time.time()
        monkeypatch.setattr(live, "publish", lambda change: None)  # every message lost
        new = await db(pending_echo)()
        hub().resync(since)
        for page in pages:
            await receive_until(page, lambda t: f'id="run-row-{new.id}"' in t)
        assert len(reads) == 2  # the three alike once, the other list once
    finally:
        for page in pages:
            await page.disconnect()


async def test_a_run_page_told_to_resync_shows_its_run_as_it_is_now(
    reviewer, support, drain, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runs import live
    from runs.hub import hub

    run = await db(suspended_refund)(drain, "S-1")
    page, ok = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", reviewer)
    assert ok
    try:
        await frames_until_quiet(page, quiet=0.3)
        since = time.time()
        monkeypatch.setattr(live, "publish", lambda change: None)
        await db(services.run_cancel)(run=run, action="interrupt", actor=support)
        assert await page.receive_nothing(timeout=0.3)
        hub().resync(since)
        text = await receive_until(page, lambda t: "s-interrupted" in t)
        assert f'data-seq="{run.last_seq + 1}"' in text
    finally:
        await page.disconnect()


async def test_pushes_are_rendered_for_the_viewer_and_escape_tool_arguments(
    reviewer, support, drain
) -> None:
    run = await db(refund_run)(XSS)
    as_reviewer, ok1 = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", reviewer)
    as_support, ok2 = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", support)
    assert ok1 and ok2
    try:
        await db(drain)()  # the run suspends on issue_refund; its pushes carry the arguments
        for communicator, sees_approve in ((as_reviewer, True), (as_support, False)):
            text = await receive_all_until(
                communicator, lambda t: "s-awaiting_approval" in t and 'id="run-actions"' in t
            )
            assert ('data-act="approve"' in text) is sees_approve
            assert ("Rollback…" in text) is not sees_approve
            assert "<script>alert" not in text and "<img src=x" not in text
            assert "&lt;script&gt;alert(2)&lt;/script&gt;" in text
    finally:
        await as_reviewer.disconnect()
        await as_support.disconnect()


# --- the inbox ------------------------------------------------------------------------------


async def test_the_inbox_inserts_a_run_that_suspends_and_removes_it_once_decided(
    reviewer, drain
) -> None:
    inbox, ok = await connect(f"/ws/runs/?view=inbox&at={time.time()}", reviewer)
    assert ok
    try:
        run = await db(suspended_refund)(drain, "I-1")
        row = await receive_until(
            inbox, lambda t: f'id="inbox-row-{run.id}"' in t and "issue_refund" in t
        )
        assert 'data-insert-into="inbox-rows" data-insert-at="0"' in row
        assert re.search(r'id="inbox-total"[^>]*>1 waiting run<', row)
        await db(services.tool_call_approve)(run=run, actor=reviewer)
        gone = await receive_until(
            inbox, lambda t: f'id="inbox-row-{run.id}" hx-swap-oob="delete"' in t
        )
        assert re.search(r'id="inbox-total"[^>]*>0 waiting runs<', gone)
    finally:
        await inbox.disconnect()


async def test_the_inbox_hears_of_a_run_that_left_within_one_batch(reviewer, drain) -> None:
    run = await db(suspended_refund)(drain, "B-1")
    inbox, ok = await connect("/ws/runs/?view=inbox", reviewer)
    assert ok
    try:

        def approve_and_finish() -> None:
            services.tool_call_approve(run=run, actor=reviewer)
            drain()  # pending, running and success within one batch of the consumer

        await db(approve_and_finish)()
        gone = await receive_until(
            inbox, lambda t: f'id="inbox-row-{run.id}" hx-swap-oob="delete"' in t
        )
        assert re.search(r'id="inbox-total"[^>]*>0 waiting runs<', gone)
    finally:
        await inbox.disconnect()


async def test_the_inbox_keeps_following_a_run_its_reviewer_watches(reviewer, drain) -> None:
    run = await db(suspended_refund)(drain, "W-1")
    inbox, ok = await connect("/ws/runs/?view=inbox", reviewer)
    assert ok
    try:
        await inbox.send_to(text_data=json.dumps({"watch": str(run.id)}))
        await db(services.tool_call_approve)(run=run, actor=reviewer)
        await db(drain)()
        text = await receive_all_until(
            inbox,
            lambda t: (
                re.search(r'id="inbox-total"[^>]*>0 waiting runs<', t) is not None
                and re.search(
                    rf'id="inbox-row-{run.id}"[^>]*data-keep="1"[^>]*>.*?s-success', t, re.S
                )
                is not None
            ),
        )
        assert "approved" in text
    finally:
        await inbox.disconnect()


async def test_the_inbox_only_pushes_rows_matching_its_filters(reviewer, drain) -> None:
    inbox, ok = await connect("/ws/runs/?view=inbox&agent=weather", reviewer)
    assert ok
    try:
        run = await db(suspended_refund)(drain, "F-1")
        text = await receive_until(inbox, lambda t: f"inbox-row-{run.id}" in t)
        assert f'<div id="inbox-row-{run.id}" hx-swap-oob="delete"' in text
        assert re.search(r'id="inbox-total"[^>]*>0 waiting runs<', text)
    finally:
        await inbox.disconnect()


# --- a run page -----------------------------------------------------------------------------


async def test_a_run_page_gets_the_events_after_its_seq(reviewer, drain) -> None:
    run = await db(suspended_refund)(drain, "T-1")
    page, ok = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", reviewer)
    assert ok
    try:
        assert await page.receive_nothing(timeout=0.4)  # nothing new since the page rendered
        tc = await db(lambda: run.tool_calls.get(status=ToolCallStatus.AWAITING_APPROVAL))()
        await db(services.tool_call_decline)(
            run=run, actor=reviewer, tool_call_id=tc.tool_call_id, reason="no"
        )
        # A push is the changed regions (here: that card), then the new events in frames of
        # their own.
        card = await receive_until(page, lambda t: f'id="tc-{tc.pk}"' in t)
        assert "Declined</strong> by <strong>rita" in card
        text = await receive_until(page, lambda t: "data-after-seq" in t)
        assert f'data-after-seq="{run.last_seq}"' in text
        seqs = [int(s) for s in re.findall(r'<li data-seq="(\d+)"', text)]
        assert seqs and min(seqs) == run.last_seq + 1
    finally:
        await page.disconnect()


async def test_a_run_page_that_missed_changes_catches_up_on_connect(reviewer, drain) -> None:
    run = await db(suspended_refund)(drain, "C-1")
    page, ok = await connect(f"/ws/runs/{run.id}/?seq=2", reviewer)
    assert ok
    try:
        text = await receive_until(page, lambda t: "data-after-seq" in t)
        assert 'data-after-seq="2"' in text
        assert f'<li data-seq="{run.last_seq}"' in text
    finally:
        await page.disconnect()


async def test_a_run_page_hears_its_rollback(reviewer, support, drain) -> None:
    run = await db(suspended_refund)(drain, "R-1")
    page, ok = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", reviewer)
    assert ok
    try:
        await db(services.run_cancel)(run=run, action="rollback", actor=support)
        text = await receive_until(page, lambda t: "Run rolled back" in t)
        assert 'id="run-body" hx-swap-oob="true"' in text
    finally:
        await page.disconnect()


# --- flow control: a page that falls behind is held, then caught up ----------------------


async def frames_until_quiet(communicator: WebsocketCommunicator, quiet: float = 0.6) -> list[str]:
    """Every frame until none comes for `quiet` seconds (receive_nothing does not end the app
    as a receive that times out does)."""
    frames = []
    while not await communicator.receive_nothing(timeout=quiet):
        frames.append(await communicator.receive_from())
    return frames


async def test_a_run_page_behind_on_its_frames_is_held_then_caught_up(
    reviewer, drain, monkeypatch
) -> None:
    """A page that acknowledges (app.js) and has FLOW_WINDOW frames unacknowledged is sent
    nothing; what changed meanwhile comes as one catch-up push once it acknowledges."""
    monkeypatch.setattr("runs.consumers.FLOW_WINDOW", 1)
    run = await db(suspended_refund)(drain, "F-1")
    page, ok = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", reviewer)
    assert ok
    try:
        await page.send_to(text_data=json.dumps({"ack": 0}))
        assert await page.receive_nothing(timeout=0.4)
        tc = await db(lambda: run.tool_calls.get(status=ToolCallStatus.AWAITING_APPROVAL))()
        await db(services.tool_call_approve)(run=run, actor=reviewer)
        first = await frames_until_quiet(page)
        assert first and "s-success" not in "".join(first)
        # The run goes on to its end: the page, one frame behind, hears nothing of it.
        await db(drain)()
        await db(run.refresh_from_db)()
        assert run.status == RunStatus.SUCCESS
        assert await page.receive_nothing(timeout=0.6)
        # Acknowledgements that cannot be right change nothing.
        for wrong in (len(first) + 1, str(len(first)), -1, None, [1]):
            await page.send_to(text_data=json.dumps({"ack": wrong}))
        await page.send_to(text_data="not json")
        assert await page.receive_nothing(timeout=0.4)
        await page.send_to(text_data=json.dumps({"ack": len(first)}))
        caught_up = "".join(await frames_until_quiet(page, quiet=1.5))
        assert 'id="run-header"' in caught_up and "s-success" in caught_up
        assert f'<li data-seq="{run.last_seq}"' in caught_up
        assert f'id="tc-{tc.pk}"' not in "".join(first) or "Approved" in caught_up
    finally:
        await page.disconnect()


async def test_a_list_socket_held_by_its_page_leaves_the_others_of_its_group_alone(
    support, monkeypatch
) -> None:
    """Two sockets sharing the runs list's renders: the one whose page is behind waits, the
    other (a page that does not acknowledge is never held) gets every push; once the first
    acknowledges it gets every row it missed in one push of its own."""
    monkeypatch.setattr("runs.consumers.FLOW_WINDOW", 1)
    path = "/ws/runs/?view=runs&status=pending"
    held, ok1 = await connect(path, support)
    free, ok2 = await connect(path, support)
    assert ok1 and ok2
    try:
        await held.send_to(text_data=json.dumps({"ack": 0}))
        await asyncio.sleep(0.1)
        created = [await db(pending_echo)()]
        first = await frames_until_quiet(held)
        assert len(first) == 1 and f'id="run-row-{created[0].id}"' in first[0]
        for _ in range(4):
            created.append(await db(pending_echo)())
            await asyncio.sleep(0.1)
        assert await held.receive_nothing(timeout=0.5)
        everything = "".join(await frames_until_quiet(free))
        assert all(f'id="run-row-{run.id}"' in everything for run in created)
        await held.send_to(text_data=json.dumps({"ack": 1}))
        caught_up = "".join(await frames_until_quiet(held, quiet=1.5))
        assert all(f'id="run-row-{run.id}"' in caught_up for run in created[1:])
    finally:
        await held.disconnect()
        await free.disconnect()


# --- overview and thread pages --------------------------------------------------------------


async def test_the_overview_pushes_its_counts(reviewer, drain) -> None:
    overview, ok = await connect("/ws/runs/?view=overview", reviewer)
    assert ok
    try:
        await db(suspended_refund)(drain, "O-1")
        text = await receive_until(overview, lambda t: 'id="ov-counts"' in t, timeout=6)
        assert re.search(r'<span class="n">1</span><span class="l">suspended</span>', text)
        assert 'id="nav-inbox-count"' in text
    finally:
        await overview.disconnect()


async def test_a_thread_page_hears_its_runs(reviewer, drain) -> None:
    run = await db(refund_run)("TH-1")
    page, ok = await connect(f"/ws/threads/{run.thread_id}/", reviewer)
    assert ok
    try:
        await db(drain)()
        text = await receive_until(page, lambda t: 'id="thread-runs"' in t and "s-suspended" in t)
        assert str(run.id) in text
    finally:
        await page.disconnect()


# --- sockets of one view flush together and share renders ---------------------------------


async def test_sockets_of_one_list_flush_together_and_share_every_render(
    support, monkeypatch
) -> None:
    """Renders slower than the changes come, and a second socket connecting while the first
    renders: from the second's first change on, every render is sent to both (timed per
    socket, they fell out of step and each rendered every batch itself)."""
    renders: list[int] = []
    original = RunsConsumer.render_shared

    def counted(self: RunsConsumer, changes: list[dict[str, Any]]) -> tuple[Any, Any]:
        time.sleep(0.25)  # a render that takes a while, as under load
        html, state = original(self, changes)
        if html:
            renders.append(len(changes))
        return html, state

    monkeypatch.setattr(RunsConsumer, "render_shared", counted)
    monkeypatch.setattr(RunsConsumer, "batch_seconds", 0.2)
    path = "/ws/runs/?view=runs&status=pending"
    first, ok1 = await connect(path, support)
    created = [await db(pending_echo)()]
    await asyncio.sleep(0.05)
    second, ok2 = await connect(path, support)
    assert ok1 and ok2
    try:
        for _ in range(12):
            created.append(await db(pending_echo)())
            await asyncio.sleep(0.1)
        frames = []
        for communicator, expected in ((first, created), (second, created[1:])):
            received: list[str] = []
            while not all(f'id="run-row-{run.id}"' in "".join(received) for run in expected):
                received.append(await communicator.receive_from(timeout=5))
            frames.append(received)
        assert await first.receive_nothing(timeout=0.6)
        assert await second.receive_nothing(timeout=0.1)
    finally:
        await first.disconnect()
        await second.disconnect()
    assert len(frames[0]) >= 3
    # Every render but those before the second socket's first batch went to both.
    assert len(renders) <= max(len(frames[0]), len(frames[1])) + 1, (renders, frames)
    assert frames[0][-1] == frames[1][-1]


# --- what a push to a busy run's page carries --------------------------------------------


def test_a_run_push_carries_only_new_events_and_changed_cards(support, drain) -> None:
    from runs import selectors
    from runs.fragments import EVENTS_PER_FRAME, Fragments, RunPushState

    run = services.run_create(agent_id="slow", input={"steps": 30, "delay_ms": 0}, actor="t")
    drain()
    page = selectors.run_page(run.id, user=support)
    fragments = Fragments(support)
    sent = RunPushState(seq=page.run.last_seq - 40, checkpoint_step=page.checkpoints[1].step)
    frames = fragments.run_push(page, sent, with_io=False)
    # The regions first (cards the new events name may follow in frames of their own), then
    # 40 events in frames of at most EVENTS_PER_FRAME, oldest first, each continuing the one
    # before.
    appends = [f for f in frames if f.startswith('<ol id="timeline-events"')]
    assert frames[-len(appends) :] == appends
    events = [[int(s) for s in re.findall(r'<li data-seq="(\d+)"', f)] for f in appends]
    assert [len(e) for e in events] == [15, 15, 10] and EVENTS_PER_FRAME == 15
    afters = [int(re.search(r'data-after-seq="(\d+)"', f).group(1)) for f in appends]
    assert afters == [page.run.last_seq - 40, max(events[0]), max(events[1])]
    assert 'id="run-header"' in frames[0] and 'id="run-actions"' in frames[0]
    # One new checkpoint row, prepended; the count follows.
    assert 'id="run-checkpoint-rows" hx-swap-oob="afterbegin"' in frames[0]
    assert frames[0].count("<tr data-seq=") == 1
    assert sent.seq == page.run.last_seq

    # Nothing changed since: the next push is the header alone (no card, no event, no actions).
    again = fragments.run_push(page, sent, with_io=False)
    assert len(again) == 1 and 'id="run-header"' in again[0]
    assert "tc-" not in again[0] and "run-actions" not in again[0]
    assert "run-checkpoint-rows" not in again[0]


def test_a_run_that_steps_on_pushes_its_duration_and_event_count_not_its_header(
    support, drain
) -> None:
    """The header of a live run changes with every step only in two fields: those go alone,
    and the header goes whole again when anything else in it changed."""
    from runs import selectors
    from runs.fragments import Fragments, RunPushState

    run = suspended_refund(drain, "P-1")
    fragments = Fragments(support)
    page = selectors.run_page(run.id, user=support)
    sent = RunPushState(seq=page.run.last_seq)
    assert 'id="run-header"' in fragments.run_push(page, sent, with_io=False)[0]
    page.run.last_seq += 1  # a step later, the same run
    progress = fragments.run_push(page, sent, with_io=False)[0]
    assert 'id="run-header"' not in progress
    assert re.search(r'<dd id="run-duration" hx-swap-oob="true">', progress)
    assert f'<dd id="run-events" data-seq="{page.run.last_seq}" hx-swap-oob="true">' in progress
    assert len(progress.encode()) < 600
    page.run.lease_owner = "another-worker"  # shown in the header: it goes whole
    assert 'id="run-header"' in fragments.run_push(page, sent, with_io=False)[0]
    page.run.status = RunStatus.SUCCESS  # an ended run's header lists its retries: always whole
    first = fragments.run_push(page, sent, with_io=False)[0]
    again = fragments.run_push(page, sent, with_io=False)[0]
    assert 'id="run-header"' in first and 'id="run-header"' in again


def test_a_push_that_catches_up_on_many_cards_sends_small_frames(support, drain) -> None:
    """A page that missed a lot (a busy run, a slow socket) gets every changed card, each
    once, in frames the browser swaps one at a time: the header leads, no frame of several
    parts passes FRAME_BUDGET."""
    from runs import selectors
    from runs.fragments import FRAME_BUDGET, Fragments, RunPushState

    run = services.run_create(agent_id="slow", input={"steps": 60, "delay_ms": 0}, actor="t")
    drain()
    page = selectors.run_page(run.id, user=support)
    cards = {str(tc.pk) for tc in page.tool_calls}
    assert len(cards) > 20
    frames = Fragments(support).run_push(page, RunPushState(seq=1, card_tokens={}), with_io=True)
    assert 'id="run-header"' in frames[0]
    pushed = [pk for f in frames for pk in re.findall(r'<article id="tc-([^"]+)"', f)]
    assert sorted(pushed) == sorted(cards)
    assert len(frames) > 3
    for frame in frames:
        assert len(frame.encode()) <= FRAME_BUDGET or frame.count('<article id="tc-') <= 1


def test_a_run_push_after_more_events_than_the_window_makes_the_page_refetch(
    support, drain
) -> None:
    from runs import selectors
    from runs.fragments import Fragments, RunPushState

    run = services.run_create(agent_id="slow", input={"steps": 60, "delay_ms": 0}, actor="t")
    drain()
    page = selectors.run_page(run.id, user=support)  # the newest 100 events
    frames = Fragments(support).run_push(page, RunPushState(seq=1), with_io=False)
    timeline = "".join(f for f in frames if f.startswith('<ol id="timeline-events"'))
    first_after = int(re.search(r'data-after-seq="(\d+)"', timeline).group(1))
    # Past what the page shows (seq 1): the browser sees a gap and re-fetches its regions.
    assert first_after == page.events[-1].seq - 1 > 1


def test_a_batch_of_new_runs_on_the_runs_list_costs_five_statements(
    support, django_assert_num_queries
) -> None:
    """Rows (with their waiting calls and queue holders) double as the list's membership, the
    page's ids place them, and the list's total and the inbox count are one statement."""
    from django.http import QueryDict

    from runs import selectors

    consumer = RunsConsumer()
    consumer.user, consumer.scope = support, {"url_route": {"kwargs": {}}}
    consumer.params = QueryDict("view=runs")
    consumer.visibility = selectors.scope_for(support)
    consumer.prepare()
    new = [pending_echo() for _ in range(3)]
    changes = [
        {"run_id": str(r.id), "seq": r.last_seq, "status": "pending", "statuses": {"pending"}}
        for r in new
    ]
    with django_assert_num_queries(5):
        html = consumer.render(changes)
    for run in new:
        assert f'id="run-row-{run.id}"' in html
    assert re.search(r'id="runs-total"[^>]*>3 runs<', html)
    assert 'id="nav-inbox-count"' in html
