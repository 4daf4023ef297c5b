"""Context to decide, in a real browser: a reviewer reads the conversation and the tool's
description on the run page, approves with a comment, and sees the comment in the timeline
and the model's answer (which got the comment) in the conversation, without reloading."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from runs.models import AuditEntry, Run, RunStatus, ToolCall
from tests.e2e.test_browser import (  # noqa: F401
    Browser,
    browser,
    live,
    refund_run,
    shot,
    wait_status,
    waiting_call,
    web,
)

pytestmark = [pytest.mark.e2e]

expect = pytest.importorskip("playwright.sync_api").expect


def test_a_reviewer_reads_the_chat_and_approves_with_a_comment(
    web: Browser,  # noqa: F811
    reviewer: User,
) -> None:
    run = wait_status(refund_run("CTX-1"), RunStatus.SUSPENDED)
    tc = waiting_call(run)
    page = web.page(reviewer, f"/runs/{run.id}/")
    live(page)
    page.evaluate("window.__sameDocument = true")

    # The conversation so far, as chat turns: the input, the lookup and its result, the
    # refund the model asks for.
    chat = page.locator("#run-chat")
    turns = chat.locator("li.turn")
    expect(turns).to_have_count(4)
    expect(chat.locator("li.turn-user .bubble")).to_contain_text("CTX-1")
    expect(chat.locator("li.turn-assistant").last).to_contain_text("issue_refund")
    tool_turn = chat.locator("li.turn-tool").first
    expect(tool_turn).to_contain_text("lookup_order")
    tool_turn.locator("summary").click()
    expect(tool_turn.locator("pre.json")).to_contain_text('"delivered"')
    # The raw JSON stays one click away.
    chat.locator("details.raw > summary").click()
    chat.get_by_role("link", name="Show the state as JSON").click()
    expect(chat.locator("details.raw pre.json")).to_contain_text('"messages"')

    card = page.locator(f"#tc-{tc.pk}")
    expect(card.locator(".tool-description")).to_have_text(
        "Refund an amount on an order. Needs a human's approval."
    )
    shot(page, "review-context-before-approve")

    card.locator("form.inline input[name=comment]").fill("Goodwill: no return needed")
    card.locator("button[data-act=approve]").click()

    timeline = page.locator("#run-timeline")
    expect(timeline.locator("li.ev-decision")).to_contain_text(
        "issue_refund approved · “Goodwill: no return needed”", timeout=10_000
    )
    expect(card.locator("[data-decision]")).to_contain_text("Goodwill: no return needed")
    wait_status(run, RunStatus.SUCCESS)
    expect(page.locator("#run-header")).to_contain_text("success", timeout=10_000)
    # Once the run stopped, the conversation arrived again: the refund's result with the
    # reviewer's comment (the refund tool shares it with the model) and the final answer.
    expect(turns).to_have_count(6, timeout=10_000)
    refund_turn = chat.locator("li.turn-tool").last
    expect(refund_turn).to_contain_text("issue_refund")
    refund_turn.locator("summary").click()
    expect(refund_turn.locator("pre.json")).to_contain_text("Goodwill: no return needed")
    expect(chat.locator("li.turn-assistant").last).to_contain_text("reviewer_comment")
    assert page.evaluate("window.__sameDocument") is True  # no reload
    expect(page.locator("main")).not_to_contain_text("{#")
    shot(page, "review-context-after-approve")

    assert ToolCall.objects.get(id=tc.id).decision_comment == "Goodwill: no return needed"
    assert AuditEntry.objects.get(action="approve").reason == "Goodwill: no return needed"
    assert Run.objects.get(id=run.id).output["reviewer_comment"] == "Goodwill: no return needed"
