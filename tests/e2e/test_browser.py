"""The dashboard in a real browser (Playwright driving Debian's chromium) against a live Daphne
with its embedded worker: decisions, live updates across browsers, bulk cancel, the answer form,
and untrusted tool arguments. Each test saves a screenshot of its final state in test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.models import AuditEntry, Run, RunStatus, ToolCall, ToolCallStatus
from tests.helpers import ROOT, wait_for

pytestmark = [pytest.mark.e2e]

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless=new",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = shutil.which("chromium")
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed")
    # Playwright's sync API keeps an asyncio loop on this thread, which Django takes for async
    # code; the test's database calls are plain synchronous ones.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def session_cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


class Browser:
    """Pages of signed-in users on the live site; every page records dialogs and JS errors."""

    def __init__(self, chromium: Any, url: str) -> None:
        self.chromium = chromium
        self.url = url
        self.contexts: list[Any] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []

    def page(self, user: User | None = None, path: str = "/", width: int = 1280) -> Any:
        context = self.chromium.new_context(
            base_url=self.url, viewport={"width": width, "height": 900}
        )
        self.contexts.append(context)
        if user is not None:
            context.add_cookies(
                [{"name": "sessionid", "value": session_cookie(user), "url": self.url}]
            )
        page = context.new_page()
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.goto(path)
        return page

    def close(self) -> None:
        for context in self.contexts:
            context.close()


@pytest.fixture
def web(browser: Any, live_runsite: Any, request: pytest.FixtureRequest) -> Iterator[Browser]:
    b = Browser(browser, live_runsite.url)
    yield b
    b.close()
    # The server's log next to the screenshots: the first thing to read when a test fails.
    (ARTIFACTS / f"{request.node.name}.server.log").write_text(live_runsite.output())
    assert b.errors == [], b.errors


def live(page: Any) -> None:
    """Wait until the page's websocket is open."""
    expect(page.locator("body")).to_have_attribute("data-live", "up", timeout=10_000)


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def refund_run(order_id: str) -> Run:
    thread = services.thread_create(metadata={"resource_id": "e2e"})
    return services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": order_id, "amount": 42.5},
        actor="e2e",
    )


def wait_status(run: Run, status: str, timeout: float = 20) -> Run:
    wait_for(lambda: Run.objects.filter(id=run.id, status=status).exists(), timeout=timeout)
    return Run.objects.get(id=run.id)


def waiting_call(run: Run) -> ToolCall:
    return ToolCall.objects.get(
        run=run, status__in=[ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT]
    )


def test_a_reviewer_approves_in_the_inbox_and_sees_success_without_reloading(
    web: Browser, reviewer: User
) -> None:
    page = web.page(path="/accounts/login/?next=/inbox/")
    page.fill("#id_username", "rita")
    page.fill("#id_password", "rita")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{web.url}/inbox/")
    live(page)
    page.evaluate("window.__sameDocument = true")

    run = refund_run("E2E-1")  # suspends on issue_refund; its row arrives over the websocket
    row = page.locator(f"#inbox-row-{run.id}")
    expect(row).to_contain_text("issue_refund", timeout=20_000)
    expect(row).to_contain_text('order_id="E2E-1"')  # jsonb may reorder keys
    expect(row).to_contain_text("amount=42.5")
    row.get_by_role("button", name="Approve").click()

    expect(row.locator(".c-age .badge")).to_have_text("success", timeout=20_000)
    expect(row).to_contain_text("approved by rita")
    expect(page.locator("#inbox-total")).to_have_text("0 waiting runs")
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    shot(page, "1-inbox-approved-success")
    assert Run.objects.get(id=run.id).status == RunStatus.SUCCESS
    assert AuditEntry.objects.get(run_id=run.id, action="approve").actor == "rita"


@pytest.mark.every_server
def test_a_decline_in_one_browser_shows_in_the_other_and_disables_its_approve(
    web: Browser, reviewer: User, reviewer2: User
) -> None:
    run = wait_status(refund_run("E2E-2"), RunStatus.SUSPENDED)
    tc = waiting_call(run)
    rita = web.page(reviewer, f"/runs/{run.id}/")
    rob = web.page(reviewer2, f"/runs/{run.id}/")
    live(rita)
    live(rob)
    robs_card = rob.locator(f"#tc-{tc.pk}")
    expect(robs_card.locator("button[data-act=approve]")).to_be_enabled()

    ritas_card = rita.locator(f"#tc-{tc.pk}")
    ritas_card.locator("summary", has_text="Decline…").click()
    ritas_card.locator("textarea[name=reason]").fill("Order was already refunded")
    ritas_card.get_by_role("button", name="Decline", exact=True).click()

    expect(robs_card.locator("[data-decision]")).to_contain_text("Declined by rita", timeout=10_000)
    expect(robs_card).to_contain_text("Order was already refunded")
    expect(robs_card.locator("button[data-act=approve]")).to_be_disabled()
    expect(robs_card.locator("[data-note]")).to_have_text("Already declined by rita.")
    shot(rob, "2-other-browser-sees-decline")
    assert ToolCall.objects.get(id=tc.id).decided_by == "rita"


def check_on_a_live_list(page: Any, selector: str) -> None:
    """Tick a box in rows that pushes rewrite 10 times a second: a row's text changing between
    Playwright's stability check and its click can move the box by a pixel and the click miss
    it ("did not change its state"). Clicked again then; a box a push unticks still fails."""
    from playwright.sync_api import Error

    for attempt in range(3):
        try:
            page.check(selector)
            return
        except Error as missed:
            if "did not change its state" not in str(missed) or attempt == 2:
                raise


