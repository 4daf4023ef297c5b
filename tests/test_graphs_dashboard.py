"""A graph's interrupt in the dashboard: an Agent Inbox request offers exactly the choices its
config allows and resumes the graph with the matching HumanResponse; any other value gets the
answer form (schema-driven when the interrupt declares a response_schema). Graph runs execute
in-process with `drain`; their DB work happens on the checkpointer's thread, so these tests
commit for real."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from runs import services
from runs.graphs.loader import load_graphs
from runs.models import AuditEntry, Run, RunStatus, ToolCall, ToolCallStatus
from tests.graphs.inbox_choices import DEFAULT_ARGS
from tests.test_graphs import GRAPHS_DIR

pytestmark = pytest.mark.django_db(transaction=True)

HX = {"HX-Request": "true"}
XSS_MARKDOWN = (
    "**Refund** for _Ann_\n\n- one\n- two\n\n"
    '<script>alert(1)</script><img src=x onerror="alert(2)">'
    '[click](javascript:alert(3)) <a href="https://example.com" onclick="alert(4)">site</a>'
)


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def choice_graphs(register_agent: Any) -> None:
    loaded = load_graphs(
        {
            "graphs": {
                "inbox_choices": "./inbox_choices.py:graph",
                "ask_schema": "./inbox_choices.py:asked",
            },
            "base_dir": str(GRAPHS_DIR),
        }
    )
    for agent in loaded.values():
        register_agent(agent)


def signed_in(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def suspended(drain: Any, agent_id: str = "inbox_choices", **input: Any) -> Run:
    thread = services.thread_create()
    run = services.run_create(agent_id=agent_id, thread_id=thread.id, input=input, actor="test")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def waiting(run: Run) -> ToolCall:
    return run.tool_calls.get(
        status__in=[ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT]
    )


def choose(client: Client, run: Run, choice: str, **data: Any) -> Any:
    body = {"tool_call_id": waiting(run).tool_call_id, "inbox": choice, **data}
    return client.post(reverse("runs:tool_call_answer", args=[run.id]), body, headers=HX)


def finished(run: Run, drain: Any) -> Run:
    drain()
    run.refresh_from_db()
    return run


def page(client: Client, run: Run) -> str:
    r = client.get(reverse("runs:run_detail", args=[run.id]))
    assert r.status_code == 200
    return r.content.decode()


def buttons(html: str) -> list[str]:
    """The labels of the Agent Inbox choices a card offers."""
    return re.findall(r'name="inbox" value="(\w+)"', html)


# --- each choice resumes the graph with its HumanResponse ---------------------------------


def test_it_accepts_a_request(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    assert waiting(run).status == ToolCallStatus.AWAITING_APPROVAL
    r = choose(signed_in(reviewer), run, "accept")
    assert r.status_code == 200
    assert "Accepted." in r.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING  # continues like after any decision
    run = finished(run, drain)
    assert run.status == RunStatus.SUCCESS
    assert run.output["response"] == [
        {"type": "accept", "args": {"action": "send_email", "args": DEFAULT_ARGS}}
    ]
    entry = AuditEntry.objects.get(run_id=run.id, action="approve")
    assert entry.actor == "rita"
    assert entry.after["via"] == "agent_inbox:accept"


def test_it_sends_edited_arguments_typed_by_their_values(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    client = signed_in(reviewer)
    html = page(client, run)
    # One field per argument, typed by its value.
    assert re.search(r'<input type="email"|<input type="text"[^>]*name="f_to"', html)
    assert re.search(r'<input type="number"[^>]*name="f_copies"', html)
    assert re.search(r'<input type="checkbox"[^>]*name="f_urgent"', html)
    r = choose(
        client,
        run,
        "edit",
        mode="fields",
        f_to="bob@example.com",
        f_subject="Your refund",
        f_copies="2",
        f_urgent="on",
    )
    assert r.status_code == 200
    run = finished(run, drain)
    assert run.status == RunStatus.SUCCESS
    edited = {"to": "bob@example.com", "subject": "Your refund", "copies": 2, "urgent": True}
    assert run.output["response"] == [
        {"type": "edit", "args": {"action": "send_email", "args": edited}}
    ]
    tc = run.tool_calls.get()
    assert tc.original_args == DEFAULT_ARGS
    assert AuditEntry.objects.get(run_id=run.id).after["via"] == "agent_inbox:edit"


def test_an_invalid_edit_comes_back_next_to_its_field(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    r = choose(signed_in(reviewer), run, "edit", mode="fields", f_to="x", f_copies="many")
    assert r.status_code == 422
    body = r.content.decode()
    assert "Enter a whole number." in body
    assert f'id="inbox-edit-{waiting(run).pk}" data-act="edit" open' in body
    assert waiting(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_responds_with_text(reviewer: User, drain: Any) -> None:
    run = suspended(drain, as_list=False)
    r = choose(signed_in(reviewer), run, "respond", text="Wait for the invoice")
    assert r.status_code == 200
    run = finished(run, drain)
    assert run.status == RunStatus.SUCCESS
    assert run.output["response"] == {"type": "response", "args": "Wait for the invoice"}
    assert AuditEntry.objects.get(run_id=run.id).after["via"] == "agent_inbox:respond"


def test_a_response_needs_text(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    r = choose(signed_in(reviewer), run, "respond", text="  ")
    assert r.status_code == 422
    assert "Write a response." in r.content.decode()
    assert waiting(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_it_responds_to_a_request_waiting_for_input(reviewer: User, drain: Any) -> None:
    run = suspended(drain, allow=["respond"])
    assert waiting(run).status == ToolCallStatus.AWAITING_INPUT
    r = choose(signed_in(reviewer), run, "respond", text="No, ask Ann first")
    assert r.status_code == 200
    run = finished(run, drain)
    assert run.output["response"] == [{"type": "response", "args": "No, ask Ann first"}]


def test_it_ignores_a_request_and_the_run_goes_on(reviewer: User, drain: Any) -> None:
    run = suspended(drain, allow=["ignore", "respond"])
    r = choose(signed_in(reviewer), run, "ignore")
    assert r.status_code == 200
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING
    run = finished(run, drain)
    assert run.status == RunStatus.SUCCESS
    assert run.output["response"] == [{"type": "ignore", "args": None}]
    entry = AuditEntry.objects.get(run_id=run.id)
    assert (entry.action, entry.after["via"]) == ("decline", "agent_inbox:ignore")


def test_an_edit_without_accept_is_an_edit_even_when_unchanged(reviewer: User, drain: Any) -> None:
    run = suspended(drain, allow=["edit"], args={"to": "ann@example.com"})
    assert waiting(run).status == ToolCallStatus.AWAITING_INPUT
    r = choose(signed_in(reviewer), run, "edit", mode="fields", f_to="ann@example.com")
    assert r.status_code == 200
    run = finished(run, drain)
    assert run.output["response"] == [
        {"type": "edit", "args": {"action": "send_email", "args": {"to": "ann@example.com"}}}
    ]


def test_it_decides_from_the_inbox_row(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    body = {"tool_call_id": waiting(run).tool_call_id, "inbox": "ignore", "origin": "inbox"}
    r = signed_in(reviewer).post(reverse("runs:tool_call_answer", args=[run.id]), body, headers=HX)
    assert r.status_code == 200
    assert f'id="inbox-row-{run.id}"' in r.content.decode()
    assert finished(run, drain).output["response"] == [{"type": "ignore", "args": None}]


# --- only the allowed choices ---------------------------------------------------------------


@pytest.mark.parametrize(
    "allow",
    [["accept", "edit", "respond", "ignore"], ["accept"], ["respond", "ignore"], ["edit"], []],
)
def test_only_the_allowed_choices_are_offered(reviewer: User, drain: Any, allow: list[str]) -> None:
    run = suspended(drain, allow=allow)
    client = signed_in(reviewer)
    html = page(client, run)
    assert buttons(html) == allow
    assert "Decline…" not in html
    assert "Send answer" not in html
    inbox = client.get(reverse("runs:inbox")).content.decode()
    row = inbox[inbox.index(f'id="inbox-row-{run.id}"') :]
    row = row[: row.index("</tr>")]
    offered_in_row = buttons(row) + (["edit"] if 'data-act="edit"' in row else [])
    assert sorted(offered_in_row) == sorted(allow)


@pytest.mark.parametrize("choice", ["accept", "edit", "ignore"])
def test_a_choice_the_request_does_not_allow_is_refused(
    reviewer: User, drain: Any, choice: str
) -> None:
    run = suspended(drain, allow=["respond"])
    r = choose(signed_in(reviewer), run, choice, mode="fields", f_to="x@y.z")
    assert r.status_code == 409
    assert "does not allow" in r.content.decode()
    assert waiting(run).status == ToolCallStatus.AWAITING_INPUT


def test_support_and_nobody_get_no_choices_and_403(support: User, nobody: User, drain: Any) -> None:
    run = suspended(drain)
    for user in (support, nobody):
        client = signed_in(user)
        assert buttons(page(client, run)) == []
        assert choose(client, run, "accept").status_code == 403
    assert waiting(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_a_choice_needs_the_csrf_token(reviewer: User, drain: Any) -> None:
    run = suspended(drain)
    client = signed_in(reviewer, csrf=True)
    assert choose(client, run, "ignore").status_code == 403
    token = re.search(r"hx-headers='\{\"x-csrftoken\": \"([^\"]+)\"\}'", page(client, run))
    assert token is not None
    body = {"tool_call_id": waiting(run).tool_call_id, "inbox": "ignore"}
    url = reverse("runs:tool_call_answer", args=[run.id])
    r = client.post(url, body, headers={**HX, "X-CSRFToken": token.group(1)})
    assert r.status_code == 200


def test_a_choice_that_lost_a_race_says_who_won(reviewer: User, staff: User, drain: Any) -> None:
    run = suspended(drain)
    tc = waiting(run)
    assert choose(signed_in(staff), run, "ignore").status_code == 200
    body = {"tool_call_id": tc.tool_call_id, "inbox": "accept"}
    r = signed_in(reviewer).post(reverse("runs:tool_call_answer", args=[run.id]), body, headers=HX)
    assert r.status_code == 409
    assert "Already declined by" in r.content.decode()


# --- the description, as sanitised Markdown -------------------------------------------------


def test_the_description_is_rendered_markdown_without_scripts(reviewer: User, drain: Any) -> None:
    run = suspended(drain, description=XSS_MARKDOWN)
    client = signed_in(reviewer)
    inbox = client.get(reverse("runs:inbox")).content.decode()
    for html in (page(client, run), inbox):
        desc = re.search(r'<div class="md inbox-description">(.*?)</div>', html, re.S)
        assert desc is not None
        rendered = desc.group(1)
        assert "<strong>Refund</strong>" in rendered
        assert "<em>Ann</em>" in rendered
        assert "<li>one</li>" in rendered
        assert "<script" not in rendered
        assert "onerror" not in rendered
        assert "onclick" not in rendered
        assert "javascript:" not in rendered
        assert "<img" not in rendered
        assert 'href="https://example.com"' in rendered
        assert 'rel="noopener noreferrer nofollow"' in rendered
        # Everywhere else on the page the request is escaped JSON, never markup.
        assert "<script>alert(1)" not in html


def test_a_pushed_card_is_the_same_card(reviewer: User, drain: Any) -> None:
    from runs import selectors
    from runs.fragments import Fragments

    run = suspended(drain, description="**bold**")
    pushed = "\n".join(
        Fragments(reviewer).run_push(
            selectors.run_page(run.id, user=reviewer), _fresh(), with_io=True
        )
    )
    assert "<strong>bold</strong>" in pushed
    assert buttons(pushed) == ["accept", "edit", "respond", "ignore"]
    row = Fragments(reviewer).inbox_row(selectors.inbox_rows([run.id], user=reviewer)[0])
    assert "<strong>bold</strong>" in row
    assert buttons(row) == ["accept", "respond", "ignore"]


def _fresh() -> Any:
    from runs.fragments import RunPushState

    # A socket that pushed before (card tokens known but not this card's): the card is new.
    return RunPushState(seq=0, card_tokens={})


# --- any other value: the answer form -----------------------------------------------------


def test_an_interrupt_with_a_response_schema_gets_the_schema_form(
    reviewer: User, drain: Any
) -> None:
    run = suspended(drain, "ask_schema")
    tc = waiting(run)
    assert tc.status == ToolCallStatus.AWAITING_INPUT
    assert tc.resume_schema is not None
    client = signed_in(reviewer)
    html = page(client, run)
    assert buttons(html) == []
    assert re.search(r'<input type="number"[^>]*name="f_count"', html)
    assert 'name="f_note"' in html
    url = reverse("runs:tool_call_answer", args=[run.id])
    r = client.post(
        url, {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_count": "0"}, headers=HX
    )
    assert r.status_code == 422
    r = client.post(
        url, {"tool_call_id": tc.tool_call_id, "mode": "fields", "f_count": "3"}, headers=HX
    )
    assert r.status_code == 200
    run = finished(run, drain)
    assert run.status == RunStatus.SUCCESS
    assert run.output["answer"] == {"count": 3}


def test_a_runsite_agent_with_an_inbox_shaped_payload_keeps_todays_forms() -> None:
    from runs.services.agent_inbox import agent_inbox_request

    payload = {"action_request": {"action": "a", "args": {}}, "config": {"allow_accept": True}}
    assert agent_inbox_request("refund", payload) is None
    assert agent_inbox_request("inbox_choices", [payload]) == payload
    assert agent_inbox_request("inbox_choices", {"question": "x"}) is None
