"""Small display helpers for the dashboard: timestamps, ids, status badges, untrusted JSON.

Everything that shows data from runs (tool arguments, payloads, outputs) is untrusted: it goes
through `conditional_escape`/`format_html` here, never through `mark_safe` on raw text. The one
HTML a run may bring, an Agent Inbox description in Markdown, is marked safe only after nh3 has
cleaned it down to an allow-list (`markdown_safe`).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import markdown as markdown_lib
import nh3
from django import template
from django.utils import timezone
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from runs import permissions
from runs.services.agent_inbox import agent_inbox_request, allowed_choices

register = template.Library()

FOLD_STRING = 160  # characters before a string value is folded
FOLD_ITEMS = 12  # items before a nested list/object is folded
MAX_DEPTH = 12


def relative(value: datetime, now: datetime | None = None) -> str:
    """ "12 s ago", "5 min ago", "3 h ago", "2 d ago" (and "in …" for the future)."""
    now = now or timezone.now()
    seconds = (now - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 5:
        return "just now"
    if seconds < 60:
        text = f"{int(seconds)} s"
    elif seconds < 3600:
        text = f"{int(seconds // 60)} min"
    elif seconds < 86400:
        text = f"{int(seconds // 3600)} h"
    else:
        text = f"{int(seconds // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


@register.simple_tag
def ts(value: datetime | None, empty: str = "—") -> SafeString:
    """A relative time, with the exact time on hover; app.js keeps the text current."""
    if value is None:
        return format_html('<span class="muted">{}</span>', empty)
    exact = timezone.localtime(value)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        exact.strftime("%Y-%m-%d %H:%M:%S %Z"),
        relative(value),
    )


@register.filter
def duration(start: datetime | None, end: datetime | None = None) -> str:
    if start is None:
        return ""
    delta: timedelta = (end or timezone.now()) - start
    seconds = max(0.0, delta.total_seconds())
    if seconds < 1:
        return f"{int(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


@register.simple_tag
def copy_id(value: Any, length: int = 8) -> SafeString:
    """A short id with its full value on hover and a button that copies it."""
    if value is None or value == "":
        return format_html('<span class="muted">{}</span>', "—")
    full = str(value)
    short = full if len(full) <= length + 2 else full[:length]
    return format_html(
        '<span class="id"><code title="{}">{}</code>'
        # The icon is drawn by app.css (button.copy::before), not inlined: ids are on every
        # row of every pushed region, and an inline SVG each made up half a checkpoint row.
        '<button type="button" class="copy" data-copy="{}" title="Copy {}" '
        'aria-label="Copy id"></button></span>',
        full,
        short,
        full,
        full,
    )


@register.simple_tag
def badge(status: str, extra: str = "") -> SafeString:
    """The status badge; one colour per status, the same on every page (app.css .s-*)."""
    return format_html(
        '<span class="badge s-{}{}">{}</span>',
        status,
        f" {extra}" if extra else "",
        str(status).replace("_", " "),
    )


def _scalar(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


@register.filter
def summary(args: Any, limit: int = 120) -> str:
    """A one-line reading of a JSON value: `order_id="A-1", amount=25.0` (plain text)."""
    if isinstance(args, dict):
        parts = []
        for key, val in args.items():
            if isinstance(val, dict | list):
                val_text = "{…}" if isinstance(val, dict) else f"[{len(val)}]"
            else:
                val_text = _scalar(val)
            parts.append(f"{key}={val_text}")
        text = ", ".join(parts)
    elif args is None:
        text = ""
    else:
        text = _scalar(args)
    limit = int(limit)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_html(value: Any, indent: int, depth: int) -> str:
    pad = "  " * indent
    inner = "  " * (indent + 1)
    if depth > MAX_DEPTH:
        return str(conditional_escape(_scalar(value)[:200]))
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [
            f'{inner}<span class="k">{conditional_escape(_scalar(str(k)))}</span>: '
            f"{_json_html(v, indent + 1, depth + 1)}"
            for k, v in value.items()
        ]
        body = ",\n".join(items)
        if len(value) > FOLD_ITEMS and depth > 0:
            return (
                f'<details class="fold"><summary>{{… {len(value)} keys}}</summary>'
                f"{{\n{body}\n{pad}}}</details>"
            )
        return f"{{\n{body}\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        items = [f"{inner}{_json_html(v, indent + 1, depth + 1)}" for v in value]
        body = ",\n".join(items)
        if len(value) > FOLD_ITEMS and depth > 0:
            return (
                f'<details class="fold"><summary>[… {len(value)} items]</summary>'
                f"[\n{body}\n{pad}]</details>"
            )
        return f"[\n{body}\n{pad}]"
    text = _scalar(value)
    cls = "s" if isinstance(value, str) else "n"
    if isinstance(value, str) and len(text) > FOLD_STRING:
        return (
            f'<details class="fold"><summary class="{cls}">'
            f"{conditional_escape(text[:80])}… ({len(value)} chars)</summary>"
            f'<span class="{cls}">{conditional_escape(text)}</span></details>'
        )
    return f'<span class="{cls}">{conditional_escape(text)}</span>'


MAX_JSON_CHARS = 100_000  # beyond this a value is shown as truncated text (the admin has it)


@register.filter
def json_view(value: Any) -> SafeString:
    """Pretty JSON with long strings and big nested values folded. Every piece is escaped."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > MAX_JSON_CHARS:
        return format_html(
            '<pre class="json">{}\n… <span class="muted">({} KB in all; truncated here)</span></pre>',
            text[:MAX_JSON_CHARS],
            len(text) // 1024,
        )
    # Safe: _json_html escapes every key and value it emits; the only raw markup is its own.
    return mark_safe(f'<pre class="json">{_json_html(value, 0, 0)}</pre>')  # noqa: S308


