"""Template helpers for what a reviewer reads before deciding: a tool call's context (the
tool's description, the request's description) and the conversation as chat turns.

Descriptions are untrusted Markdown: the fragments render them with runs_ui's `markdown_safe`,
the app's one sanitiser (Python-Markdown, then nh3 down to an allow-list).
"""

from __future__ import annotations

from typing import Any

from django import template

from runs.selectors import review_context

register = template.Library()


@register.inclusion_tag("runs/_fragments/tool_context.html")
def tool_context(tc: Any, run: Any, compact: bool = False) -> dict[str, Any]:
    """The tool's description and the request's description of one tool call."""
    return {"context": review_context.call_context(run, tc), "compact": compact}


@register.filter
def conversation(values: Any, limit: int = 0) -> Any:
    """The state's messages as chat turns (the newest `limit`, 0: CHAT_TURNS); None without
    messages."""
    turns = int(limit) or review_context.CHAT_TURNS
    return review_context.conversation(values, limit=turns)
