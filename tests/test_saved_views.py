"""Saved views: saved from the runs list, listed in the navigation with live counts, shared with
a group, renamed and deleted by their owner only. Alice-and-bob style: sam (Support) owns, rita
(Reviewers) sees what is shared with Reviewers, nora (no group) sees nothing of theirs."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from runs import services
from runs.models import SavedView

pytestmark = pytest.mark.django_db

NEW = reverse("runs:saved_view_create")
MENU = reverse("runs:saved_views_menu")
PAGE = reverse("runs:saved_views")


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def pending(input: Any) -> Any:
    return services.run_create(agent_id="echo", input=input, after_seconds=3600, actor="t")


def test_it_saves_the_current_query_normalised(support: Any) -> None:
    client = signed_in(support)
    response = client.post(
        NEW,
        {"name": "Walrus queue", "query": "status=pending&q=walrus&page=3&sort=-attempts&agent="},
    )
    assert response.status_code == 302
    view = SavedView.objects.get()
    assert view.owner == support and view.shared_with_group is None
    assert parse_qsl(view.query) == [("q", "walrus"), ("sort", "-attempts"), ("status", "pending")]
    assert response["Location"] == f"{reverse('runs:run_list')}?{view.query}"


def test_it_offers_to_save_a_view_from_the_runs_list(support: Any) -> None:
    html = signed_in(support).get(reverse("runs:run_list"), {"status": "pending"}).content.decode()
    form = html[html.index(f'action="{NEW}"') :]
    form = form[: form.index("</form>")]
    assert 'name="query" value="status=pending"' in form
    assert '<option value="' in form and "Support" in form  # share with a group of sam's


@pytest.mark.parametrize(
    "query, field",
    [
        ("sort=colour", "sort"),
        ("status=lost", "status"),
        ("thread=not-a-uuid", "thread"),
        ("colour=red", "unknown runs-list parameter"),
    ],
)
def test_it_refuses_a_query_the_runs_list_cannot_read(support: Any, query: str, field: str) -> None:
    response = signed_in(support).post(NEW, {"name": "bad", "query": query})
    assert response.status_code == 422
    assert "The view was not saved" in response.content.decode()
    assert field in response.content.decode()
    assert not SavedView.objects.exists()


def test_it_refuses_a_second_view_of_the_same_name(support: Any) -> None:
    client = signed_in(support)
    assert client.post(NEW, {"name": "Mine", "query": ""}).status_code == 302
    response = client.post(NEW, {"name": "Mine", "query": "status=error"})
    assert response.status_code == 409
    assert SavedView.objects.get().query == ""


def test_it_shares_only_with_a_group_of_the_owner(support: Any) -> None:
    reviewers = Group.objects.get(name="Reviewers")
    response = signed_in(support).post(
        NEW, {"name": "x", "query": "", "shared_with_group": str(reviewers.id)}
    )
    assert response.status_code == 422
    assert not SavedView.objects.exists()


def test_it_lists_views_in_the_navigation_with_live_counts(support: Any) -> None:
    client = signed_in(support)
    services.saved_view_create(owner=support, name="Otters", query="q=otter")
    services.saved_view_create(owner=support, name="Waiting", query="status=pending")
    html = client.get(reverse("runs:overview")).content.decode()
    assert f'hx-get="{MENU}"' in html  # the menu loads when opened
    menu = client.get(MENU, headers={"HX-Request": "true"})
    assert menu.status_code == 200
    counts = dict(
        re.findall(r">([^<>]+)</a> <span class=\"view-count\" data-count=\"(\d+)\"", menu.text)
    )
    assert counts == {"Otters": "0", "Waiting": "0"}
    pending({"animal": "otter"})
    menu = client.get(MENU).text
    counts = dict(
        re.findall(r">([^<>]+)</a> <span class=\"view-count\" data-count=\"(\d+)\"", menu)
    )
    assert counts == {"Otters": "1", "Waiting": "1"}


def test_it_counts_at_most_the_navigation_limit(
    support: Any, django_assert_max_num_queries: Any
) -> None:
    from runs.list_query import NAV_VIEWS

    for i in range(NAV_VIEWS + 2):
        services.saved_view_create(owner=support, name=f"view {i:02}", query="status=pending")
    client = signed_in(support)
    client.get(MENU)  # session and permission caches
    # session, user, views (2 queries), groups, one COUNT per listed view
    with django_assert_max_num_queries(NAV_VIEWS + 6):
        menu = client.get(MENU).text
    assert menu.count('class="view-count"') == NAV_VIEWS
    assert "All saved views" in menu


def test_it_shows_a_shared_view_to_the_group_only(support: Any, reviewer: Any, nobody: Any) -> None:
    reviewers = Group.objects.get(name="Reviewers")
    support.groups.add(reviewers)
    services.saved_view_create(
        owner=support, name="For reviewers", query="", shared_with_group=reviewers
    )
    services.saved_view_create(owner=support, name="Private", query="")
    rita = signed_in(reviewer).get(PAGE).text
    assert "For reviewers" in rita and "Private" not in rita
    assert "Rename" not in rita  # only the owner changes it
    nora = signed_in(nobody).get(PAGE).text
    assert "For reviewers" not in nora and "Private" not in nora


def test_it_lets_the_owner_rename_and_delete(support: Any) -> None:
    view = services.saved_view_create(owner=support, name="Old", query="status=error")
    client = signed_in(support)
    response = client.post(reverse("runs:saved_view_rename", args=[view.id]), {"name": "New"})
    assert response.status_code == 302
    view.refresh_from_db()
    assert view.name == "New"
    response = client.post(reverse("runs:saved_view_delete", args=[view.id]))
    assert response.status_code == 302
    assert not SavedView.objects.exists()


def test_it_refuses_changes_by_anyone_but_the_owner(support: Any, reviewer: Any) -> None:
    reviewers = Group.objects.get(name="Reviewers")
    support.groups.add(reviewers)
    view = services.saved_view_create(
        owner=support, name="Shared", query="", shared_with_group=reviewers
    )
    client = signed_in(reviewer)
    rename = client.post(reverse("runs:saved_view_rename", args=[view.id]), {"name": "Mine"})
    assert rename.status_code == 403
    delete = client.post(reverse("runs:saved_view_delete", args=[view.id]))
    assert delete.status_code == 403
    view.refresh_from_db()
    assert view.name == "Shared"
    missing = client.post(reverse("runs:saved_view_delete", args=[view.id + 1000]))
    assert missing.status_code == 404


def test_it_refuses_an_empty_name_on_rename(support: Any) -> None:
    view = services.saved_view_create(owner=support, name="Keep", query="")
    response = signed_in(support).post(
        reverse("runs:saved_view_rename", args=[view.id]), {"name": "  "}
    )
    assert response.status_code == 422
    view.refresh_from_db()
    assert view.name == "Keep"
