"""The dashboard's live regions, rendered for one viewer by views and consumers alike.

Every region is one template under templates/runs/_fragments/ whose root element has a stable
id. Rendered with `oob=True` it carries `hx-swap-oob`, so the same HTML works as an htmx
response and as a websocket push (htmx's ws extension swaps pushed elements by id). Regions of
one run carry `data-seq` (the run's last event number): static/runs/app.js drops a push older
than what the page shows and re-fetches a region when it sees a gap.

Permissions shape the HTML (a Support user gets no Approve button), so a region is rendered
for a set of permissions: sockets share a render only with sockets of the same permissions
(runs/consumers.py). No fragment shows who is looking at it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.contrib.auth.context_processors import PermWrapper
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse

from runs import selectors
from runs.forms import DeclineForm, InboxChoiceForm, SchemaForm, schema_of_values
from runs.models import Run, RunEvent, RunStatus, ToolCall, ToolCallStatus
from runs.permissions import can_cancel, can_review
from runs.services.agent_inbox import agent_inbox_request, allowed_choices

__all__ = [
    "CallForms",
    "Card",
    "Fragments",
    "InboxForms",
    "RunPushState",
    "can_cancel",
    "can_review",
]

T = "runs/_fragments/"
EVENTS_PER_FRAME = 15
# A websocket frame of a run page's push stays under this many bytes where it can: the
# regions and changed tool call cards are packed into frames up to it (one part bigger
# than it goes alone). A page that catches up after a while gets several small frames the
# browser swaps one by one, not one big one that blocks it.
FRAME_BUDGET = 8 * 1024


@dataclass
class InboxForms:
    """A graph's Agent Inbox request: exactly the choices its config allows."""

    request: dict[str, Any]  # the HumanInterrupt (action_request, config, description)
    choices: list[str]
    edit: SchemaForm | None = None  # the request's arguments, one field each
    respond: InboxChoiceForm | None = None


@dataclass
class CallForms:
    """The forms of one tool call card; bound ones carry a failed submission's errors."""

    edit: SchemaForm | None = None
    edit_json: SchemaForm | None = None  # the same edit as raw JSON, when `edit` shows fields
    answer: SchemaForm | None = None
    decline: DeclineForm | None = None
    inbox: InboxForms | None = None  # instead of the others, for an Agent Inbox request
    # Which form to show expanded: "edit", "edit-json", "decline", "inbox-edit",
    # "inbox-respond" or "".
    open: str = ""

    @property
    def bound(self) -> bool:
        inbox = (self.inbox.edit, self.inbox.respond) if self.inbox else ()
        return any(
            f is not None and f.is_bound
            for f in (self.edit, self.edit_json, self.answer, self.decline, *inbox)
        )


@dataclass
class Card:
    """One tool call as its card shows it."""

    tc: ToolCall
    forms: CallForms
    open: bool  # still decidable: the run is suspended and the call waits
    decision_point: bool  # a human decides (or decided) this call

    @property
    def token(self) -> str:
        # Same token = same state: a push leaves the card (and a half-typed form) alone.
        decided = self.tc.decided_at.timestamp() if self.tc.decided_at else ""
        # A claim changes what the card shows (who has it): a new claim is a new state.
        claim = f"{self.tc.claimed_by}@{self.tc.claimed_until.timestamp() if self.tc.claimed_until else ''}"
        return f"{self.tc.status}:{decided}:{int(self.open)}:{claim}" + (
            ":bound" if self.forms.bound else ""
        )


@dataclass
class RunPushState:
    """What one socket has sent to its run page, so that a push carries only what changed:
    the events after `seq`, the header, and the other regions only when they changed."""

    seq: int  # the run's last event number the page shows
    card_tokens: dict[Any, str] | None = None  # None until the first push
    actions_token: str | None = None
    children_key: tuple | None = None
    checkpoint_step: int | None = None  # the newest checkpoint step the page shows
    extra: dict[str, Any] = field(default_factory=dict)


