"""Forms of the dashboard: list filters (all in the URL) and the decision/cancel forms.

Forms only parse and check shapes; the rules (may this tool call still be decided, do these
arguments match the tool's schema) are the services'. Their field errors come back as
`ValidationFailed.errors` and are put next to the matching field by `add_service_errors`.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import UUID

from django import forms
from django.contrib.auth.models import Group
from django.http import QueryDict

from runs.engine.registry import all_agents
from runs.exceptions import ValidationFailed
from runs.list_query import DEFAULT_SORT, MAX_QUERY_CHARS, check_sort
from runs.models import CancelAction, RunStatus
from runs.selectors import AuditFilters, RunFilters
from runs.selectors.search import RunListQuery

PAGE_SIZE = 50
BULK_CONFIRM_ABOVE = 20  # more runs than this need the count typed to confirm


def agent_choices() -> list[tuple[str, str]]:
    return [("", "any agent")] + [(a, a) for a in sorted(all_agents())]


def tool_choices() -> list[tuple[str, str]]:
    names = sorted({t.name for a in all_agents().values() for t in a.tools})
    return [("", "any tool")] + [(n, n) for n in names]


class DateTimeInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


def _choice_field(form: forms.Form, name: str) -> forms.ChoiceField:
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    return field


class _FilterForm(forms.Form):
    """GET filters: invalid values are reported and ignored, never a 500."""

    def filters_kwargs(self) -> dict[str, Any]:
        self.is_valid()
        data = getattr(self, "cleaned_data", {})
        return {k: v for k, v in data.items() if k not in self.errors}


class InboxFilterForm(_FilterForm):
    agent = forms.ChoiceField(required=False)
    tool = forms.ChoiceField(required=False)
    thread = forms.UUIDField(required=False)
    resource = forms.CharField(required=False, max_length=255)
    date_from = forms.DateTimeField(required=False, label="Created from", widget=DateTimeInput())
    date_to = forms.DateTimeField(required=False, label="to", widget=DateTimeInput())
    waiting = forms.IntegerField(required=False, min_value=0, label="Waiting longer than (min)")
    order = forms.ChoiceField(
        required=False, choices=[("newest", "newest first"), ("oldest", "oldest first")]
    )
    assigned = forms.ChoiceField(
        required=False,
        label="Claimed by",
        choices=[("all", "anyone or nobody"), ("mine", "me"), ("unassigned", "nobody")],
    )
    overdue = forms.BooleanField(required=False, label="Overdue only")
    page = forms.IntegerField(required=False, min_value=1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "agent").choices = agent_choices()
        _choice_field(self, "tool").choices = tool_choices()

    def run_filters(self, viewer: str = "") -> RunFilters:
        """The filters; `viewer` (a username) is whose items `assigned=mine` lists."""
        d = self.filters_kwargs()
        assigned = d.get("assigned") or None
        return RunFilters(
            assigned=None if assigned == "all" else assigned,
            viewer=viewer,
            overdue=bool(d.get("overdue")),
            agent_id=d.get("agent") or None,
            tool_name=d.get("tool") or None,
            thread_id=d.get("thread"),
            resource_id=d.get("resource") or None,
            created_from=d.get("date_from"),
            created_to=d.get("date_to"),
            waiting_longer_than=timedelta(minutes=d["waiting"]) if d.get("waiting") else None,
        )

    @property
    def oldest_first(self) -> bool:
        return self.filters_kwargs().get("order") == "oldest"

    @property
    def ordering(self) -> tuple[str, ...]:
        return ("suspended_at", "id") if self.oldest_first else ("-suspended_at", "-id")

    @property
    def page_number(self) -> int:
        return self.filters_kwargs().get("page") or 1


class RunFilterForm(_FilterForm):
    status = forms.MultipleChoiceField(
        required=False, choices=RunStatus.choices, widget=forms.CheckboxSelectMultiple
    )
    agent = forms.ChoiceField(required=False)
    thread = forms.UUIDField(required=False)
    resource = forms.CharField(required=False, max_length=255)
    created_from = forms.DateTimeField(required=False, widget=DateTimeInput())
    created_to = forms.DateTimeField(required=False, widget=DateTimeInput())
    stuck = forms.BooleanField(required=False)
    pending_longer = forms.IntegerField(
        required=False, min_value=0, label="Pending longer than (min)"
    )
    subagents = forms.BooleanField(required=False, label="Include sub-agent runs")
    q = forms.CharField(
        required=False,
        max_length=MAX_QUERY_CHARS,
        label="Search",
        help_text='words or "a phrase" in input, output, tool calls, errors, thread metadata; '
        "or the start of a run id",
    )
    sort = forms.CharField(required=False, widget=forms.HiddenInput)
    page = forms.IntegerField(required=False, min_value=1)

    ordering = ("-created_at", "-id")

    def clean_sort(self) -> str:
        try:
            return check_sort(self.cleaned_data.get("sort"))
        except ValidationFailed as exc:
            raise forms.ValidationError(exc.detail) from None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "agent").choices = agent_choices()

    def run_filters(self) -> RunFilters:
        d = self.filters_kwargs()
        return RunFilters(
            status=d.get("status") or None,
            agent_id=d.get("agent") or None,
            thread_id=d.get("thread"),
            resource_id=d.get("resource") or None,
            created_from=d.get("created_from"),
            created_to=d.get("created_to"),
            stuck=bool(d.get("stuck")),
            pending_longer_than=(
                timedelta(minutes=d["pending_longer"]) if d.get("pending_longer") else None
            ),
            top_level_only=not d.get("subagents"),
        )

    def list_query(self) -> RunListQuery:
        d = self.filters_kwargs()
        return RunListQuery(
            filters=self.run_filters(), q=d.get("q") or "", sort=d.get("sort") or DEFAULT_SORT
        )

    @property
    def page_number(self) -> int:
        return self.filters_kwargs().get("page") or 1


AUDIT_ACTIONS = [
    "approve",
    "decline",
    "answer",
    "cancel_interrupt",
    "cancel_rollback",
    "run_delete",
    "thread_delete",
    "state_update",
]


class AuditFilterForm(_FilterForm):
    actor = forms.CharField(required=False, max_length=150)
    action = forms.ChoiceField(
        required=False, choices=[("", "any action")] + [(a, a) for a in AUDIT_ACTIONS]
    )
    run = forms.UUIDField(required=False)
    thread = forms.UUIDField(required=False)
    agent = forms.ChoiceField(required=False)
    resource = forms.CharField(required=False, max_length=255)
    date_from = forms.DateTimeField(required=False, label="From", widget=DateTimeInput())
    date_to = forms.DateTimeField(required=False, label="To", widget=DateTimeInput())
    page = forms.IntegerField(required=False, min_value=1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "agent").choices = agent_choices()

    def audit_filters(self) -> AuditFilters:
        d = self.filters_kwargs()
        return AuditFilters(
            actor=d.get("actor") or None,
            action=d.get("action") or None,
            run_id=d.get("run"),
            thread_id=d.get("thread"),
            agent_id=d.get("agent") or None,
            resource_id=d.get("resource") or None,
            created_from=d.get("date_from"),
            created_to=d.get("date_to"),
        )

    @property
    def page_number(self) -> int:
        return self.filters_kwargs().get("page") or 1


# --- decisions ------------------------------------------------------------------------------


class ToolCallForm(forms.Form):
    tool_call_id = forms.CharField(max_length=128)
    # Where the action was taken: the inbox answers with its row, the run page with its regions.
    origin = forms.ChoiceField(
        required=False, choices=[("run", "run"), ("inbox", "inbox")], initial="run"
    )


class DeclineForm(ToolCallForm):
    reason = forms.CharField(
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "Why? The agent sees this."}),
    )


class InboxChoiceForm(ToolCallForm):
    """One of the Agent Inbox choices on a graph's request (runs/services/agent_inbox.py)."""

    inbox = forms.ChoiceField(choices=[(c, c) for c in ("accept", "edit", "respond", "ignore")])
    text = forms.CharField(
        required=False,
        max_length=10_000,
        strip=False,
        label="Response",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "The graph gets this text."}),
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("inbox") == "respond" and not (data.get("text") or "").strip():
            self.add_error("text", "Write a response.")
        return data