# A region pushed every few seconds does not inline a value bigger than this: the page offers
# a link that fetches it on demand.
MAX_INLINE_JSON_CHARS = 1000


@register.filter
def json_chars(value: Any) -> int:
    return len(json.dumps(value, default=str)) if value is not None else 0


@register.filter
def json_inline(value: Any) -> bool:
    return json_chars(value) <= MAX_INLINE_JSON_CHARS


@register.filter
def json_text(value: Any) -> str:
    """Indented JSON as plain text (for textareas); the template escapes it."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def get_item(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.simple_tag
def attrs(**kwargs: Any) -> SafeString:
    """HTML attributes from keyword arguments, skipping None/False (values escaped)."""
    pairs = [(k.replace("_", "-"), v) for k, v in kwargs.items() if v not in (None, False)]
    return format_html_join(" ", '{}="{}"', pairs)


@register.inclusion_tag("runs/_fragments/nav_inbox_count.html", takes_context=True)
def nav_inbox_count(context: template.Context) -> dict[str, Any]:
    """The number of runs waiting for a human, shown next to "Inbox" on every page."""
    from runs import selectors

    count = context.get("inbox_count")
    if count is None:
        count = selectors.inbox(selectors.RunFilters(), user=context.get("user")).count()
    return {"inbox_count": count, "oob": False}


@register.filter
def can_see_admin(user: Any) -> bool:
    return permissions.can_see_admin(user)


@register.filter
def scope_label(user: Any) -> str:
    """The resources a bound user sees ("acme, globex"); "" for unbound staff."""
    from runs import selectors

    key = selectors.scope_for(user).key
    return "" if key is None else ", ".join(key)


@register.filter
def last_decision(run: Any) -> Any:
    """The run's most recently decided tool call (from prefetched tool_calls)."""
    decided = [tc for tc in run.tool_calls.all() if tc.decided_at is not None]
    return max(decided, key=lambda tc: tc.decided_at) if decided else None


def _event_summary(event: Any) -> str:
    data = event.data or {}
    kind = event.kind
    if kind == "created":
        return "created"
    if kind == "started":
        return f"attempt {data.get('attempt', '?')} started"
    if kind == "step":
        return f"step {data.get('step', '?')} checkpointed"
    if kind == "update":
        return f"{data.get('node', 'update')} update"
    if kind == "tool_call":
        return f"{data.get('tool_name', '?')}({summary(data.get('args'), 80)})"
    if kind == "tool_result":
        return f"{data.get('tool_name', '?')} → {data.get('status', '?')}"
    if kind == "suspended":
        names = []
        for interrupt in data.get("interrupts") or []:
            value = interrupt.get("value") if isinstance(interrupt, dict) else None
            if isinstance(value, dict):
                names.append(str(value.get("tool_name") or value.get("type") or "?"))
        return "waiting on " + (", ".join(names) or "a human")
    if kind == "decision":
        text = f"{data.get('tool_name', '?')} {data.get('decision', '?')}"
        if data.get("reason"):
            text += f": {data['reason']}"
        if data.get("comment"):
            text += f" · “{data['comment']}”"
        return text
    if kind in ("claimed", "assigned"):
        return f"{data.get('tool_name', '?')} {kind} for {data.get('claimed_by', '?')}"
    if kind == "released":
        return f"{data.get('tool_name', '?')} released"
    if kind == "review_overdue":
        action = data.get("action") or "marked overdue"
        return f"{data.get('tool_name', '?')} review deadline passed ({action})"
    if kind == "cancel_requested":
        return f"{data.get('action', 'cancel')} requested"
    if kind == "cancelled":
        return f"cancelled ({data.get('action', 'interrupt')})"
    if kind == "retry":
        error = data.get("error") or {}
        return f"retry (attempt {data.get('attempt', '?')}): {error.get('message', '')}"
    if kind == "finished":
        return str(data.get("status") or "finished")
    if kind == "retried":
        edited = " with edited input" if data.get("edited_input") else ""
        return f"retried as run {str(data.get('run_id', '?'))[:8]}…{edited}"
    return kind