def _header_key(run: Run) -> tuple | None:
    """What the run header shows but its duration and event count; None when it must be
    rendered whole every time (an ended run's header lists its retries, which are other rows)."""
    if run.is_terminal:
        return None
    return (
        run.status,
        run.cancel_requested_at,
        run.cancel_action,
        run.behind_run_id,
        run.started_at,
        run.suspended_at,
        run.finished_at,
        run.attempt,
        run.lease_owner,
        run.cancel_reason,
        run.resource_id,
        run.thread_id,
        run.retry_of_id,
        run.parent_run_id,
    )


def tool_call_ids_named(events: Iterable[RunEvent]) -> set[str]:
    """Tool calls that events mention (created, suspended on, decided, finished)."""
    ids: set[str] = set()
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if data.get("tool_call_id"):
            ids.add(str(data["tool_call_id"]))
        for item in data.get("tool_calls") or ():
            if isinstance(item, dict):
                ids.add(str(item.get("tool_call_id") or item.get("id") or ""))
    return ids


def tool_schema(run: Run, tc: ToolCall) -> dict[str, Any] | None:
    """The argument schema of a tool call's tool (None for a delegation or unknown tool)."""
    from runs.engine.registry import all_agents

    if tc.child_run_id is not None:
        return None
    agent = all_agents().get(run.agent_id)
    tool = agent.get_tool(tc.tool_name) if agent else None
    return tool.parameters if tool else None


def form_id(tc: ToolCall) -> str:
    """Field ids unique per tool call card (several cards share one page)."""
    return f"tc{tc.pk.hex[:12]}-%s"


def edit_forms(run: Run, tc: ToolCall, bound: SchemaForm | None = None) -> CallForms:
    """The edit-and-approve forms (fields, plus raw JSON), one of them maybe bound with errors."""
    schema = tool_schema(run, tc)
    forms = CallForms(open="edit")
    forms.edit = SchemaForm(schema=schema, initial_value=tc.args, auto_id=form_id(tc))
    if forms.edit.as_fields:
        forms.edit_json = SchemaForm(
            schema=schema, initial_value=tc.args, json_mode=True, auto_id=form_id(tc) + "-json"
        )
    if bound is not None:
        if bound.as_fields or forms.edit_json is None:
            forms.edit = bound
        else:
            forms.edit_json, forms.open = bound, "edit-json"
    return forms


def inbox_edit_form(tc: ToolCall, request: dict[str, Any], data: Any = None) -> SchemaForm:
    """The Agent Inbox edit: the request's arguments, one field each, typed by their values."""
    args = request["action_request"].get("args")
    return SchemaForm(
        data, schema=schema_of_values(args), initial_value=args, auto_id=form_id(tc) + "-ie"
    )


def inbox_forms(run: Run, tc: ToolCall) -> InboxForms | None:
    """The Agent Inbox choices of a graph's waiting call (None for any other call)."""
    request = agent_inbox_request(run.agent_id, tc.suspend_payload) if tc.is_waiting else None
    if request is None:
        return None
    choices = allowed_choices(request)
    forms = InboxForms(request=request, choices=list(choices))
    if "edit" in choices:
        forms.edit = inbox_edit_form(tc, request)
    if "respond" in choices:
        initial = {"tool_call_id": tc.tool_call_id, "inbox": "respond"}
        forms.respond = InboxChoiceForm(initial=initial, auto_id=form_id(tc) + "-ir")
    return forms


def default_forms(run: Run, tc: ToolCall) -> CallForms:
    inbox = inbox_forms(run, tc)
    if inbox is not None:
        return CallForms(inbox=inbox)
    forms = CallForms()
    initial = {"tool_call_id": tc.tool_call_id}
    if tc.status == ToolCallStatus.AWAITING_APPROVAL:
        forms = edit_forms(run, tc)
        forms.open = ""
    if tc.status == ToolCallStatus.AWAITING_INPUT:
        forms.answer = SchemaForm(schema=tc.resume_schema, initial=initial, auto_id=form_id(tc))
    if tc.is_waiting:
        forms.decline = DeclineForm(initial=initial, auto_id=form_id(tc))
    return forms


