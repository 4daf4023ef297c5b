"""Saved views: a named runs-list query, owned by one user, optionally shared with a group."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from runs.exceptions import Conflict, NotFound, PermissionDenied, ValidationFailed
from runs.list_query import MAX_VIEWS, normalise_list_query
from runs.models import SavedView


def _clean_name(name: str) -> str:
    name = (name or "").strip()
    if not name:
        raise ValidationFailed.field("name", "required", detail="a view needs a name")
    if len(name) > 100:
        raise ValidationFailed.field("name", "at most 100 characters")
    return name


def saved_view_create(
    *, owner: Any, name: str, query: str, shared_with_group: Group | None = None
) -> SavedView:
    """Save `query` (normalised: known keys only, no page, fixed order) as `name`."""
    name = _clean_name(name)
    normalised = normalise_list_query(query)
    if len(normalised) > 2000:
        raise ValidationFailed.field("query", "at most 2000 characters")
    if shared_with_group is not None and not owner.groups.filter(id=shared_with_group.id).exists():
        raise ValidationFailed.field(
            "shared_with_group", "you can share a view only with a group you are in"
        )
    with transaction.atomic():
        if SavedView.objects.filter(owner_id=owner.pk).count() >= MAX_VIEWS:
            raise ValidationFailed.field("name", f"at most {MAX_VIEWS} views per person")
        try:
            with transaction.atomic():
                return SavedView.objects.create(
                    owner=owner, name=name, query=normalised, shared_with_group=shared_with_group
                )
        except IntegrityError:
            raise Conflict(f"you already have a view named {name!r}", code="view_exists") from None


def _owned(view_id: int, actor: Any) -> SavedView:
    view = SavedView.objects.select_for_update().filter(id=view_id).first()
    if view is None:
        raise NotFound(f"Saved view {view_id} not found", code="saved_view_not_found")
    if view.owner_id != actor.pk:
        # Members of the group it is shared with see it, but only its owner changes it.
        raise PermissionDenied("only the owner of a view can change it")
    return view


def saved_view_rename(*, view_id: int, actor: Any, name: str) -> SavedView:
    name = _clean_name(name)
    with transaction.atomic():
        view = _owned(view_id, actor)
        view.name = name
        try:
            with transaction.atomic():
                view.save(update_fields=["name"])
        except IntegrityError:
            raise Conflict(f"you already have a view named {name!r}", code="view_exists") from None
    return view


def saved_view_delete(*, view_id: int, actor: Any) -> str:
    """Delete one of the actor's views; returns its name."""
    with transaction.atomic():
        view = _owned(view_id, actor)
        name = view.name
        view.delete()
    return name
