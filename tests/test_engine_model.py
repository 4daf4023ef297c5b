"""OpenAIChatModel against a small fake chat-completions server started by the test."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings

from runs import services
from runs.engine import Agent, OpenAIChatModel, tool
from runs.models import Run, RunStatus, ToolCall

pytestmark = pytest.mark.django_db


class FakeChat:
    """Answers POST /v1/chat/completions from a script; records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, Any, float]] = []  # (status, body, delay)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                )
                status, reply, delay = (
                    fake.replies.pop(0) if fake.replies else (500, {"error": "no reply"}, 0)
                )
                time.sleep(delay)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reply_tool_call(self, name: str, args: dict[str, Any], call_id: str = "call_1") -> None:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        }
        self.replies.append((200, {"choices": [{"message": message}]}, 0))

    def reply_text(self, text: str) -> None:
        self.replies.append(
            (200, {"choices": [{"message": {"role": "assistant", "content": text}}]}, 0)
        )


@pytest.fixture
def fake_chat() -> Iterator[FakeChat]:
    fake = FakeChat()
    yield fake
    fake.server.shutdown()


@tool(
    description="Look up the stock of a product",
    parameters={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
)
def stock(ctx: Any, sku: str) -> dict[str, Any]:
    return {"sku": sku, "in_stock": 3}


@tool(
    description="Delete a product",
    requires_approval=True,
    parameters={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
)
def delete_product(ctx: Any, sku: str) -> dict[str, Any]:
    return {"deleted": sku}


def agent(fake: FakeChat, **kw: Any) -> Agent:
    return Agent(
        id="llm",
        tools=[stock, delete_product],
        model=OpenAIChatModel(
            base_url=fake.url,
            api_key="sk-test",
            model="test-model",
            system_prompt="Be brief.",
            **kw,
        ),
    )


def test_it_calls_tools_and_answers_through_the_endpoint(fake_chat, register_agent, drain) -> None:
    register_agent(agent(fake_chat))
    fake_chat.reply_tool_call("stock", {"sku": "A1"})
    fake_chat.reply_text("There are 3 in stock.")
    run = services.run_create(agent_id="llm", thread_id=None, input="How many A1?", actor="t")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    assert run.output == {"content": "There are 3 in stock."}
    first, second = fake_chat.requests
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sk-test"
    assert first["body"]["model"] == "test-model"
    assert [t["function"]["name"] for t in first["body"]["tools"]] == ["stock", "delete_product"]
    assert first["body"]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert first["body"]["messages"][1] == {"role": "user", "content": "How many A1?"}
    tool_msg = second["body"]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == "call_1"
    assert json.loads(tool_msg["content"]) == {"sku": "A1", "in_stock": 3}


def test_a_model_proposed_call_that_needs_approval_suspends(
    fake_chat, register_agent, drain, reviewer
) -> None:
    register_agent(agent(fake_chat))
    fake_chat.reply_tool_call("delete_product", {"sku": "Z9"}, call_id="call_del")
    run = services.run_create(agent_id="llm", thread_id=None, input="delete Z9", actor="t")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    assert ToolCall.objects.get(run=run).tool_call_id == "call_del"
    services.tool_call_decline(run=run, actor=reviewer, reason="keep it")
    fake_chat.reply_text("OK, not deleted.")
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    # the model was not asked again for the suspended step; it got the decline reason
    assert len(fake_chat.requests) == 2
    assert json.loads(fake_chat.requests[1]["body"]["messages"][-1]["content"]) == {
        "declined": True,
        "reason": "keep it",
    }


@override_settings(RUNS_MAX_ATTEMPTS=1)
def test_an_http_error_from_the_endpoint_fails_the_run_clearly(
    fake_chat, register_agent, drain
) -> None:
    register_agent(agent(fake_chat))
    fake_chat.replies.append((500, {"error": {"message": "overloaded"}}, 0))
    run = services.run_create(agent_id="llm", thread_id=None, input="hi", actor="t")
    drain()
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.ERROR
    assert run.error["error"] == "ModelError"
    assert "answered 500" in run.error["message"] and "overloaded" in run.error["message"]


@override_settings(RUNS_MAX_ATTEMPTS=1)
def test_a_slow_endpoint_times_out(fake_chat, register_agent, drain) -> None:
    register_agent(agent(fake_chat, timeout=0.2))
    fake_chat.replies.append((200, {"choices": []}, 1.0))
    run = services.run_create(agent_id="llm", thread_id=None, input="hi", actor="t")
    drain()
    run = Run.objects.get(id=run.id)
    assert run.status == RunStatus.ERROR
    assert "timed out" in run.error["message"]


@override_settings(RUNS_MAX_ATTEMPTS=1)
def test_a_malformed_body_is_a_clear_error(fake_chat, register_agent, drain) -> None:
    register_agent(agent(fake_chat))
    fake_chat.replies.append((200, {"unexpected": True}, 0))
    run = services.run_create(agent_id="llm", thread_id=None, input="hi", actor="t")
    drain()
    assert "unexpected body" in Run.objects.get(id=run.id).error["message"]
