"""Admin: inspection of every model. JSON is shown read-only and readable; the one write action
(cancel selected runs) goes through the service layer like every other surface."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from runs import services
from runs.exceptions import RunsError
from runs.models import (
    ApiKey,
    AuditEntry,
    Checkpoint,
    Delivery,
    NotificationEvent,
    NotificationRule,
    Run,
    RunEvent,
    StaffScope,
    Thread,
    ToolCall,
)
from runs.permissions import can_see_admin
from runs.webhooks import WebhookRefused, check_url


def pretty_json(value: object) -> str:
    # format_html escapes the text: tool arguments are untrusted.
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > 20_000:
        text = text[:20_000] + "\n… (truncated)"
    return format_html('<pre style="white-space:pre-wrap;max-width:70em">{}</pre>', text)


def json_display(name: str) -> Callable[[admin.ModelAdmin[Model], Model], str]:
    """An admin method showing JSON field `name` escaped and indented. Use it as
    `<name>_pretty = json_display("<name>")`, list "<name>_pretty" in `readonly_fields` and the
    field itself in `exclude`."""

    @admin.display(description=name)
    def show(self: admin.ModelAdmin[Model], obj: Model) -> str:
        return pretty_json(getattr(obj, name))

    return show


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Thread)
class ThreadAdmin(ReadOnlyAdmin):
    list_display = ("id", "status", "resource_id", "created_at", "updated_at")
    list_filter = ("status", "created_at")
    search_fields = ("=id", "resource_id")
    exclude = ("metadata", "values")
    readonly_fields = (
        "id",
        "status",
        "resource_id",
        "created_at",
        "updated_at",
        "metadata_pretty",
        "values_pretty",
    )
    metadata_pretty = json_display("metadata")
    values_pretty = json_display("values")
    date_hierarchy = "created_at"


class ToolCallInline(admin.TabularInline):
    model = ToolCall
    fk_name = "run"
    extra = 0
    can_delete = False
    fields = (
        "tool_call_id",
        "tool_name",
        "status",
        "requires_approval",
        "decided_by",
        "decided_at",
    )
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent_id", "status", "thread_id", "resource_id", "attempt", "created_at")
    list_filter = ("status", "agent_id", "created_at")
    search_fields = ("=id", "=thread__id", "resource_id", "agent_id")
    exclude = ("input", "output", "error", "metadata", "kwargs")
    readonly_fields = (
        "id",
        "thread",
        "agent_id",
        "parent_run",
        "resource_id",
        "status",
        "multitask_strategy",
        "attempt",
        "lease_owner",
        "lease_expires_at",
        "deadline_at",
        "not_before",
        "cancel_action",
        "cancel_requested_at",
        "cancel_reason",
        "last_seq",
        "created_at",
        "started_at",
        "suspended_at",
        "finished_at",
        "updated_at",
        "input_pretty",
        "output_pretty",
        "error_pretty",
        "metadata_pretty",
        "kwargs_pretty",
    )
    input_pretty = json_display("input")
    output_pretty = json_display("output")
    error_pretty = json_display("error")
    metadata_pretty = json_display("metadata")
    kwargs_pretty = json_display("kwargs")
    list_select_related = ()
    date_hierarchy = "created_at"
    inlines = [ToolCallInline]
    actions = ["cancel_interrupt"]

    @admin.action(description="Cancel selected runs (interrupt)", permissions=["cancel"])
    def cancel_interrupt(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        try:
            result = services.runs_cancel_many(
                action="interrupt",
                actor=request.user,
                run_ids=list(queryset.values_list("id", flat=True)),
            )
        except RunsError as exc:
            self.message_user(request, exc.detail, messages.ERROR)
            return
        self.message_user(
            request,
            f"Interrupted {len(result.interrupted)} run(s). Finished runs were skipped.",
            messages.SUCCESS,
        )

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.cancel_run")


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "thread_id", "step", "created_at")
    list_filter = ("created_at",)
    search_fields = ("=id", "=run__id", "=thread__id")
    exclude = ("values", "pending")
    readonly_fields = (
        "id",
        "run",
        "thread",
        "parent",
        "step",
        "created_at",
        "values_pretty",
        "pending_pretty",
    )
    values_pretty = json_display("values")
    pending_pretty = json_display("pending")


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ("tool_call_id", "tool_name", "status", "run_id", "decided_by", "created_at")
    list_filter = ("status", "tool_name", "requires_approval", "created_at")
    search_fields = ("=tool_call_id", "=run__id", "tool_name")
    exclude = ("args", "original_args", "suspend_payload", "resume_schema", "resume_data", "result")
    readonly_fields = (
        "run",
        "tool_call_id",
        "step",
        "tool_name",
        "requires_approval",
        "status",
        "child_run",
        "decided_by",
        "decided_at",
        "decision_reason",
        "suspended_at",
        "started_at",
        "finished_at",
        "created_at",
        "args_pretty",
        "original_args_pretty",
        "suspend_payload_pretty",
        "resume_schema_pretty",
        "resume_data_pretty",
        "result_pretty",
    )
    args_pretty = json_display("args")
    original_args_pretty = json_display("original_args")
    suspend_payload_pretty = json_display("suspend_payload")
    resume_schema_pretty = json_display("resume_schema")
    resume_data_pretty = json_display("resume_data")
    result_pretty = json_display("result")


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ("run_id", "seq", "kind", "actor", "created_at")
    list_filter = ("kind", "created_at")
    search_fields = ("=run__id",)
    exclude = ("data",)
    readonly_fields = (
        "run",
        "seq",
        "kind",
        "actor",
        "created_at",
        "data_pretty",
    )
    data_pretty = json_display("data")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "run_id", "tool_call_id", "reason")
    list_filter = ("action", "created_at")
    search_fields = ("=run_id", "=thread_id", "actor", "tool_call_id")
    exclude = ("before", "after")
    readonly_fields = (
        "actor",
        "action",
        "run_id",
        "thread_id",
        "agent_id",
        "resource_id",
        "tool_call_id",
        "reason",
        "created_at",
        "before_pretty",
        "after_pretty",
    )
    before_pretty = json_display("before")
    after_pretty = json_display("after")
    date_hierarchy = "created_at"

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # the audit log is append-only


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = ("name", "prefix", "resource_id", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at", "created_at")
    search_fields = ("name", "prefix", "resource_id")
    exclude = ("key_hash",)
    readonly_fields = ("name", "prefix", "resource_id", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            services.api_key_revoke(key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)


class NotificationRuleForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=NotificationEvent.choices, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = NotificationRule
        fields = (
            "name",
            "agent_id",
            "resource_id",
            "events",
            "webhook_url",
            "webhook_format",
            "email_group",
            "active",
        )

    def clean_webhook_url(self) -> str:
        url: str = self.cleaned_data.get("webhook_url") or ""
        if url:
            try:
                check_url(url)
            except WebhookRefused as exc:
                raise forms.ValidationError(str(exc)) from None
        return url

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not data.get("webhook_url") and not data.get("email_group"):
            raise forms.ValidationError("Give a webhook URL, an e-mail group, or both.")
        return data


@admin.register(NotificationRule)
class NotificationRuleAdmin(admin.ModelAdmin):
    form = NotificationRuleForm
    list_display = ("name", "agent_id", "resource_id", "events", "webhook_format", "active")
    list_filter = ("active", "agent_id")
    search_fields = ("name", "agent_id", "resource_id")


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "event", "channel", "target", "status", "attempts")
    list_filter = ("status", "event", "channel", "created_at")
    search_fields = ("=id", "=run_id", "target")
    exclude = ("payload", "log")
    readonly_fields = (
        "id",
        "run_id",
        "agent_id",
        "rule",
        "event",
        "channel",
        "target",
        "format",
        "status",
        "attempts",
        "next_attempt_at",
        "locked_by",
        "locked_until",
        "last_status_code",
        "last_error",
        "created_at",
        "finished_at",
        "payload_pretty",
        "log_pretty",
    )
    payload_pretty = json_display("payload")
    log_pretty = json_display("log")


# --- Tenant scope ------------------------------------------------------------------------------


class StaffScopeInline(admin.TabularInline):
    """The resources a dashboard user is bound to; none = unbound (sees every run)."""

    model = StaffScope
    extra = 1
    fields = ("resource_id",)
    verbose_name = "resource this user is bound to"
    verbose_name_plural = (
        "Tenant scope: resources this user sees (none = every run; runs without a resource "
        "are shown to unbound users only; a bound user cannot use this admin)"
    )


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class ScopedUserAdmin(UserAdmin):
    inlines = [*UserAdmin.inlines, StaffScopeInline]


_staff_has_permission = admin.site.has_permission


def _unbound_staff_only(request: HttpRequest) -> bool:
    # The admin lists every run, thread, tool call and audit entry unscoped: a user bound to
    # resources is refused the whole site (its login page says so) rather than shown them.
    return _staff_has_permission(request) and can_see_admin(request.user)


admin.site.has_permission = _unbound_staff_only  # type: ignore[method-assign]