def test_support_bulk_rolls_back_running_slow_runs_and_they_disappear(
    web: Browser, support: User
) -> None:
    runs = [
        services.run_create(agent_id="slow", input={"steps": 500, "delay_ms": 100}, actor="e2e")
        for _ in range(3)
    ]
    keep = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="e2e")
    for run in runs:
        wait_status(run, RunStatus.RUNNING)
    page = web.page(support, "/runs/?status=running&status=pending")
    live(page)
    for run in runs:
        check_on_a_live_list(page, f"#sel-{run.id}")
    for run in runs:  # a push re-rendering a row keeps its box as the user left it
        expect(page.locator(f"#sel-{run.id}")).to_be_checked()
    page.select_option("#bulk-action", "rollback")
    page.get_by_role("button", name="Cancel selected…").click()
    panel = page.locator("#bulk-panel")
    expect(panel).to_contain_text("Roll back 3 runs?")
    expect(panel).to_contain_text("3 running")
    panel.locator("button[data-confirm-bulk]").click()
    expect(panel).to_contain_text("Rolled back 3 runs.")  # running ones too: at once

    for run in runs:
        expect(page.locator(f"#run-row-{run.id}")).to_have_count(0, timeout=20_000)
    expect(page.locator(f"#run-row-{keep.id}")).to_have_count(1)
    shot(page, "3-bulk-rollback-rows-gone")
    assert not Run.objects.filter(id__in=[r.id for r in runs]).exists()
    assert AuditEntry.objects.filter(action="cancel_rollback").count() == 3


def test_the_weather_answer_form_rejects_a_missing_city_and_accepts_a_valid_one(
    web: Browser, reviewer: User
) -> None:
    run = services.run_create(agent_id="weather", input={}, actor="e2e")
    run = wait_status(run, RunStatus.SUSPENDED)
    tc = waiting_call(run)
    page = web.page(reviewer, f"/runs/{run.id}/")
    live(page)
    card = page.locator(f"#tc-{tc.pk}")
    card.get_by_role("button", name="Send answer").click()
    error = card.locator(".field.has-error")
    expect(error.locator(".error")).to_have_text("This field is required.")
    expect(error.locator("input[name=f_city]")).to_be_visible()
    assert waiting_call(run).status == ToolCallStatus.AWAITING_INPUT

    card.locator("input[name=f_city]").fill("Lisbon")
    card.get_by_role("button", name="Send answer").click()
    expect(page.locator("#run-header .badge").first).to_have_text("success", timeout=20_000)
    expect(page.locator("#run-io")).to_contain_text("Lisbon", timeout=10_000)
    shot(page, "4-weather-answered")
    assert Run.objects.get(id=run.id).output["city"] == "Lisbon"


def test_an_xss_payload_in_tool_arguments_renders_as_text(web: Browser, reviewer: User) -> None:
    inbox = web.page(reviewer, "/inbox/")
    live(inbox)
    run = refund_run(XSS)  # its row reaches the inbox as a websocket push
    row = inbox.locator(f"#inbox-row-{run.id}")
    expect(row).to_contain_text("<script>alert(2)</script>", timeout=20_000)
    assert inbox.locator("img[src=x]").count() == 0

    page = web.page(reviewer, f"/runs/{run.id}/")
    live(page)
    card = page.locator(f"#tc-{waiting_call(run).pk}")
    expect(card.locator("pre.json")).to_contain_text('<img src=x onerror=\\"alert(1)\\">')
    card.get_by_role("button", name="Approve").click()  # more pushes carrying the arguments
    expect(page.locator("#run-header .badge").first).to_have_text("success", timeout=20_000)
    expect(page.locator("#timeline-events")).to_contain_text("<script>alert(2)</script>")
    # A timeline row's data is fetched when the row is opened, escaped like the rest.
    event = page.locator("#timeline-events li.ev-tool_call").first
    event.locator("summary").click()
    expect(event.locator("pre.json")).to_contain_text('<img src=x onerror=\\"alert(1)\\">')
    shot(page, "5-xss-as-text")
    for p in (inbox, page):
        assert p.locator("img[src=x]").count() == 0
        assert p.evaluate("typeof window.__xss") == "undefined"
    assert web.dialogs == []  # no alert() ever ran


def test_the_inbox_works_by_keyboard_on_a_narrow_screen(web: Browser, reviewer: User) -> None:
    run = wait_status(refund_run("E2E-N"), RunStatus.SUSPENDED)
    page = web.page(reviewer, "/inbox/", width=420)
    live(page)
    row = page.locator(f"#inbox-row-{run.id}")
    expect(row).to_be_visible()
    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    shot(page, "6a-inbox-narrow-help")
    page.keyboard.press("Escape")
    page.keyboard.press("j")
    expect(row).to_have_class("row selected")
    page.keyboard.press("d")  # opens the row's decline box and focuses it
    expect(row.locator("textarea[name=reason]")).to_be_focused()
    page.keyboard.type("Duplicate request")
    page.keyboard.press("Enter")
    expect(row.locator("[data-decision]")).to_have_text("declined", timeout=10_000)
    expect(page.locator("#inbox-total")).to_have_text("0 waiting runs")  # pushed
    expect(page.locator("#nav-inbox-count")).to_have_text("0")
    shot(page, "6b-inbox-narrow-declined-by-keyboard")
    tc = ToolCall.objects.get(run=run, tool_name="issue_refund")
    assert (tc.status, tc.decision_reason) == (ToolCallStatus.DECLINED, "Duplicate request")
