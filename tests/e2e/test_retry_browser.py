"""Retry in a real browser (Playwright + Debian's chromium) against a live Daphne with its embedded
worker: "Retry…" on a failed run's page with an edited input, and "Retry selected…" on the list."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.models import AuditEntry, Run, RunStatus
from tests.e2e.test_browser import (  # noqa: F401 (fixtures)
    Browser,
    browser,
    expect,
    live,
    shot,
    wait_status,
    web,
)
from tests.helpers import wait_for

pytestmark = [pytest.mark.e2e]


def failed_slow_run() -> Run:
    """A run that ended (interrupted) with an input the agent's schema accepts."""
    run = services.run_create(
        agent_id="slow", input={"steps": 1, "delay_ms": 0}, after_seconds=3600, actor="e2e"
    )
    services.run_cancel(run=run, action="interrupt", actor="e2e")
    return Run.objects.get(id=run.id)


def test_support_retries_a_run_with_edited_input_from_its_page(
    web: Browser,  # noqa: F811
    support: User,
    reviewer: User,
) -> None:
    run = failed_slow_run()
    watcher = web.page(reviewer, f"/runs/{run.id}/")  # someone else looking at the same run
    live(watcher)
    expect(watcher.locator("#run-retry")).to_have_count(0)  # reviewers cannot retry
    page = web.page(support, f"/runs/{run.id}/")
    live(page)
    page.get_by_text("Retry…").click()
    editor = page.locator("#retry-input")
    assert '"steps": 1' in editor.input_value()
    # An input the agent's schema refuses: the form says why, and nothing is created.
    editor.fill('{"steps": "many"}')
    page.get_by_role("button", name="Retry run").click()
    expect(page.locator("#run-retry [data-retry-error]")).to_contain_text("steps")
    assert Run.objects.count() == 1
    expect(page.locator("#retry-input")).to_have_value('{"steps": "many"}')
    page.locator("#retry-input").fill('{"steps": 2, "delay_ms": 0}')
    page.get_by_role("button", name="Retry run").click()
    # The browser lands on the new run, which says what it retries and runs to the end.
    new = wait_for_retry(run)
    page.wait_for_url(f"**/runs/{new.id}/")
    expect(page.locator("[data-retry-of] a")).to_have_attribute("href", f"/runs/{run.id}/")
    # The other page shows the link without a reload (the original's change is pushed).
    expect(watcher.locator("[data-retried-as] a")).to_have_attribute("href", f"/runs/{new.id}/")
    wait_status(new, RunStatus.SUCCESS)
    expect(page.locator("#run-header")).to_contain_text("success", timeout=20_000)
    shot(page, "retry-1-new-run")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator("[data-retried-as] a")).to_have_attribute("href", f"/runs/{new.id}/")
    assert Run.objects.get(id=new.id).output == {"steps": 2}
    assert AuditEntry.objects.get(action="retry").actor == support.username


def test_support_retries_selected_runs_from_the_list(
    web: Browser,  # noqa: F811
    support: User,
) -> None:
    runs = [failed_slow_run() for _ in range(2)]
    page = web.page(support, "/runs/?status=interrupted")
    live(page)
    for run in runs:
        page.check(f"#sel-{run.id}")
    page.get_by_role("button", name="Retry selected…").click()
    panel = page.locator("#bulk-panel")
    expect(panel).to_contain_text("Retry 2 runs?")
    panel.locator("button[data-confirm-bulk]").click()
    expect(panel).to_contain_text("Retried 2 runs.")
    shot(page, "retry-2-bulk")
    retries = Run.objects.filter(retry_of__in=[r.id for r in runs])
    assert retries.count() == 2
    for new in retries:
        wait_status(new, RunStatus.SUCCESS)


def wait_for_retry(run: Run) -> Run:
    wait_for(lambda: Run.objects.filter(retry_of=run).exists(), timeout=20)
    return Run.objects.get(retry_of=run)