def schema_of_values(values: Any) -> dict[str, Any] | None:
    """A JSON schema typed by example (an Agent Inbox request's arguments carry no schema):
    one property per key, typed by its value; None when `values` is not an object."""
    if not isinstance(values, dict):
        return None
    types = {bool: "boolean", int: "integer", float: "number", str: "string"}
    props: dict[str, Any] = {}
    for key, value in values.items():
        kind = types.get(type(value))
        props[key] = {"type": kind} if kind else {}
        if kind == "string" and ("\n" in value or len(value) > 80):
            props[key]["maxLength"] = 1_000_000  # a text area (_field_for)
    # Every argument the request had stays (an empty string only if it was empty).
    required = [k for k, v in values.items() if not isinstance(v, bool) and v != ""]
    return {"type": "object", "properties": props, "required": required}


def _field_for(name: str, schema: dict[str, Any], required: bool) -> forms.Field:
    """A form field for one JSON-schema property (strings, numbers, booleans, enums)."""
    kind = schema.get("type")
    label = schema.get("title") or name.replace("_", " ")
    help_text = schema.get("description", "")
    common: dict[str, Any] = {"label": label, "help_text": help_text, "required": required}
    if "enum" in schema:
        choices = [(json.dumps(v), str(v)) for v in schema["enum"]]
        if not required:
            choices = [("", "—"), *choices]
        return forms.TypedChoiceField(
            choices=choices, coerce=json.loads, empty_value=None, **common
        )
    if kind == "boolean":
        return forms.BooleanField(**{**common, "required": False})
    if kind == "integer":
        return forms.IntegerField(
            min_value=schema.get("minimum"), max_value=schema.get("maximum"), **common
        )
    if kind == "number":
        return forms.FloatField(
            min_value=schema.get("minimum"), max_value=schema.get("maximum"), **common
        )
    if kind == "string":
        field = forms.CharField(
            min_length=schema.get("minLength") or None,
            max_length=schema.get("maxLength"),
            strip=False,
            **common,
        )
        if (schema.get("maxLength") or 0) > 200:
            field.widget = forms.Textarea(attrs={"rows": 3})
        return field
    return forms.JSONField(**common, widget=forms.Textarea(attrs={"rows": 3}))


