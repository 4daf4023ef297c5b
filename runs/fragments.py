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

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.contrib.auth.context_processors import PermWrapper
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse

from runs import selectors
from runs.forms import DeclineForm, SchemaForm
from runs.models import Run, RunStatus, ToolCall, ToolCallStatus

T = "runs/_fragments/"


def can_review(user: Any) -> bool:
    return bool(user.has_perm("runs.review_run"))


def can_cancel(user: Any) -> bool:
    return bool(user.has_perm("runs.cancel_run"))


@dataclass
class CallForms:
    """The forms of one tool call card; bound ones carry a failed submission's errors."""

    edit: SchemaForm | None = None
    edit_json: SchemaForm | None = None  # the same edit as raw JSON, when `edit` shows fields
    answer: SchemaForm | None = None
    decline: DeclineForm | None = None
    open: str = ""  # which form to show expanded: "edit", "edit-json", "decline" or ""

    @property
    def bound(self) -> bool:
        return any(
            f is not None and f.is_bound
            for f in (self.edit, self.edit_json, self.answer, self.decline)
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
        return f"{self.tc.status}:{decided}:{int(self.open)}" + (
            ":bound" if self.forms.bound else ""
        )


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


def default_forms(run: Run, tc: ToolCall) -> CallForms:
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
) -> CallForms:
    """A card's forms after a failed submission: the submitted one bound, the others fresh."""
    forms = default_forms(run, tc)
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
        return {"page": page, "run": page.run, "cards": cards}

    def run_regions(
        self,
        page: selectors.RunPage,
        *,
        timeline_after: int | None = None,
        forms: dict[Any, CallForms] | None = None,
        with_io: bool = True,
    ) -> str:
        """Every region of the run page.

        A re-fetch (`timeline_after` None) replaces every region whole. A push sends tool call
        cards one by one (each with a token, so an unchanged card keeps what a reviewer is
        typing) and only the timeline events after `timeline_after`.
        """
        ctx = self.run_context(page, forms)
        parts = [
            self.render("run_header.html", **ctx),
            self.render("run_actions.html", **ctx),
            self.render("run_children.html", **ctx),
            self.render("checkpoints.html", **ctx),
        ]
        if with_io:
            parts.append(self.render("run_io.html", **ctx))
        if timeline_after is None:
            parts.append(self.render("tool_calls.html", **ctx))
        else:
            parts.extend(
                self.render("tool_call.html", run=page.run, page=page, card=card, insert_at=i)
                for i, card in enumerate(ctx["cards"])
            )
        oldest_loaded = page.events[-1].seq if page.events else 0
        if timeline_after is not None and (oldest_loaded <= timeline_after + 1 or not page.events):
            new = [e for e in page.events if e.seq > timeline_after]
            if new:
                parts.append(
                    self.render(
                        "timeline.html#append",
                        events=new,
                        after_seq=timeline_after,
                        run=page.run,
                    )
                )
        else:
            parts.append(self.render("timeline.html", **ctx))
        return "\n".join(parts)

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
                "overview_suspended.html",
                "overview_stuck.html",
                "overview_activity.html",
                "overview_chart.html",
            )
        ) + self.nav_inbox_count(overview.counts.get(RunStatus.SUSPENDED, 0))

    # --- thread -----------------------------------------------------------------------------

    def thread_regions(self, page: selectors.ThreadPage) -> str:
        ctx = {"tp": page, "thread": page.thread}
        return "\n".join(
            self.render(name, **ctx)
            for name in ("thread_header.html", "thread_runs.html", "thread_checkpoints.html")
        )


def run_url(run_id: UUID | str) -> str:
    return reverse("runs:run_detail", args=[run_id])
