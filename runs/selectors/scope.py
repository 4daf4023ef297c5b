"""Tenant scope: which threads, runs, tool calls and audit entries a dashboard user may see.

One rule, decided here and nowhere else. A user bound to resources (StaffScope rows, managed
in the admin's user page) sees only what belongs to those resources; an unbound user sees
everything. A run or thread without a resource (`resource_id` NULL) belongs to no tenant, so
only unbound staff see it. API keys follow the same idea with their one `resource_id`
(runs/api/auth.py); the dashboard's selectors take the user and apply `scope_for(user)`.

Every dashboard read (pages, fragments, actions, websocket pushes and counts) goes through
`visible_runs`, `visible_threads`, `visible_tool_calls`, `visible_events` or
`visible_audit_entries`, or a selector built on them (`runs_filtered(filters, user=…)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q, QuerySet

from runs.exceptions import NotFound
from runs.models import AuditEntry, Run, RunEvent, StaffScope, Thread, ToolCall

# Where the scope is cached on a user object: one query per request or socket, not per read.
_CACHE_ATTR = "_runsite_scope"


@dataclass(frozen=True)
class Scope:
    """The resources a viewer may see; `resources=None` is unbound (everything)."""

    resources: frozenset[str] | None

    @property
    def bound(self) -> bool:
        return self.resources is not None

    @property
    def key(self) -> tuple[str, ...] | None:
        """Hashable and equal for viewers who see the same rows (part of render-sharing keys)."""
        return None if self.resources is None else tuple(sorted(self.resources))

    def q(self, field: str = "resource_id") -> Q:
        """The filter on `field` (a resource id column, or a path to one)."""
        if self.resources is None:
            return Q()
        # `__in` never matches NULL: runs without a resource stay with unbound staff.
        return Q(**{f"{field}__in": sorted(self.resources)})

    def allows(self, resource_id: str | None) -> bool:
        """Whether a row with this resource is visible (for messages that carry it)."""
        return self.resources is None or (resource_id is not None and resource_id in self.resources)


# Callers that are not a dashboard viewer and see everything: the API (scoped by its key's
# pin elsewhere), commands, and operator surfaces like /metrics. Passed explicitly, by name.
UNSCOPED = Scope(resources=None)
NOTHING = Scope(resources=frozenset())


def scope_for(user: Any) -> Scope:
    """The scope of a dashboard user (or a Scope, returned as is). Anonymous users see nothing.

    Cached on the user object: a request loads its user afresh, a websocket keeps the scope it
    connected with (a change of binding applies from the next page load or reconnect).
    """
    if isinstance(user, Scope):
        return user
    if user is None or not getattr(user, "is_authenticated", False):
        return NOTHING
    cached = getattr(user, _CACHE_ATTR, None)
    if isinstance(cached, Scope):
        return cached
    resources = frozenset(
        StaffScope.objects.filter(user_id=user.pk).values_list("resource_id", flat=True)
    )
    scope = Scope(resources=resources) if resources else UNSCOPED
    setattr(user, _CACHE_ATTR, scope)
    return scope


def visible_runs(user: Any) -> QuerySet[Run]:
    return Run.objects.filter(scope_for(user).q())


def visible_threads(user: Any) -> QuerySet[Thread]:
    return Thread.objects.filter(scope_for(user).q())


def visible_tool_calls(user: Any) -> QuerySet[ToolCall]:
    return ToolCall.objects.filter(scope_for(user).q("run__resource_id"))


def visible_events(user: Any) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(scope_for(user).q("run__resource_id"))


def visible_run(user: Any, run_id: Any) -> Run:
    """A run the user may see; another tenant's run is "not found", exactly like a missing one
    (a bound user must not learn that it exists)."""
    run = visible_runs(user).filter(id=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found", code="run_not_found")
    return run


def visible_thread(user: Any, thread_id: Any) -> Thread:
    thread = visible_threads(user).filter(id=thread_id).first()
    if thread is None:
        raise NotFound(f"Thread {thread_id} not found", code="thread_not_found")
    return thread


def visible_audit_entries(user: Any) -> QuerySet[AuditEntry]:
    # An entry carries the resource of its run when it was written (it outlives a rollback).
    return AuditEntry.objects.filter(scope_for(user).q())
