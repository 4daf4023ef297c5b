"""The run page's Deliveries section in a real browser: a webhook that keeps failing shows as
retrying with its last error, and turns to sent without a reload once the receiver answers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.models import Delivery
from tests.e2e.test_browser import ARTIFACTS, Browser, browser, expect  # noqa: F401 - fixture
from tests.helpers import wait_for
from tests.test_webhooks import Receiver

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_a_failing_webhook_shows_retrying_then_sent_without_a_reload(
    browser: Any,  # noqa: F811 - the fixture
    site_factory: Callable[..., Any],
    receiver: Receiver,
    reviewer: User,
    settings: Any,
) -> None:
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = True  # this process creates the run
    healthy = threading.Event()
    original = receiver.server.RequestHandlerClass.do_POST  # type: ignore[attr-defined]

    def fails_until_healthy(handler: Any) -> None:
        receiver.replies = [] if healthy.is_set() else [500]
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = fails_until_healthy  # type: ignore[attr-defined]
    site = site_factory(
        RUNS_WEBHOOK_ALLOW_PRIVATE="1",
        RUNS_WEBHOOK_BACKOFF_SECONDS="0.5",
        RUNS_WEBHOOK_BACKOFF_MAX_SECONDS="1",
        RUNS_WEBHOOK_MAX_ATTEMPTS="100",
        RUNS_POLL_SECONDS="0.2",
    )
    thread = services.thread_create()
    run = services.run_create(
        agent_id="echo", actor="e2e", thread_id=thread.id, input="hi", webhook=receiver.url
    )
    wait_for(lambda: Delivery.objects.filter(status="retrying").exists(), timeout=20)

    web = Browser(browser, site.url)
    try:
        page = web.page(reviewer, path=f"/runs/{run.id}/")
        region = page.locator("#run-deliveries")
        expect(region).to_be_visible()
        expect(region).to_contain_text("retrying")
        expect(region).to_contain_text("HTTP 500")
        healthy.set()
        expect(region).to_contain_text("sent", timeout=20_000)  # its own refresh, no reload
        expect(region).not_to_contain_text("retrying")
        page.screenshot(path=str(ARTIFACTS / "webhook_deliveries.png"), full_page=True)
        assert web.errors == []
    finally:
        web.close()
    sent = Delivery.objects.get()
    assert sent.status == "sent" and sent.attempts >= 2
