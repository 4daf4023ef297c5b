"""Tenant-scoped staff: binding a dashboard user to the resources they may see.

The admin's user page edits the same rows through its inline (runs/admin.py); what a binding
means for reads is decided in runs/selectors/scope.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from runs.exceptions import ValidationFailed
from runs.models import StaffScope


def staff_scope_set(*, user: Any, resource_ids: Iterable[str]) -> list[str]:
    """Bind `user` to exactly these resources (none: unbound, sees every run). Returns them."""
    wanted = sorted({str(r).strip() for r in resource_ids})
    bad = [r for r in wanted if not r or len(r) > 255]
    if bad:
        raise ValidationFailed.field(
            "resource_ids",
            "1 to 255 characters each",
            detail="each resource id must be 1 to 255 characters",
        )
    with transaction.atomic():
        StaffScope.objects.filter(user_id=user.pk).exclude(resource_id__in=wanted).delete()
        for resource_id in wanted:
            StaffScope.objects.get_or_create(user_id=user.pk, resource_id=resource_id)
    # A scope cached on this user object (runs/selectors/scope.py) is stale now.
    with contextlib.suppress(AttributeError):
        delattr(user, "_runsite_scope")
    return wanted
