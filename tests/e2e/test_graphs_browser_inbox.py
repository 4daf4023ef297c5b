"""A graph's Agent Inbox request in a real browser: the inbox shows its description as
Markdown and exactly its choices; Respond, Ignore and Accept resume three runs, and each graph
gets the HumanResponse it was sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from runs.models import Run, RunStatus
from tests.e2e import test_browser
from tests.e2e.test_browser import ARTIFACTS, Browser, expect, live, shot
from tests.graphs.inbox_choices import DEFAULT_ARGS
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e]

GRAPHS = json.dumps({"graphs": {"inbox_choices": "./tests/graphs/inbox_choices.py:graph"}})
DESCRIPTION = (
    "**Ann** asks about _order A-7_\n\n> Where is my refund?\n\n"
    '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">Send the reply?'
)

chromium = pytest.fixture(scope="module", name="chromium")(test_browser.browser.__wrapped__)


@pytest.fixture
def graph_web(chromium: Any, site_factory: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    site = site_factory(RUNS_GRAPHS=GRAPHS, RUNS_POLL_SECONDS="0.2")
    b = Browser(chromium, site.url)
    yield b, site
    b.close()
    (ARTIFACTS / f"{request.node.name}.server.log").write_text(site.output())
    assert b.errors == [], b.errors


def test_a_reviewer_responds_ignores_and_accepts_in_the_inbox(
    graph_web: Any, reviewer: User
) -> None:
    web, site = graph_web
    page = web.page(reviewer, path="/inbox/")
    live(page)
    run_ids = []
    with httpx.Client(base_url=site.url + "/api", timeout=30) as api:
        for _ in range(3):
            tid = api.post("/threads", json={}).json()["thread_id"]
            run = api.post(
                f"/threads/{tid}/runs",
                json={"assistant_id": "inbox_choices", "input": {"description": DESCRIPTION}},
            ).json()
            run_ids.append(run["run_id"])
    rows = [page.locator(f"#inbox-row-{run_id}") for run_id in run_ids]
    for row in rows:
        # Generous: the worker imports and compiles the graph on its first run.
        expect(row).to_contain_text("send_email", timeout=60_000)
    first = rows[0]
    # The description is Markdown, rendered and sanitised.
    expect(first.locator(".inbox-description strong")).to_have_text("Ann")
    expect(first.locator(".inbox-description em")).to_have_text("order A-7")
    expect(first.locator(".inbox-description blockquote")).to_contain_text("Where is my refund?")
    assert first.locator(".inbox-description script, .inbox-description img").count() == 0
    for name in ("Accept", "Respond…", "Ignore"):
        expect(first.get_by_text(name, exact=True)).to_be_visible()
    expect(first.get_by_role("link", name="Edit…")).to_be_visible()
    shot(page, "graph-inbox-agent-inbox-card")

    # One decision at a time, as a reviewer works down the inbox: each decided row stays on
    # screen and follows its run to the end.
    respond, ignore, accept = rows
    respond.get_by_text("Respond…", exact=True).click()
    respond.get_by_role("textbox", name="Response").fill("Wait for the invoice")
    respond.get_by_role("button", name="Send response").click()
    expect(respond.locator(".c-age .badge")).to_have_text("success", timeout=20_000)
    ignore.get_by_role("button", name="Ignore").click()
    expect(ignore.locator(".c-age .badge")).to_have_text("success", timeout=20_000)
    accept.get_by_role("button", name="Accept").click()
    expect(accept.locator(".c-age .badge")).to_have_text("success", timeout=20_000)
    shot(page, "graph-inbox-agent-inbox-decided")

    assert page.evaluate("window.pwned") is None
    wait_for(lambda: Run.objects.filter(id__in=run_ids, status=RunStatus.SUCCESS).count() == 3)
    responses = [Run.objects.get(id=run_id).output["response"] for run_id in run_ids]
    assert responses == [
        [{"type": "response", "args": "Wait for the invoice"}],
        [{"type": "ignore", "args": None}],
        [{"type": "accept", "args": {"action": "send_email", "args": DEFAULT_ARGS}}],
    ]