SIMPLE_TYPES = {"string", "integer", "number", "boolean"}


def schema_is_simple(schema: dict[str, Any] | None) -> bool:
    """An object schema whose properties are all scalars or enums: shown as fields."""
    if not schema or schema.get("type") != "object":
        return False
    props = schema.get("properties") or {}
    return bool(props) and all(
        isinstance(p, dict) and ("enum" in p or p.get("type") in SIMPLE_TYPES)
        for p in props.values()
    )


class SchemaForm(ToolCallForm):
    """Fields generated from a JSON schema, or one JSON text area when the schema is not flat.

    `data_value()` returns the JSON object to hand to the service: optional fields left empty
    are omitted rather than sent as "" (the schema decides what empty means).
    """

    json_field = "json"

    def __init__(
        self,
        *args: Any,
        schema: dict[str, Any] | None,
        initial_value: Any = None,
        json_mode: bool = False,
        **kwargs: Any,
    ) -> None:
        data = args[0] if args else kwargs.get("data")
        mode = "json" if json_mode else (data.get("mode") if data is not None else None)
        super().__init__(*args, **kwargs)
        self.schema = schema
        extra_keys = isinstance(initial_value, dict) and set(initial_value) - set(
            (schema or {}).get("properties") or {}
        )
        self.as_fields = schema_is_simple(schema) and mode != "json" and not extra_keys
        if self.as_fields:
            required = set((schema or {}).get("required") or [])
            for name, prop in (schema or {}).get("properties", {}).items():
                self.fields[f"f_{name}"] = _field_for(name, prop, name in required)
                if isinstance(initial_value, dict) and name in initial_value:
                    value = initial_value[name]
                    if "enum" in prop:
                        value = json.dumps(value)
                    self.fields[f"f_{name}"].initial = value
        else:
            self.fields[self.json_field] = forms.JSONField(
                label="JSON",
                widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "mono"}),
                initial=initial_value if initial_value is not None else {},
            )

    @property
    def schema_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name.startswith("f_") or name == "json"]

    def data_value(self) -> Any:
        if not self.as_fields:
            return self.cleaned_data[self.json_field]
        value = {}
        for name in self.fields:
            if not name.startswith("f_"):
                continue
            field_value = self.cleaned_data.get(name)
            if field_value is None or (field_value == "" and not self.fields[name].required):
                continue
            value[name[2:]] = field_value
        return value

    def add_service_errors(self, exc: ValidationFailed, prefix: str) -> None:
        """Put the service's schema errors ("resume_data.city") next to their field."""
        for error in exc.errors or [{"field": prefix, "message": exc.detail}]:
            field = str(error.get("field") or "")
            name = field[len(prefix) + 1 :].split(".")[0] if field.startswith(f"{prefix}.") else ""
            target = f"f_{name}" if self.as_fields and f"f_{name}" in self.fields else None
            if target is None and not self.as_fields:
                target = self.json_field
            self.add_error(target, error.get("message") or exc.detail)


