"""Live updates in a real browser when the easy path is not there: the websocket is down (the
page polls and says so), and the change is made by a worker in another process (Redis)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.models import RunStatus
from tests.e2e.test_browser import Browser, browser, refund_run, shot, wait_status  # noqa: F401

pytestmark = [pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api").expect


def test_without_a_websocket_the_page_says_so_and_polls(
    browser: Any,  # noqa: F811
    live_runsite: Any,
    reviewer: User,
) -> None:
    web = Browser(browser, live_runsite.url)
    try:
        context = browser.new_context(base_url=live_runsite.url)
        web.contexts.append(context)
        page = context.new_page()
        # Every websocket is refused: the socket never opens.
        page.route_web_socket("**/ws/**", lambda ws: ws.close())
        from tests.e2e.test_browser import session_cookie

        context.add_cookies(
            [{"name": "sessionid", "value": session_cookie(reviewer), "url": live_runsite.url}]
        )
        page.goto("/inbox/")
        expect(page.locator("#live-banner")).to_be_visible(timeout=10_000)
        expect(page.locator("#live-banner")).to_contain_text("delayed")

        run = refund_run("POLL-1")
        # No push can come: the row arrives with the next 10 s poll.
        expect(page.locator(f"#inbox-row-{run.id}")).to_contain_text("issue_refund", timeout=25_000)
        expect(page.locator("#nav-inbox-count")).to_have_text("1")
        shot(page, "7-socket-down-banner-and-poll")
    finally:
        web.close()


@pytest.mark.postgres
@pytest.mark.every_server
def test_a_change_made_by_a_worker_process_reaches_the_browser(
    browser: Any,  # noqa: F811
    site_factory: Any,
    start_worker: Any,
    reviewer: User,
) -> None:
    if not os.environ.get("REDIS_URL"):
        pytest.skip("across processes the channel layer is Redis: set REDIS_URL")
    site = site_factory(embedded_worker=False)
    start_worker(concurrency=2)
    web = Browser(browser, site.url)
    try:
        run = wait_status(refund_run("X-PROC-1"), RunStatus.SUSPENDED)
        page = web.page(reviewer, f"/runs/{run.id}/")
        expect(page.locator("body")).to_have_attribute("data-live", "up", timeout=10_000)
        # Approved here, in the test process; executed by the worker process; seen live in
        # the browser through the Daphne process.
        services.tool_call_approve(run=run, actor=reviewer)
        expect(page.locator("#run-header .badge").first).to_have_text("success", timeout=20_000)
        expect(page.locator("#timeline-events")).to_contain_text("finished")
        shot(page, "8-worker-process-change-seen-live")
    finally:
        web.close()
