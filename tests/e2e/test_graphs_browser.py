"""A LangGraph graph reviewed in the dashboard: its interrupt waits in the inbox, a reviewer
approves it in a real browser, and the graph runs its tool and finishes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from runs.models import Run, RunStatus
from tests.e2e import test_browser
from tests.e2e.test_browser import ARTIFACTS, Browser, expect, live, shot
from tests.e2e.test_graphs import GRAPHS
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e]


# test_browser's module-scoped chromium, under a name of this module.
chromium = pytest.fixture(scope="module", name="chromium")(test_browser.browser.__wrapped__)


@pytest.fixture
def graph_web(chromium: Any, site_factory: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    site = site_factory(RUNS_GRAPHS=GRAPHS, RUNS_POLL_SECONDS="0.2")
    b = Browser(chromium, site.url)
    yield b, site
    b.close()
    (ARTIFACTS / f"{request.node.name}.server.log").write_text(site.output())
    assert b.errors == [], b.errors


def test_a_reviewer_approves_a_graphs_interrupt_in_the_inbox(
    graph_web: Any, reviewer: User
) -> None:
    web, site = graph_web
    page = web.page(reviewer, path="/inbox/")
    live(page)
    with httpx.Client(base_url=site.url + "/api", timeout=30) as api:
        tid = api.post("/threads", json={}).json()["thread_id"]
        run_id = api.post(
            f"/threads/{tid}/runs",
            json={
                "assistant_id": "tools",
                "input": {"messages": [{"role": "user", "content": "refund A-7"}]},
            },
        ).json()["run_id"]
    row = page.locator(f"#inbox-row-{run_id}")
    expect(row).to_contain_text("issue_refund", timeout=20_000)
    expect(row).to_contain_text('order_id="A-7"')
    row.get_by_role("button", name="Approve").click()
    expect(row.locator(".c-age .badge")).to_have_text("success", timeout=20_000)
    shot(page, "graph-inbox-approved-success")
    wait_for(lambda: Run.objects.filter(id=run_id, status=RunStatus.SUCCESS).exists())
    messages = Run.objects.get(id=run_id).output["messages"]
    assert messages[-2]["content"] == "refunded 12.5 on A-7"  # the tool ran after the approval
