"""Tenant-scoped staff in a real browser: alice, bound to "acme", watches the runs list while
runs of acme and globex are created; only acme's arrive. carol (unbound) is the control."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.contrib.auth.models import Group, User

from runs import services
from runs.models import Run, StaffScope
from tests.e2e.test_browser import Browser, browser, expect, live, shot, web

pytestmark = [pytest.mark.e2e]

__all__ = ["browser", "web"]  # fixtures used by this module's tests


def staff_user(name: str, *resources: str) -> User:
    services.groups_ensure()
    user = User.objects.create_user(username=name, password=name, is_staff=True)
    user.groups.add(*Group.objects.filter(name__in=["Support", "Reviewers"]))
    for resource in resources:
        StaffScope.objects.create(user=user, resource_id=resource)
    return user


def queued_run(resource: str, site: Any = None) -> Run:
    """A run of `resource` queued an hour ahead (the server's worker leaves it pending). Given
    the live site, created through its API, so the server publishes it (without Redis the
    channel layer is per process)."""
    if site is None:
        thread = services.thread_create(metadata={"resource_id": resource})
        return services.run_create(
            agent_id="echo", thread_id=thread.id, input={}, after_seconds=3600, actor="e2e"
        )
    thread_id = httpx.post(
        f"{site.url}/api/threads", json={"metadata": {"resource_id": resource}}, timeout=10
    ).json()["thread_id"]
    response = httpx.post(
        f"{site.url}/api/threads/{thread_id}/runs",
        json={"assistant_id": "echo", "input": {}, "after_seconds": 3600},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return Run.objects.get(id=response.json()["run_id"])


SEEN_ROWS_JS = """
window.__seenRows = [];
new MutationObserver((mutations) => {
  for (const m of mutations) {
    for (const node of m.addedNodes) {
      if (node.nodeType !== 1) continue;
      const rows = [node, ...node.querySelectorAll("[id^=run-row-]")];
      for (const el of rows) if (el.id && el.id.startsWith("run-row-")) window.__seenRows.push(el.id);
    }
  }
}).observe(document.body, {childList: true, subtree: true});
"""


def test_a_bound_users_open_runs_list_gains_only_their_tenants_new_runs(
    web: Browser, live_runsite: Any
) -> None:
    alice = staff_user("alice", "acme")
    carol = staff_user("carol")
    mine = queued_run("acme")
    theirs = queued_run("globex")
    alice_page = web.page(alice, "/runs/")
    carol_page = web.page(carol, "/runs/")
    expect(alice_page.locator(f"#run-row-{mine.id}")).to_have_count(1)
    expect(alice_page.locator(f"#run-row-{theirs.id}")).to_have_count(0)
    expect(alice_page.locator("#runs-total")).to_have_text("1 run")
    live(alice_page)
    live(carol_page)
    # Every row ever added to alice's page, even one a later re-fetch would remove again.
    alice_page.evaluate(SEEN_ROWS_JS)

    # Another tenant's run first, then alice's own: once hers shows, the other was heard.
    globex_new = queued_run("globex", live_runsite)
    acme_new = queued_run("acme", live_runsite)
    expect(alice_page.locator(f"#run-row-{acme_new.id}")).to_have_count(1, timeout=15_000)
    expect(carol_page.locator(f"#run-row-{acme_new.id}")).to_have_count(1, timeout=15_000)
    expect(carol_page.locator(f"#run-row-{globex_new.id}")).to_have_count(1, timeout=15_000)
    expect(carol_page.locator("#runs-total")).to_have_text("4 runs")
    expect(alice_page.locator("#runs-total")).to_have_text("2 runs")
    expect(alice_page.locator(f"#run-row-{globex_new.id}")).to_have_count(0)
    seen = alice_page.evaluate("window.__seenRows")
    assert f"run-row-{acme_new.id}" in seen
    assert f"run-row-{globex_new.id}" not in seen
    assert str(globex_new.id) not in alice_page.content()
    assert str(theirs.id) not in alice_page.content()
    shot(alice_page, "tenant-runs-list-acme-only")
