"""Context to decide: the tool's description and the request's description (sanitised Markdown)
on waiting calls, the conversation as a chat, and a comment on approve — stored, audited, in
the timeline, and given to the model where the tool shares it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from runs import selectors, services
from runs.agents.refund import issue_refund
from runs.engine import Agent, FinalAnswer, ModelInput, ProposedCall, ScriptedModel, ToolCalls, tool
from runs.fragments import Fragments, RunPushState
from runs.models import AuditEntry, Run, RunEvent, RunStatus, Thread, ToolCall, ToolCallStatus
from runs.templatetags.runs_ui import markdown_safe

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}
REFUND = {"order_id": "A-1", "amount": 25.0}
XSS_MARKDOWN = (
    "Ship **order A-7** to _Ann_?\n\n"
    "<script>alert(1)</script>\n\n"
    '<img src=x onerror="alert(2)">\n\n'
    '<b onclick="alert(3)">click</b> [evil](javascript:alert(4)) [docs](https://example.com)\n\n'
    '<a href="javascript:alert(5)">raw link</a>\n\n- one\n- two'
)
TOOL_MARKDOWN = "Asks the **customer** a question <script>alert(6)</script>"


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def suspended(drain: Callable[..., int], agent_id: str, input: Any = None) -> Run:
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(agent_id=agent_id, thread_id=thread.id, input=input, actor="t")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def waiting(run: Run) -> ToolCall:
    return run.tool_calls.get(
        status__in=[ToolCallStatus.AWAITING_APPROVAL, ToolCallStatus.AWAITING_INPUT]
    )


# --- an agent whose tool asks the user, with a description in its request -----------------


@tool(description=TOOL_MARKDOWN, parameters={"type": "object"})
def ask_user(ctx: Any) -> Any:
    if ctx.resume_data is None:
        ctx.suspend(
            {"question": "Ship it?", "description": XSS_MARKDOWN},
            resume_schema={
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
            },
        )
    return ctx.resume_data


def _ask_script(state: ModelInput) -> ToolCalls | FinalAnswer:
    asked = state.last_result("ask_user")
    if asked is None:
        return ToolCalls([ProposedCall("ask_user", {})])
    return FinalAnswer(output=asked.result)


@pytest.fixture
def asker(register_agent: Callable[[Any], Any]) -> Agent:
    return register_agent(Agent(id="asker", tools=[ask_user], model=ScriptedModel(_ask_script)))


def _descriptions(html: str, cls: str) -> list[str]:
    return re.findall(rf'<div class="md {cls}">(.*?)</div>', html, re.S)


def _assert_clean(rendered: str) -> None:
    assert "<script" not in rendered
    assert "onerror" not in rendered
    assert "onclick" not in rendered
    assert "javascript:" not in rendered
    assert "<img" not in rendered


# --- descriptions -----------------------------------------------------------------------------


def test_it_shows_the_tools_description_on_the_run_page_and_in_the_inbox(
    reviewer: User, drain: Any
) -> None:
    run = suspended(drain, "refund", REFUND)
    client = signed_in(reviewer)
    page = client.get(reverse("runs:run_detail", args=[run.id]))
    inbox = client.get(reverse("runs:inbox"))
    assert page.status_code == 200
    assert inbox.status_code == 200
    for html in (page.content.decode(), inbox.content.decode()):
        # On the call a human decides, not on the calls that ran on their own.
        assert _descriptions(html, "tool-description") == [
            "<p>Refund an amount on an order. Needs a human's approval.</p>"
        ]
    assert "What the tool does" in page.content.decode()


def test_it_renders_the_requests_description_as_sanitised_markdown(
    reviewer: User, drain: Any, asker: Agent
) -> None:
    run = suspended(drain, "asker")
    client = signed_in(reviewer)
    page = client.get(reverse("runs:run_detail", args=[run.id])).content.decode()
    inbox = client.get(reverse("runs:inbox")).content.decode()
    for html in (page, inbox):
        requests = _descriptions(html, "inbox-description")
        assert len(requests) == 1, requests
        rendered = requests[0]
        assert "<strong>order A-7</strong>" in rendered
        assert "<em>Ann</em>" in rendered
        assert "<li>one</li>" in rendered
        assert 'href="https://example.com"' in rendered
        assert 'rel="noopener noreferrer nofollow"' in rendered
        _assert_clean(rendered)
        tools = _descriptions(html, "tool-description")
        assert len(tools) == 1
        assert "<strong>customer</strong>" in tools[0]
        _assert_clean(tools[0])
        # Everywhere else the request is escaped JSON, never markup.
        assert "<script>alert(" not in html


def test_a_pushed_card_carries_the_same_descriptions(reviewer: User, drain: Any, asker) -> None:
    run = suspended(drain, "asker")
    page = selectors.run_page(run.id, user=selectors.UNSCOPED)
    pushed = Fragments(reviewer).run_regions(page)
    assert len(_descriptions(pushed, "inbox-description")) == 1
    assert len(_descriptions(pushed, "tool-description")) == 1


def test_the_one_sanitiser_strips_scripts_handlers_and_javascript_links() -> None:
    rendered = str(markdown_safe(XSS_MARKDOWN))
    assert "<strong>order A-7</strong>" in rendered
    _assert_clean(rendered)
    assert str(markdown_safe("")) == ""
    assert str(markdown_safe(None)) == ""


def test_a_call_without_descriptions_shows_none(reviewer: User, drain: Any, register_agent) -> None:
    bare = dataclasses.replace(issue_refund, description="")
    register_agent(
        Agent(
            id="bare",
            tools=[bare],
            model=ScriptedModel(
                lambda s: (
                    FinalAnswer(output=1)
                    if s.results
                    else ToolCalls([ProposedCall("issue_refund", REFUND)])
                )
            ),
        )
    )
    run = suspended(drain, "bare")
    html = signed_in(reviewer).get(reverse("runs:run_detail", args=[run.id])).content.decode()
    assert _descriptions(html, "tool-description") == []
    assert "What the tool does" not in html


# --- the conversation as a chat ---------------------------------------------------------------

MESSAGES: list[Any] = [
    {"type": "system", "content": "You are a support agent."},
    {"type": "human", "content": "Refund <b>order</b> A-1, please"},
    {
        "type": "ai",
        "content": "",
        "tool_calls": [{"name": "lookup_order", "args": {"order_id": "A-1"}, "id": "c1"}],
    },
    {"type": "tool", "tool_call_id": "c1", "content": '{"status": "delivered"}'},
    {"role": "user", "content": [{"type": "text", "text": "Any news?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "issue_refund", "arguments": '{"amount": 5}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c2", "name": "issue_refund", "content": {"refunded": True}},
    {
        "lc": 1,
        "type": "constructor",
        "id": ["langchain", "schema", "messages", "AIMessage"],
        "kwargs": {"content": "Refunded 5 on A-1."},
    },
    {"weird": "shape"},
]


def _turns(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<li class="turn turn-(\w+)" data-role="\w+" data-index="(\d+)">', html)


def test_it_shows_a_threads_messages_as_chat_turns(reviewer: User) -> None:
    thread = services.thread_create(metadata={})
    services.thread_update_state(thread=thread, values={"messages": MESSAGES}, actor="t")
    r = signed_in(reviewer).get(reverse("runs:thread_detail", args=[thread.id]))
    assert r.status_code == 200
    html = r.content.decode()
    chat = html[html.index('id="thread-chat"') :]
    roles = [role for role, _ in _turns(chat)]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
        "assistant",
        "other",
    ]
    assert "Refund &lt;b&gt;order&lt;/b&gt; A-1, please" in chat  # text is escaped, not markup
    assert "Any news?" in chat
    # Assistant tool calls: name and arguments; tool turns: the tool's name (from the call
    # that asked for it when the message has none) and its result as JSON.
    assert "<code>lookup_order</code>" in chat
    assert "<code>issue_refund</code>" in chat
    assert '<span class="k">&quot;amount&quot;</span>' in chat
    assert '<span class="k">&quot;status&quot;</span>' in chat
    assert "Refunded 5 on A-1." in chat
    assert "&quot;weird&quot;" in chat
    # The raw JSON stays a click away for power users.
    assert reverse("runs:thread_values", args=[thread.id]) in chat


def test_the_chat_region_is_bounded_to_the_newest_turns(reviewer: User) -> None:
    thread = services.thread_create(metadata={})
    many = [{"role": "user", "content": f"message {i}"} for i in range(100)]
    services.thread_update_state(thread=thread, values={"messages": many}, actor="t")
    client = signed_in(reviewer)
    html = client.get(reverse("runs:thread_detail", args=[thread.id])).content.decode()
    indexes = [int(i) for _, i in _turns(html)]
    assert indexes == list(range(60, 100))
    assert "60 earlier messages" in html
    # The conversation page shows every turn; the htmx refresh is the bounded region.
    full = client.get(reverse("runs:thread_chat", args=[thread.id]))
    assert full.status_code == 200
    assert [int(i) for _, i in _turns(full.content.decode())] == list(range(100))
    region = client.get(reverse("runs:thread_chat", args=[thread.id]), headers=HX)
    assert region.status_code == 200
    assert len(_turns(region.content.decode())) == 40
    assert "<html" not in region.content.decode()


def test_a_state_without_messages_says_so(reviewer: User) -> None:
    thread = services.thread_create(metadata={})
    services.thread_update_state(thread=thread, values={"count": 1}, actor="t")
    html = signed_in(reviewer).get(reverse("runs:thread_detail", args=[thread.id])).content.decode()
    assert "the state has no <code>messages</code> list" in html


def test_the_run_page_shows_the_runs_conversation(reviewer: User, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    client = signed_in(reviewer)
    html = client.get(reverse("runs:run_detail", args=[run.id])).content.decode()
    chat = html[html.index('id="run-chat"') :]
    roles = [role for role, _ in _turns(chat)]
    # input, lookup_order call, its result, the issue_refund call (waiting)
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert "<code>issue_refund</code>" in chat
    assert "{#" not in html and "{%" not in html  # no template source leaks into the page
    r = client.get(reverse("runs:run_chat", args=[run.id]), headers=HX)
    assert r.status_code == 200
    assert _turns(r.content.decode()) == _turns(chat)


def test_a_push_never_carries_the_chat_and_asks_for_it_when_the_run_stops(
    reviewer: User, drain: Any, support: User
) -> None:
    run = suspended(drain, "refund", REFUND)
    fragments = Fragments(support)
    sent = RunPushState(seq=0)
    reload = f'hx-get="{reverse("runs:run_chat", args=[run.id])}" hx-trigger="load"'
    first = "\n".join(
        fragments.run_push(selectors.run_page(run.id, user=selectors.UNSCOPED), sent, with_io=True)
    )
    assert reload in first  # the page may have been rendered before it stopped
    services.tool_call_approve(run=run, actor=reviewer, comment="")
    second = "\n".join(
        fragments.run_push(selectors.run_page(run.id, user=selectors.UNSCOPED), sent, with_io=True)
    )
    assert reload not in second  # pending: not a stop
    drain()
    third = "\n".join(
        fragments.run_push(selectors.run_page(run.id, user=selectors.UNSCOPED), sent, with_io=True)
    )
    assert reload in third
    for frame in (first, second, third):
        assert 'id="run-chat"' not in frame
        assert "chat-turns" not in frame


# --- a comment on approve ---------------------------------------------------------------------


def test_it_approves_with_a_comment_from_the_run_page(reviewer: User, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    tc = waiting(run)
    client = signed_in(reviewer)
    r = client.post(
        reverse("runs:tool_call_approve", args=[run.id]),
        {"tool_call_id": tc.tool_call_id, "comment": "  goodwill, no return needed  "},
        headers=HX,
    )
    assert r.status_code == 200
    tc.refresh_from_db()
    assert tc.decision_comment == "goodwill, no return needed"
    assert tc.decision == "approved"
    event = RunEvent.objects.get(run=run, kind="decision")
    assert event.data["comment"] == "goodwill, no return needed"
    entry = AuditEntry.objects.get(action="approve", run_id=run.id)
    assert entry.reason == "goodwill, no return needed"
    assert entry.after["comment"] == "goodwill, no return needed"
    # In the timeline and on the card, escaped.
    assert "“goodwill, no return needed”" in r.content.decode()
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    # The demo agent's refund tool shares the comment: its model saw it with the result.
    assert run.output["reviewer_comment"] == "goodwill, no return needed"
    audit = client.get(reverse("runs:audit_log")).content.decode()
    assert "goodwill, no return needed" in audit


def test_it_approves_with_edited_arguments_and_a_comment(reviewer: User, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    tc = waiting(run)
    client = signed_in(reviewer)
    page = client.get(reverse("runs:run_detail", args=[run.id])).content.decode()
    # Both approve forms of the card (approve, edit & approve) offer the comment.
    assert page.count('name="comment"') == 3  # approve, edit as fields, edit as JSON
    body = {
        "tool_call_id": tc.tool_call_id,
        "mode": "fields",
        "f_order_id": "A-1",
        "f_amount": "10",
        "comment": "half now",
    }
    r = client.post(reverse("runs:tool_call_approve", args=[run.id]), body, headers=HX)
    assert r.status_code == 200
    tc.refresh_from_db()
    assert tc.args == {"order_id": "A-1", "amount": 10}
    assert tc.original_args == REFUND
    assert tc.decision_comment == "half now"
    event = RunEvent.objects.get(run=run, kind="decision")
    assert event.data["comment"] == "half now"
    assert event.data["args"] == {"order_id": "A-1", "amount": 10}


def test_a_too_long_comment_is_refused_and_nothing_changes(reviewer: User, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    tc = waiting(run)
    r = signed_in(reviewer).post(
        reverse("runs:tool_call_approve", args=[run.id]),
        {"tool_call_id": tc.tool_call_id, "comment": "x" * 10_001},
        headers=HX,
    )
    assert r.status_code == 422
    assert "comment" in r.content.decode()
    tc.refresh_from_db()
    assert tc.status == ToolCallStatus.AWAITING_APPROVAL
    assert tc.decision_comment == ""
    assert not AuditEntry.objects.exists()


def _seeing_agent(agent_id: str, refund_tool: Any, seen: list[ModelInput]) -> Agent:
    def script(state: ModelInput) -> ToolCalls | FinalAnswer:
        seen.append(state)
        if state.last_result("issue_refund") is None:
            return ToolCalls([ProposedCall("issue_refund", REFUND)])
        return FinalAnswer(output="done")

    return Agent(id=agent_id, tools=[refund_tool], model=ScriptedModel(script))


def test_the_comment_reaches_the_model_only_where_the_tool_shares_it(
    reviewer: User, drain: Any, register_agent: Callable[[Any], Any]
) -> None:
    shared: list[ModelInput] = []
    kept: list[ModelInput] = []
    register_agent(_seeing_agent("sharing", issue_refund, shared))
    private = dataclasses.replace(issue_refund, share_review_comment=False)
    register_agent(_seeing_agent("private", private, kept))
    for agent_id in ("sharing", "private"):
        run = suspended(drain, agent_id)
        services.tool_call_approve(run=run, actor=reviewer, comment="watch the amount")
    drain()
    sharing_result = shared[-1].last_result("issue_refund")
    private_result = kept[-1].last_result("issue_refund")
    assert sharing_result is not None and private_result is not None
    assert sharing_result.result["reviewer_comment"] == "watch the amount"
    assert sharing_result.result["refunded"] is True
    assert "reviewer_comment" not in private_result.result
    # The conversation the model reads (the tool message) says the same.
    sharing_tool_msg = [m for m in shared[-1].messages if m.get("role") == "tool"][-1]
    private_tool_msg = [m for m in kept[-1].messages if m.get("role") == "tool"][-1]
    assert sharing_tool_msg["content"]["reviewer_comment"] == "watch the amount"
    assert "reviewer_comment" not in private_tool_msg["content"]
    # Stored with the decision either way.
    for agent_id in ("sharing", "private"):
        tc = ToolCall.objects.get(run__agent_id=agent_id, tool_name="issue_refund")
        assert tc.decision_comment == "watch the amount"


def test_no_comment_leaves_the_result_as_the_tool_returned_it(reviewer: User, drain) -> None:
    run = suspended(drain, "refund", REFUND)
    services.tool_call_approve(run=run, actor=reviewer)
    drain()
    run.refresh_from_db()
    assert run.output == {"refunded": True, "order_id": "A-1", "amount": 25.0}
    assert not RunEvent.objects.filter(run=run, kind="decision", data__has_key="comment").exists()


# --- the review API and the LangGraph resume ---------------------------------------------------


@pytest.fixture
def api(settings: Any) -> Client:
    settings.RUNS_API_AUTH = False
    return Client()


def test_the_review_api_approves_with_a_comment(api: Client, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    r = api.post(
        "/api/agents/refund/approve-tool-call",
        {"run_id": str(run.id), "comment": "ok by finance"},
        content_type="application/json",
    )
    assert r.status_code == 202
    body = r.json()
    decided = next(tc for tc in body["tool_calls"] if tc["tool_name"] == "issue_refund")
    assert decided["decision_comment"] == "ok by finance"
    assert waiting_or_decided(run).decision_comment == "ok by finance"
    drain()
    assert Run.objects.get(id=run.id).output["reviewer_comment"] == "ok by finance"


def waiting_or_decided(run: Run) -> ToolCall:
    return run.tool_calls.get(tool_name="issue_refund")


def test_the_review_api_refuses_a_too_long_comment_naming_the_field(
    api: Client, drain: Any
) -> None:
    run = suspended(drain, "refund", REFUND)
    r = api.post(
        "/api/agents/refund/approve-tool-call",
        {"run_id": str(run.id), "comment": "x" * 10_001},
        content_type="application/json",
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "comment"
    assert waiting_or_decided(run).status == ToolCallStatus.AWAITING_APPROVAL


def test_the_review_api_refuses_a_comment_on_a_decline(api: Client, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    r = api.post(
        "/api/agents/refund/resume",
        {"run_id": str(run.id), "approved": False, "reason": "no", "comment": "hm"},
        content_type="application/json",
    )
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "comment"
    assert waiting_or_decided(run).status == ToolCallStatus.AWAITING_APPROVAL
    r = api.post(
        "/api/agents/refund/resume",
        {"run_id": str(run.id), "resume_data": {"approved": True, "comment": "fine"}},
        content_type="application/json",
    )
    assert r.status_code == 202
    assert waiting_or_decided(run).decision_comment == "fine"


def test_a_langgraph_resume_approves_with_a_comment(api: Client, drain: Any) -> None:
    run = suspended(drain, "refund", REFUND)
    tid = str(run.thread_id)
    bad = api.post(
        f"/api/threads/{tid}/runs",
        {"assistant_id": "refund", "command": {"resume": {"approved": True, "comment": 3}}},
        content_type="application/json",
    )
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"].endswith(".comment")
    r = api.post(
        f"/api/threads/{tid}/runs",
        {"assistant_id": "refund", "command": {"resume": {"approved": True, "comment": "go"}}},
        content_type="application/json",
    )
    assert r.status_code == 200
    drain()
    assert Run.objects.get(id=run.id).output["reviewer_comment"] == "go"
    assert Thread.objects.get(id=tid).values["output"]["reviewer_comment"] == "go"


def test_langchain_messages_from_a_graph_read_as_chat_turns() -> None:
    messages = pytest.importorskip("langchain_core.messages")
    from runs.graphs.jsonable import to_json
    from runs.selectors.review_context import conversation

    values = to_json(
        {
            "messages": [
                messages.SystemMessage("Be brief."),
                messages.HumanMessage("Where is my parcel?"),
                messages.AIMessage(
                    "", tool_calls=[{"name": "track", "args": {"id": "P-1"}, "id": "t1"}]
                ),
                messages.ToolMessage('{"at": "depot"}', tool_call_id="t1"),
                messages.AIMessage([{"type": "text", "text": "It is at the depot."}]),
            ]
        }
    )
    chat = conversation(values)
    assert chat is not None
    assert [t.role for t in chat.turns] == ["system", "user", "assistant", "tool", "assistant"]
    assert chat.turns[1].text == "Where is my parcel?"
    assert [(c.name, c.args, c.id) for c in chat.turns[2].tool_calls] == [
        ("track", {"id": "P-1"}, "t1")
    ]
    assert chat.turns[3].tool_name == "track"  # from the call: the message names no tool
    assert chat.turns[3].data == {"at": "depot"}
    assert chat.turns[4].text == "It is at the depot."
    assert conversation({"messages": "not a list"}) is None
    assert conversation(None) is None
