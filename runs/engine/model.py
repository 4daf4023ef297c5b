"""Models (policies): given the state, propose tool calls or a final answer.

`ScriptedModel` runs deterministic rules and needs no network; `OpenAIChatModel` talks to any
OpenAI-compatible chat-completions endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Tool(Protocol):
    """What a model sees of a tool (runs.engine.agent.Tool satisfies it; no import needed)."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class ProposedCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass
class ToolCalls:
    calls: list[ProposedCall]
    content: str = ""


@dataclass
class FinalAnswer:
    output: Any
    content: str = ""


Decision = ToolCalls | FinalAnswer


@dataclass
class ToolResult:
    tool_call_id: str
    name: str
    args: dict[str, Any]
    result: Any
    declined: bool = False
    reason: str = ""


@dataclass
class ModelInput:
    """What a model sees: the run's input, the conversation so far, and this run's tool results."""

    agent_id: str
    input: Any
    messages: list[dict[str, Any]]
    step: int
    results: list[ToolResult]

    def last_result(self, tool_name: str) -> ToolResult | None:
        for r in reversed(self.results):
            if r.name == tool_name:
                return r
        return None


class Model(Protocol):
    """`decide` returns the next decision. A model may set `in_process = True` when it decides
    at once in this process (no network, nothing slow): the engine then writes a step's tool
    outcome together with the decision that follows it (engine/loop.py)."""

    def decide(self, state: ModelInput, tools: Sequence[Tool]) -> Decision: ...


class ModelError(Exception):
    """The model could not produce a decision (bad response, HTTP error, timeout)."""


class ScriptedModel:
    """Deterministic rules: `script(state) -> ToolCalls | FinalAnswer`."""

    in_process = True  # a script of this process decides at once (Model)

    def __init__(self, script: Callable[[ModelInput], Decision]):
        self.script = script

    def decide(self, state: ModelInput, tools: Sequence[Tool]) -> Decision:
        return self.script(state)


def _content_text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content)


class OpenAIChatModel:
    """Any OpenAI-compatible `/chat/completions` endpoint with tool calling.

    Settings default to RUNS_OPENAI_BASE_URL / RUNS_OPENAI_API_KEY / RUNS_OPENAI_MODEL /
    RUNS_OPENAI_TIMEOUT. The final answer's output is `{"content": <assistant text>}`.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        system_prompt: str = "",
        temperature: float | None = None,
    ):
        from django.conf import settings

        self.model = model or settings.RUNS_OPENAI_MODEL
        self.base_url = (base_url or settings.RUNS_OPENAI_BASE_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else settings.RUNS_OPENAI_API_KEY
        self.timeout = timeout or settings.RUNS_OPENAI_TIMEOUT
        self.system_prompt = system_prompt
        self.temperature = temperature

    def _messages(self, state: ModelInput) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        for m in state.messages:
            role = m.get("role")
            if role == "assistant" and m.get("tool_calls"):
                out.append(
                    {
                        "role": "assistant",
                        "content": m.get("content") or None,
                        "tool_calls": [
                            {
                                "id": tc["id"],
                                "type": "function",
                                "function": {
                                    "name": tc["name"],
                                    "arguments": json.dumps(tc["args"]),
                                },
                            }
                            for tc in m["tool_calls"]
                        ],
                    }
                )
            elif role == "tool":
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": m["tool_call_id"],
                        "content": _content_text(m.get("content")),
                    }
                )
            else:
                out.append({"role": role or "user", "content": _content_text(m.get("content"))})
        return out

    def decide(self, state: ModelInput, tools: Sequence[Tool]) -> Decision:
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(state)}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        url = f"{self.base_url}/chat/completions"
        # Imported here: only workers running an OpenAI-compatible model need httpx (and the
        # CLI modules it loads); web processes stay smaller without it.
        import httpx

        try:
            response = httpx.post(url, json=body, headers=headers, timeout=self.timeout)
        except httpx.TimeoutException:
            raise ModelError(f"model endpoint {url} timed out after {self.timeout}s") from None
        except httpx.HTTPError as exc:
            raise ModelError(f"model endpoint {url} unreachable: {exc}") from None
        if response.status_code >= 400:
            raise ModelError(
                f"model endpoint answered {response.status_code}: {response.text[:300]}"
            )
        try:
            message = response.json()["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelError(
                f"model endpoint sent an unexpected body: {response.text[:300]}"
            ) from None
        calls = message.get("tool_calls") or []
        if calls:
            proposed = []
            for c in calls:
                fn = c.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    raise ModelError(
                        f"model sent tool arguments that are not JSON: {fn.get('arguments')!r}"
                    ) from None
                proposed.append(ProposedCall(name=fn.get("name", ""), args=args, id=c.get("id")))
            return ToolCalls(calls=proposed, content=message.get("content") or "")
        content = message.get("content") or ""
        return FinalAnswer(output={"content": content}, content=content)