@register.filter
def event_summary(event: Any) -> str:
    text = _event_summary(event)
    return text if len(text) <= 160 else text[:159] + "…"


@register.filter
def event_data(event: Any) -> Any:
    """An event's data for display; a step's full state is left to the checkpoints."""
    data = dict(event.data or {})
    if event.kind == "step":
        data.pop("values", None)
    return data


@register.simple_tag
def hourly_chart(buckets: list[Any]) -> SafeString:
    """A stacked bar chart (SVG) of runs ended per hour: success, failed, cancelled."""
    width, height, top, bottom = 720, 150, 8, 20
    n = max(1, len(buckets))
    slot = width / n
    bar = max(2.0, slot - 4)
    peak = max([b.total for b in buckets] + [1])
    plot = height - top - bottom
    parts = []
    for i, b in enumerate(buckets):
        x = i * slot + (slot - bar) / 2
        y = height - bottom
        for value, cls in (
            (b.success, "success"),
            (b.failed, "error"),
            (b.cancelled, "interrupted"),
        ):
            if not value:
                continue
            h = plot * value / peak
            y -= h
            parts.append(
                format_html(
                    '<rect class="bar s-{}" x="{}" y="{}" width="{}" height="{}">'
                    "<title>{}:00 — {} {}</title></rect>",
                    cls,
                    f"{x:.1f}",
                    f"{y:.1f}",
                    f"{bar:.1f}",
                    f"{h:.1f}",
                    timezone.localtime(b.hour).strftime("%H"),
                    value,
                    {"success": "succeeded", "error": "failed", "interrupted": "cancelled"}[cls],
                )
            )
        if i % 3 == 0:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" class="axis">{}h</text>',
                    f"{x:.1f}",
                    height - 5,
                    timezone.localtime(b.hour).strftime("%H"),
                )
            )
    return format_html(
        '<svg class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}">'
        '<line x1="0" x2="{}" y1="{}" y2="{}" class="base"/>{}'
        '<text x="0" y="{}" class="axis">{}</text></svg>',
        width,
        height,
        f"Runs ended per hour over the last {n} hours",
        width,
        height - bottom,
        height - bottom,
        mark_safe("".join(parts)),  # noqa: S308 - built from format_html pieces above
        top + 8,
        f"max {peak}/h",
    )


@register.simple_tag(takes_context=True)
def form_csrf(context: template.Context) -> str:
    """The CSRF field for forms without JavaScript; empty in a websocket push (no request),
    where htmx sends the token from <body hx-headers> instead."""
    token = context.get("csrf_token")
    if not token:
        return ""
    return format_html('<input type="hidden" name="csrfmiddlewaretoken" value="{}">', token)


# What an Agent Inbox description may keep once rendered: text formatting, lists, quotes, code,
# tables and links. No images (a reviewer opening the inbox must not fetch a URL a graph
# chose), no attributes but a link's target; nh3 drops <script>, on* handlers and javascript:.
MARKDOWN_TAGS = {
    "p", "br", "hr", "strong", "em", "b", "i", "del", "code", "pre", "blockquote", "ul", "ol",
    "li", "a", "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
MARKDOWN_MAX = 20_000  # characters rendered; the rest is cut (the JSON view keeps it all)


@register.filter
def markdown_safe(text: Any) -> SafeString:
    """Markdown (untrusted) as HTML: rendered by Python-Markdown, then sanitised by nh3."""
    if text is None or text == "":
        return SafeString("")
    html = markdown_lib.markdown(str(text)[:MARKDOWN_MAX], extensions=["tables", "sane_lists"])
    cleaned = nh3.clean(
        html,
        tags=MARKDOWN_TAGS,
        attributes={"a": {"href", "title"}},
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(cleaned)  # noqa: S308 - cleaned by nh3 to the allow-list above


@register.filter
def agent_inbox(tc: Any, run: Any) -> dict[str, Any] | None:
    """The Agent Inbox request a graph's call asks (or asked) about; None for anything else."""
    return agent_inbox_request(run.agent_id, tc.suspend_payload)


@register.filter
def inbox_choices(request: dict[str, Any]) -> list[str]:
    return list(allowed_choices(request))
