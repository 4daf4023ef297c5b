"""API keys and the dashboard groups."""

from __future__ import annotations

from datetime import datetime, timedelta

from runs.exceptions import ValidationFailed
from runs.models import (
    ApiKey,
)
from runs.services.core import _now


def api_key_create(*, name: str, resource_id: str | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw secret (shown once, stored only as a hash)."""
    import secrets

    if not name or len(name) > 100:
        raise ValidationFailed.field(
            "name",
            "1 to 100 characters",
            detail="name must be 1 to 100 characters",
        )
    raw = "rs_" + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        name=name, prefix=raw[:10], key_hash=ApiKey.hash_key(raw), resource_id=resource_id or None
    )
    return key, raw


def api_key_revoke(*, key: ApiKey) -> ApiKey:
    if key.revoked_at is None:
        key.revoked_at = _now()
        key.save(update_fields=["revoked_at"])
    return key


def api_key_touch(*, key: ApiKey) -> None:
    """Record use, at most once a minute (a write per request would serialise on the row)."""
    now = _now()
    if api_key_touch_due(key=key, now=now):
        ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        key.last_used_at = now


def api_key_touch_due(*, key: ApiKey, now: datetime | None = None) -> bool:
    """Whether `api_key_touch` would write (a caller without a database connection at hand
    asks first)."""
    now = now or _now()
    return key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1)


GROUP_PERMISSIONS = {"Reviewers": ["review_run"], "Support": ["cancel_run"]}


def groups_ensure() -> None:
    """Create the Reviewers and Support groups with their permissions (idempotent)."""
    from django.contrib.auth.models import Group, Permission

    for group_name, codenames in GROUP_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(
            *Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
        )
