"""Search in a real browser: type words into the top bar and see the matching runs with the
words highlighted; paste the start of a run id and land on the run; save the search as a view
and find it, with its count, in the navigation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.models import Run, RunStatus
from tests.e2e import test_browser
from tests.e2e.test_browser import ARTIFACTS, Browser, expect, shot
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e]

# test_browser's module-scoped chromium, under a name of this module.
chromium = pytest.fixture(scope="module", name="chromium")(test_browser.browser.__wrapped__)


@pytest.fixture
def search_web(
    chromium: Any, live_runsite: Any, request: pytest.FixtureRequest
) -> Iterator[Browser]:
    b = Browser(chromium, live_runsite.url)
    yield b
    b.close()
    (ARTIFACTS / f"{request.node.name}.server.log").write_text(live_runsite.output())
    assert b.errors == [], b.errors


def finished_echo(input: Any) -> Run:
    run = services.run_create(agent_id="echo", input=input, actor="e2e")
    wait_for(lambda: Run.objects.filter(id=run.id, status=RunStatus.SUCCESS).exists(), timeout=20)
    return run


def test_support_finds_runs_by_a_word_and_sees_it_highlighted(
    search_web: Browser, support: User
) -> None:
    flamingo = finished_echo({"note": "the customer saw a <b>flamingo</b> at the depot"})
    other = finished_echo({"note": "nothing to see"})
    page = search_web.page(support, "/")
    box = page.get_by_role("searchbox", name="Search runs")
    box.fill("flamingo")
    box.press("Enter")
    page.wait_for_url("**/runs/?q=flamingo")
    row = page.locator(f"#run-row-{flamingo.id}")
    expect(row).to_be_visible()
    expect(row.locator("mark").first).to_have_text("flamingo")  # input and output both match
    expect(row.locator("[data-match]")).to_contain_text("at the depot")
    assert page.locator(f"#run-row-{other.id}").count() == 0
    # The input's tags are never markup: text on SQLite, dropped by ts_headline on PostgreSQL.
    assert page.locator("#runs-rows b").count() == 0
    shot(page, "search-highlighted")

    # Save the search as a view; it is listed in the navigation with its count.
    page.get_by_text("Save view…").click()
    page.get_by_label("Name").fill("Flamingo sightings")
    page.get_by_role("button", name="Save", exact=True).click()
    expect(page.locator(".flash")).to_contain_text("Saved view")
    page.locator(".nav-views summary").click()
    entry = page.locator("#nav-views li", has_text="Flamingo sightings")
    expect(entry.locator(".view-count")).to_have_text("1")
    shot(page, "search-saved-view-in-nav")


def test_pasting_the_start_of_a_run_id_lands_on_the_run(search_web: Browser, support: User) -> None:
    run = finished_echo({"note": "jump here"})
    page = search_web.page(support, "/runs/")
    box = page.get_by_role("searchbox", name="Search runs")
    box.fill(str(run.id)[:13])
    box.press("Enter")
    page.wait_for_url(f"**/runs/{run.id}/")
    expect(page.locator("#run-header")).to_contain_text(str(run.id))
    shot(page, "search-id-jump")