def bound_forms(
    run: Run,
    tc: ToolCall,
    *,
    edit: SchemaForm | None = None,
    answer: SchemaForm | None = None,
    decline: DeclineForm | None = None,
    inbox_edit: SchemaForm | None = None,
    inbox_respond: InboxChoiceForm | None = None,
) -> CallForms:
    """A card's forms after a failed submission: the submitted one bound, the others fresh."""
    forms = default_forms(run, tc)
    if forms.inbox is not None and inbox_edit is not None:
        forms.inbox.edit, forms.open = inbox_edit, "inbox-edit"
    if forms.inbox is not None and inbox_respond is not None:
        forms.inbox.respond, forms.open = inbox_respond, "inbox-respond"
    if edit is not None:
        edited = edit_forms(run, tc, bound=edit)
        forms.edit, forms.edit_json, forms.open = edited.edit, edited.edit_json, edited.open
    if answer is not None:
        forms.answer = answer
    if decline is not None:
        forms.decline, forms.open = decline, "decline"
    return forms


class Fragments:
    def __init__(self, user: Any, request: HttpRequest | None = None) -> None:
        self.user = user
        self.request = request

    def render(self, name: str, /, **context: Any) -> str:
        base: dict[str, Any] = {"oob": True}
        if self.request is None:
            # A websocket push has no request: user and perms come from the socket's session,
            # and forms rely on the CSRF header htmx sends from <body hx-headers>.
            base.update(
                user=self.user,
                perms=PermWrapper(self.user),
                csrf_token="",
            )
        template = name if "/" in name else T + name
        return render_to_string(template, {**base, **context}, request=self.request)

    # --- flash and small bits ---------------------------------------------------------------

    def flash(self, text: str, level: str = "info") -> str:
        return self.render("flash.html", flash_text=text, flash_level=level)

    def row_delete(self, dom_id: str, seq: int = 0) -> str:
        return self.render("row_delete.html", dom_id=dom_id, seq=seq)

    def nav_inbox_count(self, count: int) -> str:
        return self.render("nav_inbox_count.html", inbox_count=count)

    # --- run page ---------------------------------------------------------------------------

    def run_context(
        self, page: selectors.RunPage, forms: dict[Any, CallForms] | None = None
    ) -> dict[str, Any]:
        forms = forms or {}
        suspended = page.run.status == RunStatus.SUSPENDED
        cards = [
            Card(
                tc=tc,
                forms=forms.get(tc.pk) or default_forms(page.run, tc),
                open=suspended and tc.is_waiting,
                decision_point=bool(
                    tc.requires_approval
                    or tc.resume_schema is not None
                    or tc.decided_by
                    or tc.is_waiting
                ),
            )
            for tc in page.tool_calls
        ]
        return {
            "page": page,
            "run": page.run,
            "cards": cards,
        }

    def run_regions(
        self,
        page: selectors.RunPage,
        *,
        timeline_after: int | None = None,
        forms: dict[Any, CallForms] | None = None,
        with_io: bool = True,
    ) -> str:
        """Every region of the run page, whole (a re-fetch, a decision's answer).

        With `timeline_after` it is a push to a page that shows the events up to that seq.
        """
        if timeline_after is not None:
            sent = RunPushState(seq=timeline_after)
            return "\n".join(self.run_push(page, sent, with_io=with_io))
        ctx = self.run_context(page, forms)
        return "\n".join(
            [
                *(
                    self.render(name, **ctx)
                    for name in (
                        "run_header.html",
                        "run_actions.html",
                        "run_children.html",
                        "checkpoints.html",
                        "run_io.html",
                        "tool_calls.html",
                        "timeline.html",
                    )
                ),
                self.run_chat(page),
            ]
        )

    def run_chat(self, page: selectors.RunPage) -> str:
        """The run's conversation (bounded to the newest turns; see chat.html)."""
        return self.render(
            "chat.html", chat_scope="run", chat_owner=page.run, chat_values=page.state, chat_limit=0
        )

    def run_push(self, page: selectors.RunPage, sent: RunPushState, *, with_io: bool) -> list[str]:
        """What a page that got `sent` so far needs: the header, the events after `sent.seq`
        (appended), the tool call cards that are new or changed, and the other regions only
        when they changed (`with_io`: input/output, state and checkpoints, throttled by the
        caller). Updates `sent`. Returns websocket frames: the header and the regions, then
        the changed cards, packed into frames of at most FRAME_BUDGET bytes; then the new
        events in chunks of EVENTS_PER_FRAME, oldest first, each continuing the one before (a
        page that catches up after a while gets several small frames, not one big one).

        Cards and events are bounded by the page's window (selectors.run_page); when more
        events came than the window holds, the append says so (`data-after-seq` past what the
        page shows) and the browser re-fetches its regions.
        """
        ctx = self.run_context(page)
        run = page.run
        header_key = _header_key(run)
        if header_key is None or header_key != sent.extra.get("header_key"):
            parts = [self.render("run_header.html", **ctx)]
        else:
            # A run stepping on: the header is as the page shows it but for two fields.
            parts = [self.render("run_header.html#progress", run=run, progress=True)]
        sent.extra["header_key"] = header_key
        actions_token = f"{run.status}:{run.cancel_action or ''}"
        if actions_token != sent.actions_token:
            parts.append(self.render("run_actions.html", **ctx))
            sent.actions_token = actions_token
        children_key = (run.status, tuple((c.pk, c.status) for c in page.children))
        if children_key != sent.children_key:
            parts.append(self.render("run_children.html", **ctx))
            sent.children_key = children_key
        if with_io:
            parts.append(self.render("run_io.html", **ctx))
        # The conversation grows with every step and is never pushed: once the run stops
        # (suspended or ended) the push asks the page to fetch it, so a reviewer reads it
        # as it is then.
        if run.status != sent.extra.get("chat_status"):
            sent.extra["chat_status"] = run.status
            if run.status == RunStatus.SUSPENDED or run.is_terminal:
                parts.append(self.render("chat_reload.html", run_id=run.id))
        parts.append(self._checkpoints_push(page, sent, ctx))

        new_events = [e for e in page.events if e.seq > sent.seq]
        named = tool_call_ids_named(new_events)
        known = sent.card_tokens
        tokens: dict[Any, str] = {}
        for card in ctx["cards"]:
            tokens[card.tc.pk] = card.token
            before = None if known is None else known.get(card.tc.pk)
            if card.token == before:
                continue
            # Before the first push the page's own render is all we know: a card changed
            # since then is named by an event. After it, a card not seen yet is a new one.
            if before is None and known is None and card.tc.tool_call_id not in named:
                continue
            parts.append(
                self.render("tool_call.html", run=run, page=page, card=card, insert_at="end")
            )
        sent.card_tokens = tokens

        frames = pack_frames(parts)
        if new_events:
            oldest = new_events[-1].seq
            # Contiguous with what the page shows, or a gap the browser re-fetches over.
            after = sent.seq if oldest <= sent.seq + 1 else oldest - 1
            for end in range(len(new_events), 0, -EVENTS_PER_FRAME):
                chunk = new_events[max(0, end - EVENTS_PER_FRAME) : end]
                frames.append(
                    self.render("timeline.html#append", events=chunk, after_seq=after, run=run)
                )
                after = chunk[0].seq
        # The run row is read before its events, which can be newer (a commit in between):
        # remember the row's seq, so the next change renders again; the browser drops
        # events it already has.
        sent.seq = max(sent.seq, run.last_seq)
        return frames

    def _checkpoints_push(
        self, page: selectors.RunPage, sent: RunPushState, ctx: dict[str, Any]
    ) -> str:
        """New checkpoint rows (prepended) and the count; the region whole when the page had
        none (no rows to prepend to)."""
        newest = page.checkpoints[0].step if page.checkpoints else None
        shown = sent.checkpoint_step
        if newest is None or newest == shown:
            return ""
        sent.checkpoint_step = newest
        if shown is None:
            return self.render("checkpoints.html", **ctx)
        new = [cp for cp in page.checkpoints if cp.step > shown]
        oldest = new[-1].step if new else newest
        after = shown if oldest <= shown + 1 or len(new) < len(page.checkpoints) else oldest - 1
        return self.render(
            "checkpoints.html#append", checkpoints=new, after_step=after, run=page.run
        ) + self.render("checkpoints.html#count", page=page, count_oob=True)

    def tool_call_card(self, page: selectors.RunPage, tc: ToolCall, forms: CallForms) -> str:
        ctx = self.run_context(page, {tc.pk: forms})
        card = next(c for c in ctx["cards"] if c.tc.pk == tc.pk)
        return self.render("tool_call.html", run=page.run, page=page, card=card)

    def run_deleted(self, run_id: UUID | str, seq: int) -> str:
        """What a run page shows once its run was rolled back (it no longer exists)."""
        return self.render("run_deleted.html", run_id=run_id, seq=seq)

    # --- lists ------------------------------------------------------------------------------

    def inbox_row(
        self,
        run: Run,
        *,
        insert_at: int | None = None,
        decided: bool = False,
        origin: str = "inbox",
    ) -> str:
        return self.render(
            "inbox_row.html",
            run=run,
            insert_at=insert_at,
            decided=decided or run.status != RunStatus.SUSPENDED,
            origin=origin,
        )

    def run_row(self, run: Run, *, insert_at: int | None = None) -> str:
        return self.render("run_row.html", run=run, insert_at=insert_at)

    def list_total(self, dom_id: str, total: int, noun: str) -> str:
        return self.render("list_total.html", dom_id=dom_id, total=total, noun=noun)

    # --- overview ---------------------------------------------------------------------------

    def overview_regions(self, overview: selectors.Overview) -> str:
        ctx = {"ov": overview}
        return "\n".join(
            self.render(name, **ctx)
            for name in (
                "overview_counts.html",
                "overview_reviews.html",
                "overview_suspended.html",
                "overview_stuck.html",
                "overview_activity.html",
                "overview_chart.html",
            )
        ) + self.nav_inbox_count(overview.counts.get(RunStatus.SUSPENDED, 0))

    # --- thread -----------------------------------------------------------------------------

    def thread_region_list(self, page: selectors.ThreadPage) -> list[tuple[str, str]]:
        ctx = {"tp": page, "thread": page.thread}
        return [
            (dom_id, self.render(f"{name}.html", **ctx))
            for dom_id, name in (
                ("thread-header", "thread_header"),
                ("thread-runs", "thread_runs"),
                ("thread-checkpoints", "thread_checkpoints"),
            )
        ]

    def thread_regions(self, page: selectors.ThreadPage) -> str:
        return "\n".join(html for _, html in self.thread_region_list(page))


def pack_frames(parts: list[str], budget: int = FRAME_BUDGET) -> list[str]:
    """`parts` joined in order into as few frames as keep each under `budget` bytes (a part
    bigger than that is a frame of its own). Always at least one frame: the first part
    (the header) leads it."""
    frames: list[str] = []
    current: list[str] = []
    size = 0
    for part in parts:
        if not part:
            continue
        n = len(part.encode())
        if current and size + n > budget:
            frames.append("\n".join(current))
            current, size = [], 0
        current.append(part)
        size += n + 1
    if current or not frames:
        frames.append("\n".join(current))
    return frames


def run_url(run_id: UUID | str) -> str:
    return reverse("runs:run_detail", args=[run_id])