class CancelForm(forms.Form):
    action = forms.ChoiceField(choices=CancelAction.choices)
    reason = forms.CharField(required=False, max_length=2000)


class BulkSelectionForm(forms.Form):
    """A bulk action's selection (ids, or every run matching the list's filters) and its
    two steps: a preview that counts, then a confirmation (typed above BULK_CONFIRM_ABOVE)."""

    run_ids = forms.TypedMultipleChoiceField(required=False, coerce=UUID, choices=())
    all_matching = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=2000)
    step = forms.ChoiceField(choices=[("preview", "preview"), ("confirm", "confirm")])
    expected = forms.IntegerField(required=False, min_value=0)
    confirm_text = forms.CharField(required=False, max_length=20)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Any UUID is a valid choice; which runs exist is the service's business.
        self.fields["run_ids"].valid_value = lambda value: True  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("all_matching") and not data.get("run_ids"):
            raise forms.ValidationError(
                "Select at least one run, or every run matching the filter."
            )
        return data

    def needs_typed_confirmation(self, count: int) -> bool:
        return count > BULK_CONFIRM_ABOVE

    def confirmation_ok(self) -> bool:
        expected = self.cleaned_data.get("expected") or 0
        if not self.needs_typed_confirmation(expected):
            return True
        return (self.cleaned_data.get("confirm_text") or "").strip() == str(expected)


class BulkCancelForm(BulkSelectionForm):
    action = forms.ChoiceField(choices=CancelAction.choices)
    # Runs waiting for a human are left out of a bulk cancel unless ticked: one click must not
    # throw away open reviews.
    include_suspended = forms.BooleanField(required=False)


# --- saved views ----------------------------------------------------------------------------


class SavedViewForm(forms.Form):
    """Save the runs list's current query (its filters, search and sort) under a name."""

    name = forms.CharField(max_length=100)
    query = forms.CharField(required=False, max_length=2000)
    shared_with_group = forms.ModelChoiceField(
        queryset=Group.objects.none(), required=False, empty_label="only me"
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A view is shared only with a group its owner belongs to.
        field = self.fields["shared_with_group"]
        assert isinstance(field, forms.ModelChoiceField)
        field.queryset = user.groups.order_by("name")

    def clean_query(self) -> str:
        # Each value is checked as the runs list reads it: a view never saves a broken filter.
        query = self.cleaned_data.get("query") or ""
        form = RunFilterForm(QueryDict(query))
        if not form.is_valid():
            raise forms.ValidationError(
                "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in form.errors.items())
            )
        return query


class RetryForm(forms.Form):
    """Retry one ended run: its input as JSON (prefilled, editable), where, and why."""

    input = forms.CharField(required=False, widget=forms.Textarea, max_length=1_000_000)
    new_thread = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, max_length=2000)

    def clean_input(self) -> Any:
        text = (self.cleaned_data.get("input") or "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None


class BulkRetryForm(BulkSelectionForm):
    new_thread = forms.BooleanField(required=False)
