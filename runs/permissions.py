"""Who may do what on the dashboard: one place for views, fragments and consumers.

Reviewers (`runs.review_run`) approve, decline and answer; Support (`runs.cancel_run`) cancels
and rolls back; unbound staff see the admin. Templates ask the same questions through `perms`.
*Which* runs a user sees and acts on is the tenant scope (runs/selectors/scope.py).
"""

from __future__ import annotations

from typing import Any

from runs.selectors import scope_for


def can_review(user: Any) -> bool:
    return bool(user.has_perm("runs.review_run"))


def can_cancel(user: Any) -> bool:
    return bool(user.has_perm("runs.cancel_run"))


def can_see_admin(user: Any) -> bool:
    """Staff, and unbound: the admin lists every run, thread and audit entry unscoped, so a
    user bound to resources is refused the whole admin site (runs/admin.py)."""
    return bool(user.is_staff) and not scope_for(user).bound


def can_use_dashboard(user: Any) -> bool:
    """Every page and socket of the dashboard needs a signed-in user."""
    return user is not None and bool(user.is_authenticated)


def permission_key(user: Any) -> tuple[bool, bool, bool, tuple[str, ...] | None]:
    """What a rendered fragment depends on about its viewer: sockets with the same key may
    share one render (no fragment shows who is looking at it). The tenant scope is part of
    it: rows and counts differ between users bound to different resources."""
    return (can_review(user), can_cancel(user), can_see_admin(user), scope_for(user).key)
