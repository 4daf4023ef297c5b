"""Who may do what on the dashboard: one place for views, fragments and consumers.

Reviewers (`runs.review_run`) approve, decline and answer; Support (`runs.cancel_run`) cancels
and rolls back; staff see the admin. Templates ask the same questions through `perms`.
"""

from __future__ import annotations

from typing import Any


def can_review(user: Any) -> bool:
    return bool(user.has_perm("runs.review_run"))


def can_cancel(user: Any) -> bool:
    return bool(user.has_perm("runs.cancel_run"))


def can_see_admin(user: Any) -> bool:
    return bool(user.is_staff)


def can_use_dashboard(user: Any) -> bool:
    """Every page and socket of the dashboard needs a signed-in user."""
    return user is not None and bool(user.is_authenticated)


def permission_key(user: Any) -> tuple[bool, bool, bool]:
    """What a rendered fragment depends on about its viewer: sockets with the same key may
    share one render (no fragment shows who is looking at it)."""
    return (can_review(user), can_cancel(user), can_see_admin(user))
