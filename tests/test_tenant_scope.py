"""Tenant-scoped staff: a dashboard user bound to resources sees and acts on only their runs.

The cast: alice is bound to "acme", bob to "globex", carol to nothing (she sees everything); all
three are staff in Support and Reviewers. The world: in each of acme, globex and "no resource"
a run waiting for an approval, one waiting for input, one queued and one interrupted (an
audit entry). Every dashboard route of runs/urls.py is walked for every user; sockets are
driven with WebsocketCommunicator.
"""

from __future__ import annotations

import csv
import io
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from runs import selectors, services, urls
from runs.exceptions import ValidationFailed
from runs.models import (
    AuditEntry,
    Checkpoint,
    Run,
    RunStatus,
    StaffScope,
    Thread,
    ToolCall,
    ToolCallStatus,
)
from tests.test_live import connect, db, receive_all_until, receive_until

HX = {"HX-Request": "true"}
TENANTS = ("acme", "globex", None)
SEES = {"alice": {"acme"}, "bob": {"globex"}, "carol": set(TENANTS)}
OWN = {"alice": "acme", "bob": "globex", "carol": None}  # where each one's actions are tried


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_user(name: str, *resources: str) -> User:
    services.groups_ensure()
    user = User.objects.create_user(username=name, password=name, is_staff=True)
    user.groups.add(*Group.objects.filter(name__in=["Support", "Reviewers"]))
    for resource in resources:
        StaffScope.objects.create(user=user, resource_id=resource)
    return user


@pytest.fixture
def cast(db: Any) -> dict[str, User]:
    return {
        "alice": make_user("alice", "acme"),
        "bob": make_user("bob", "globex"),
        "carol": make_user("carol"),
    }


@dataclass
class Tenant:
    name: str | None
    refund: Run  # waits for an approval of issue_refund
    weather: Run  # waits for input (a city)
    queued: Run  # pending, an hour from now
    cancelled: Run  # interrupted: it has an audit entry
    thread: Thread
    checkpoint: Checkpoint

    @property
    def runs(self) -> list[Run]:
        return [self.refund, self.weather, self.queued, self.cancelled]

    @property
    def markers(self) -> list[str]:
        """Ids that appear in a page showing this tenant's rows (full UUIDs: in every link)."""
        return [str(r.id) for r in self.runs] + [str(self.thread.id)]


def make_tenant(name: str | None, drain: Any) -> Tenant:
    def thread() -> Thread:
        return services.thread_create(metadata={"resource_id": name} if name else {})

    refund_thread = thread()
    refund = services.run_create(
        agent_id="refund",
        thread_id=refund_thread.id,
        input={"order_id": f"O-{name}", "amount": 5.0},
        actor="t",
    )
    weather = services.run_create(agent_id="weather", thread_id=thread().id, input={}, actor="t")
    drain()
    queued = services.run_create(
        agent_id="echo", thread_id=thread().id, input={}, after_seconds=3600, actor="t"
    )
    cancelled = services.run_create(
        agent_id="echo", thread_id=thread().id, input={}, after_seconds=3600, actor="t"
    )
    services.run_cancel(run=cancelled, action="interrupt", actor="t", reason="tenant test")
    for run in (refund, weather, queued, cancelled):
        run.refresh_from_db()
        assert run.resource_id == name
    assert refund.status == weather.status == RunStatus.SUSPENDED
    return Tenant(
        name=name,
        refund=refund,
        weather=weather,
        queued=queued,
        cancelled=cancelled,
        thread=refund_thread,
        checkpoint=Checkpoint.objects.filter(thread_id=refund_thread.id).first(),
    )


@pytest.fixture
def world(cast: dict[str, User], drain: Any) -> dict[str | None, Tenant]:
    return {name: make_tenant(name, drain) for name in TENANTS}


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the routes -------------------------------------------------------------------------------

# Pages and fragments of one object: (the URL for a tenant, the URL of a missing object).
OBJECT_GETS = {
    "run_detail": lambda t: reverse("runs:run_detail", args=[t.refund.id]),
    "run_events": lambda t: reverse("runs:run_events", args=[t.refund.id]) + "?before=3",
    "run_state": lambda t: reverse("runs:run_state", args=[t.refund.id]),
    "run_event_data": lambda t: reverse("runs:run_event_data", args=[t.refund.id, 1]),
    "thread_detail": lambda t: reverse("runs:thread_detail", args=[t.thread.id]),
    "thread_values": lambda t: reverse("runs:thread_values", args=[t.thread.id]),
    "thread_checkpoint_values": lambda t: reverse(
        "runs:thread_checkpoint_values", args=[t.thread.id, t.checkpoint.id]
    ),
    "run_history_json": lambda t: reverse("runs:run_history_json", args=[t.refund.id]),
    "run_deliveries": lambda t: reverse("runs:run_deliveries", args=[t.refund.id]),
    "run_chat": lambda t: reverse("runs:run_chat", args=[t.refund.id]),
    "thread_chat": lambda t: reverse("runs:thread_chat", args=[t.thread.id]),
}
LIST_GETS = {
    "overview",
    "inbox",
    "run_list",
    "audit_log",
    "audit_csv",
    "runs_export_csv",
    "runs_export_json",
    "saved_views",
    "saved_views_menu",
}
POSTS = {
    "tool_call_approve",
    "tool_call_decline",
    "tool_call_answer",
    "run_cancel",
    "tool_call_claim",
    "tool_call_release",
    "run_retry",
}
BULK = {"runs_bulk_cancel", "runs_bulk_retry"}
# A user's own saved views (owner checks: tests/test_saved_views.py); their counts are scoped.
OWNED = {"saved_view_create", "saved_view_rename", "saved_view_delete"}


def test_it_covers_every_dashboard_route() -> None:
    names = {p.name for p in urls.urlpatterns}
    classified = set(OBJECT_GETS) | LIST_GETS | POSTS | BULK | OWNED
    assert names == classified, "classify the new route here"


def test_it_exports_searches_and_counts_only_their_tenants_runs(world, cast) -> None:
    for username, user in cast.items():
        client = signed_in(user)
        mine = {str(r.id) for t in TENANTS if t in SEES[username] for r in world[t].runs}
        foreign = [m for t in TENANTS if t not in SEES[username] for m in world[t].markers]

        exported = client.get(reverse("runs:runs_export_csv"))
        assert exported.status_code == 200
        rows = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))
        assert {r["id"] for r in rows} == mine, username

        as_json = client.get(reverse("runs:runs_export_json"))
        assert as_json.status_code == 200
        body = b"".join(as_json.streaming_content).decode()
        assert [m for m in foreign if m in body] == [], username

        # Searching for another tenant's order finds nothing; their own order is found.
        for tenant in TENANTS:
            if tenant is None:
                continue
            found = client.get(reverse("runs:run_list") + f"?q=O-{tenant}")
            assert found.status_code == 200
            html = found.content.decode()
            refund_id = str(world[tenant].refund.id)
            assert (refund_id in html) == (tenant in SEES[username]), (username, tenant)
            # An id prefix of another tenant's run does not jump to it either. (Runs created in
            # the same millisecond share their first 13 characters: the prefix is made long
            # enough to name this run alone.)
            others = {str(r) for r in Run.objects.values_list("id", flat=True)} - {refund_id}
            prefix = next(
                refund_id[:n]
                for n in range(13, 37)
                if not any(o.startswith(refund_id[:n]) for o in others)
            )
            jump = client.get(reverse("runs:run_list") + f"?q={prefix}")
            if tenant in SEES[username]:
                assert jump.status_code == 302, (username, tenant)
            else:
                assert jump.status_code == 200 and refund_id not in jump.content.decode()

        # A saved view counts what its owner may see.
        saved = client.post(reverse("runs:saved_view_create"), {"name": "everything", "query": ""})
        assert saved.status_code in (200, 302), saved.content[:300]
        menu = client.get(reverse("runs:saved_views_menu"), headers=HX)
        assert menu.status_code == 200
        counts = re.findall(r'class="view-count"[^>]*>\s*(\d+)', menu.content.decode())
        top_level = len(mine)
        assert counts == [str(top_level)], (username, menu.content.decode()[:500])


@dataclass
class Missing:
    """A tenant-shaped bag of ids that exist nowhere."""

    refund: Any
    thread: Any
    checkpoint: Any


def missing() -> Missing:
    def obj() -> Any:
        return type("Obj", (), {"id": uuid.uuid4()})()

    return Missing(refund=obj(), thread=obj(), checkpoint=obj())


def normalised(body: bytes, *ids: Any) -> str:
    text = body.decode()
    for i in ids:
        text = text.replace(str(i), "<id>")
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", text)


def test_it_shows_each_user_only_their_tenants_objects(world, cast) -> None:
    for username, user in cast.items():
        client = signed_in(user)
        for name, url_of in OBJECT_GETS.items():
            for tenant in world.values():
                url = url_of(tenant)
                plain = client.get(url)
                htmx = client.get(url, headers=HX)
                if tenant.name in SEES[username]:
                    assert plain.status_code == 200, (username, name, tenant.name)
                    assert htmx.status_code == 200, (username, name, tenant.name)
                    continue
                assert plain.status_code == 404, (username, name, tenant.name)
                # Not found exactly like an id that exists nowhere: nothing tells them apart.
                gone = missing()
                ids = (tenant.refund.id, tenant.thread.id, tenant.checkpoint.id)
                gone_ids = (gone.refund.id, gone.thread.id, gone.checkpoint.id)
                for headers, response in (({}, plain), (HX, htmx)):
                    other = client.get(url_of(gone), headers=headers)
                    assert response.status_code == other.status_code, (username, name)
                    assert normalised(response.content, *ids) == normalised(
                        other.content, *gone_ids
                    ), (username, name, tenant.name, headers)
                    assert f"O-{tenant.name}" not in response.content.decode()


def nav_inbox_count(html: str) -> int:
    return int(re.search(r'id="nav-inbox-count"[^>]*>(\d+)<', html).group(1))


def test_it_lists_and_counts_only_their_tenants_rows_on_every_list_page(world, cast) -> None:
    for username, user in cast.items():
        client = signed_in(user)
        mine = [world[t] for t in TENANTS if t in SEES[username]]
        others = [world[t] for t in TENANTS if t not in SEES[username]]
        n = len(mine)
        foreign = [m for t in others for m in t.markers]

        pages = {
            "overview": client.get(reverse("runs:overview")),
            "inbox": client.get(reverse("runs:inbox")),
            "run_list": client.get(reverse("runs:run_list")),
            "audit_log": client.get(reverse("runs:audit_log")),
            "overview_htmx": client.get(reverse("runs:overview"), headers=HX),
            "inbox_htmx": client.get(reverse("runs:inbox"), headers=HX),
            "run_list_htmx": client.get(reverse("runs:run_list"), headers=HX),
            # Filtering on another tenant's resource finds nothing rather than their runs.
            "run_list_filtered": client.get(reverse("runs:run_list") + "?resource=globex"),
            "inbox_filtered": client.get(reverse("runs:inbox") + "?resource=globex"),
            "audit_filtered": client.get(reverse("runs:audit_log") + "?resource=globex"),
        }
        for page, response in pages.items():
            assert response.status_code == 200, (username, page)
            html = response.content.decode()
            leaked = [m for m in foreign if m in html]
            assert leaked == [], (username, page, leaked)
            assert nav_inbox_count(html) == 2 * n, (username, page)

        expected = {
            "overview": [r for t in mine for r in (t.refund, t.weather)],
            "inbox": [r for t in mine for r in (t.refund, t.weather)],
            "run_list": [r for t in mine for r in t.runs],
            "audit_log": [t.cancelled for t in mine],
        }
        for page, runs in expected.items():
            for html in (pages[page].content.decode(), pages.get(f"{page}_htmx", pages[page])):
                html = html if isinstance(html, str) else html.content.decode()
                assert all(str(r.id) in html for r in runs), (username, page)

        counts = pages["overview"].context["ov"].counts
        assert (counts["suspended"], counts["pending"], counts["interrupted"]) == (2 * n, n, n)
        assert pages["inbox"].context["total"] == 2 * n
        assert pages["run_list"].context["total"] == 4 * n
        assert pages["audit_log"].context["total"] == n
        sees_globex = "globex" in SEES[username]
        assert pages["run_list_filtered"].context["total"] == (4 if sees_globex else 0)
        assert pages["inbox_filtered"].context["total"] == (2 if sees_globex else 0)
        assert pages["audit_filtered"].context["total"] == (1 if sees_globex else 0)

        export = client.get(reverse("runs:audit_csv"))
        assert export.status_code == 200
        rows = list(csv.DictReader(io.StringIO(b"".join(export.streaming_content).decode())))
        assert {r["run_id"] for r in rows} == {str(t.cancelled.id) for t in mine}, username
        assert {r["resource_id"] or None for r in rows} == SEES[username]


# --- actions ------------------------------------------------------------------------------


def action(name: str, tenant: Tenant) -> tuple[str, dict[str, str], Any]:
    """The URL, the form and a check that the action took effect, for one tenant's run."""
    refund_call = tenant.refund.tool_calls.get(status=ToolCallStatus.AWAITING_APPROVAL)
    weather_call = tenant.weather.tool_calls.get(status=ToolCallStatus.AWAITING_INPUT)

    def call_status(tc: ToolCall) -> str:
        return ToolCall.objects.get(id=tc.id).status

    forms = {
        "tool_call_approve": (
            tenant.refund,
            {"tool_call_id": refund_call.tool_call_id},
            lambda: call_status(refund_call) == ToolCallStatus.APPROVED,
        ),
        "tool_call_decline": (
            tenant.refund,
            {"tool_call_id": refund_call.tool_call_id, "reason": "no"},
            lambda: call_status(refund_call) == ToolCallStatus.DECLINED,
        ),
        "tool_call_answer": (
            tenant.weather,
            {"tool_call_id": weather_call.tool_call_id, "mode": "fields", "f_city": "Oslo"},
            lambda: call_status(weather_call) == ToolCallStatus.ANSWERED,
        ),
        "run_cancel": (
            tenant.refund,
            {"action": "interrupt", "reason": "x"},
            lambda: Run.objects.get(id=tenant.refund.id).status == RunStatus.INTERRUPTED,
        ),
        "tool_call_claim": (
            tenant.refund,
            {"tool_call_id": refund_call.tool_call_id},
            lambda: ToolCall.objects.get(id=refund_call.id).claimed_by != "",
        ),
        # Released: the claim its tenant's own reviewer held (see `held_by_own_reviewer`).
        "tool_call_release": (
            tenant.refund,
            {"tool_call_id": refund_call.tool_call_id},
            lambda: ToolCall.objects.get(id=refund_call.id).claimed_by == "",
        ),
    }
    forms["run_retry"] = (
        tenant.cancelled,
        {"input": "{}"},
        lambda: Run.objects.filter(retry_of_id=tenant.cancelled.id).exists(),
    )
    if name == "tool_call_release":
        held_by_own_reviewer(tenant, refund_call)
    run, data, done = forms[name]
    return reverse(f"runs:{name}", args=[run.id]), data, done


def held_by_own_reviewer(tenant: Tenant, tc: ToolCall) -> None:
    """Give the call a live claim of the user who sees that tenant (so a release shows)."""
    holder = User.objects.get(username={v: k for k, v in OWN.items()}[tenant.name])
    fresh = ToolCall.objects.get(id=tc.id)
    if fresh.claimed_by != holder.username:
        services.tool_call_claim(actor=holder, tool_call=fresh)


def snapshot() -> tuple[list[Any], list[Any], int]:
    return (
        list(Run.objects.order_by("id").values_list("id", "status")),
        list(ToolCall.objects.order_by("id").values_list("id", "status", "claimed_by")),
        AuditEntry.objects.count(),
    )


@pytest.mark.parametrize("name", sorted(POSTS))
def test_each_user_acts_only_on_their_tenants_runs(world, cast, name: str) -> None:
    for username, user in cast.items():
        client = signed_in(user)
        for tenant in world.values():
            if tenant.name in SEES[username]:
                continue
            url, data, done = action(name, tenant)
            before = snapshot()
            for headers in (HX, {}):
                response = client.post(url, data, headers=headers)
                # htmx: 404; a plain form is sent back to the run page, which is 404 too.
                if headers:
                    assert response.status_code == 404, (username, name, tenant.name)
                else:
                    assert response.status_code in (302, 404), (username, name, tenant.name)
                    if response.status_code == 302:
                        assert client.get(response["Location"]).status_code == 404
            assert snapshot() == before, (username, name, tenant.name)
            assert not done()
    # The control: the same action on their own tenant's run works.
    for username, user in cast.items():
        url, data, done = action(name, world[OWN[username]])
        response = signed_in(user).post(url, data, headers=HX)
        assert response.status_code == 200, (username, name, response.content[:300])
        assert done(), (username, name)


def bulk(client: Client, **data: Any) -> Any:
    return client.post(reverse("runs:runs_bulk_cancel"), data, headers=HX)


def preview_count(response: Any) -> int:
    return int(re.search(r"data-preview-count>(\d+)<", response.content.decode()).group(1))


def test_bulk_cancel_previews_and_cancels_only_the_users_runs(world, cast) -> None:
    def active(tenant: Tenant) -> list[str]:
        ids = [r.id for r in tenant.runs]
        return list(Run.objects.filter(id__in=ids).values_list("status", flat=True).order_by("id"))

    alice, bob, carol = (signed_in(cast[u]) for u in ("alice", "bob", "carol"))
    everything = {"action": "interrupt", "all_matching": "on", "include_suspended": "on"}
    # Three active runs in each tenant: the preview is each user's own count.
    assert preview_count(bulk(alice, **everything, step="preview")) == 3
    assert preview_count(bulk(bob, **everything, step="preview")) == 3
    assert preview_count(bulk(carol, **everything, step="preview")) == 9

    # Ids of another tenant's runs are skipped, in the preview and in the action.
    ids = [str(r.id) for t in world.values() for r in t.runs]
    by_id = {"action": "interrupt", "run_ids": ids, "include_suspended": "on"}
    assert preview_count(bulk(bob, **by_id, step="preview")) == 3
    acme_before, none_before = active(world["acme"]), active(world[None])
    done = bulk(bob, **by_id, step="confirm", expected=3)
    assert done.status_code == 200
    assert "Interrupted 3 runs." in done.content.decode()
    assert active(world["acme"]) == acme_before
    assert active(world[None]) == none_before
    assert all(s == RunStatus.INTERRUPTED for s in active(world["globex"]))

    # Every matching run: alice's three, nothing else.
    done = bulk(alice, **everything, step="confirm", expected=3)
    assert done.status_code == 200
    assert "Interrupted 3 runs." in done.content.decode()
    assert all(s == RunStatus.INTERRUPTED for s in active(world["acme"]))
    assert active(world[None]) == none_before
    assert not AuditEntry.objects.filter(resource_id__isnull=True, actor__in=["alice", "bob"])


# --- the binding, the admin -----------------------------------------------------------------


def test_the_scope_is_one_selector_and_unbound_means_everything(world, cast) -> None:
    alice = selectors.scope_for(cast["alice"])
    assert alice.bound and alice.key == ("acme",)
    assert selectors.scope_for(cast["carol"]) is selectors.UNSCOPED
    assert set(selectors.visible_runs(cast["alice"]).values_list("resource_id", flat=True)) == {
        "acme"
    }
    assert set(
        selectors.visible_tool_calls(cast["bob"]).values_list("run__resource_id", flat=True)
    ) == {"globex"}
    assert selectors.visible_threads(cast["carol"]).count() == Thread.objects.count()
    # A user bound to two resources sees both.
    StaffScope.objects.create(user=cast["bob"], resource_id="acme")
    bob = User.objects.get(username="bob")
    assert set(selectors.visible_runs(bob).values_list("resource_id", flat=True)) == {
        "acme",
        "globex",
    }


def test_bound_staff_are_refused_the_admin_and_unbound_staff_are_not(world, cast) -> None:
    for username, user in cast.items():
        response = signed_in(user).get(reverse("admin:index"))
        if SEES[username] == set(TENANTS):
            assert response.status_code == 200, username
        else:
            # The admin's own answer to a user it refuses: its login page.
            assert response.status_code == 302, username
            assert response["Location"].startswith(reverse("admin:login"))
        page = signed_in(user).get(reverse("runs:overview")).content.decode()
        assert ('href="/admin/"' in page) is (username == "carol")


def test_a_superuser_binds_a_user_to_a_resource_in_the_admin(cast, staff) -> None:
    dave = make_user("dave")
    client = signed_in(staff)
    url = reverse("admin:auth_user_change", args=[dave.id])
    page = client.get(url)
    assert page.status_code == 200
    assert "staff_scopes-TOTAL_FORMS" in page.content.decode()
    form = page.context["adminform"].form
    data = {
        k: v
        for k, v in form.initial.items()
        if k in form.fields and v is not None and k not in ("password", "last_login")
    }
    data["groups"] = [g.id for g in dave.groups.all()]
    data["user_permissions"] = []
    joined = dave.date_joined
    data.update(
        {
            "date_joined_0": joined.strftime("%Y-%m-%d"),
            "date_joined_1": joined.strftime("%H:%M:%S"),
            "staff_scopes-TOTAL_FORMS": "1",
            "staff_scopes-INITIAL_FORMS": "0",
            "staff_scopes-MIN_NUM_FORMS": "0",
            "staff_scopes-MAX_NUM_FORMS": "1000",
            "staff_scopes-0-resource_id": "initech",
        }
    )
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert list(StaffScope.objects.filter(user=dave).values_list("resource_id", flat=True)) == [
        "initech"
    ]
    assert selectors.scope_for(User.objects.get(id=dave.id)).key == ("initech",)


# --- sockets ----------------------------------------------------------------------------------


def ws_run(resource: str | None, *, suspend: bool, drain: Any) -> Run:
    """A run of `resource`: queued an hour ahead, or a refund that suspends (drained here)."""
    thread = services.thread_create(metadata={"resource_id": resource} if resource else {})
    if not suspend:
        return services.run_create(
            agent_id="echo", thread_id=thread.id, input={}, after_seconds=3600, actor="t"
        )
    run = services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": f"W-{resource}", "amount": 1.0},
        actor="t",
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


async def collect(communicator: Any, needle: str, timeout: float = 8.0) -> str:
    """Every push until one contains `needle`, then whatever else arrives for a moment."""
    received = await receive_all_until(communicator, lambda t: needle in t, timeout=timeout)
    # receive_nothing() waits without cancelling the consumer (a receive_from timeout would).
    while not await communicator.receive_nothing(timeout=0.5):
        received += await communicator.receive_from()
    return received


def last_total(pushes: str, dom_id: str) -> int:
    found = re.findall(rf'id="{dom_id}"[^>]*data-count="(\d+)"', pushes)
    assert found, f"no {dom_id} pushed: {pushes[-1500:]}"
    return int(found[-1])


@pytest.mark.django_db(transaction=True)
async def test_live_lists_push_each_user_only_their_tenants_rows_and_counts(cast, drain) -> None:
    sockets = {}
    for username in ("alice", "bob", "carol"):
        for view in ("runs", "inbox"):
            communicator, ok = await connect(f"/ws/runs/?view={view}", cast[username])
            assert ok, (username, view)
            sockets[username, view] = communicator
    try:
        # Another tenant's change first, then alice's own: by the time her run arrives the
        # globex one has been heard (and must have been dropped) by every socket.
        globex_queued = await db(ws_run)("globex", suspend=False, drain=drain)
        acme_queued = await db(ws_run)("acme", suspend=False, drain=drain)
        loose_queued = await db(ws_run)(None, suspend=False, drain=drain)
        alice = await collect(sockets["alice", "runs"], f'id="run-row-{acme_queued.id}"')
        bob = await collect(sockets["bob", "runs"], f'id="run-row-{globex_queued.id}"')
        carol = await collect(sockets["carol", "runs"], f'id="run-row-{loose_queued.id}"')
        assert str(globex_queued.id) not in alice and str(loose_queued.id) not in alice
        assert str(acme_queued.id) not in bob and str(loose_queued.id) not in bob
        # The control: an unbound user's socket (same view, same process) gets all three.
        assert all(str(r.id) in carol for r in (globex_queued, acme_queued, loose_queued))
        assert last_total(alice, "runs-total") == 1
        assert last_total(bob, "runs-total") == 1
        assert last_total(carol, "runs-total") == 3

        globex_waiting = await db(ws_run)("globex", suspend=True, drain=drain)
        acme_waiting = await db(ws_run)("acme", suspend=True, drain=drain)
        alice = await collect(sockets["alice", "inbox"], f'id="inbox-row-{acme_waiting.id}"')
        carol = await collect(sockets["carol", "inbox"], f'id="inbox-row-{acme_waiting.id}"')
        assert str(globex_waiting.id) not in alice
        assert "W-globex" not in alice
        assert str(globex_waiting.id) in carol
        assert last_total(alice, "inbox-total") == 1
        assert re.findall(r'id="nav-inbox-count"[^>]*>(\d+)<', alice)[-1] == "1"
        assert re.findall(r'id="nav-inbox-count"[^>]*>(\d+)<', carol)[-1] == "2"
    finally:
        for communicator in sockets.values():
            await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_the_overview_socket_pushes_scoped_counts(cast, drain) -> None:
    alice, ok1 = await connect("/ws/runs/?view=overview", cast["alice"])
    carol, ok2 = await connect("/ws/runs/?view=overview", cast["carol"])
    assert ok1 and ok2
    try:
        globex = await db(ws_run)("globex", suspend=True, drain=drain)
        acme = await db(ws_run)("acme", suspend=True, drain=drain)
        pushed = await collect(alice, str(acme.id))
        everything = await collect(carol, str(acme.id))

        def suspended_tile(html: str) -> int:
            tiles = re.findall(r'data-status="suspended">\s*<span class="n">(\d+)</span>', html)
            assert tiles, html[-1500:]
            return int(tiles[-1])

        assert suspended_tile(pushed) == 1
        assert suspended_tile(everything) == 2
        assert str(globex.id) not in pushed and "W-globex" not in pushed
        assert str(globex.id) in everything
    finally:
        await alice.disconnect()
        await carol.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_run_and_thread_sockets_of_another_tenant_are_refused(cast, drain) -> None:
    runs = {name: await db(ws_run)(name, suspend=False, drain=drain) for name in ("acme", "globex")}
    runs[None] = await db(ws_run)(None, suspend=False, drain=drain)
    for username, user in cast.items():
        for name, run in runs.items():
            for path in (f"/ws/runs/{run.id}/", f"/ws/threads/{run.thread_id}/"):
                communicator, ok = await connect(path, user)
                await communicator.disconnect()
                assert ok is (name in SEES[username]), (username, name, path)


@pytest.mark.django_db(transaction=True)
async def test_a_bound_users_run_page_follows_its_own_run(cast, drain) -> None:
    run = await db(ws_run)("acme", suspend=True, drain=drain)
    page, ok = await connect(f"/ws/runs/{run.id}/?seq={run.last_seq}", cast["alice"])
    assert ok
    try:
        await db(services.run_cancel)(run=run, action="interrupt", actor="t", reason="x")
        header = await receive_until(page, lambda t: 'id="run-header"' in t)
        assert "s-interrupted" in header
    finally:
        await page.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_sockets_share_a_render_only_with_the_same_scope(cast, drain) -> None:
    """alice (acme) and dave (acme and globex) hear the same acme change at the same tick, with
    the same permissions: were the scope left out of the render-sharing key, one of them would
    be sent the other's counts."""
    dave = await db(make_user)("dave", "acme", "globex")
    await db(ws_run)("globex", suspend=True, drain=drain)  # only dave counts this one
    sockets = {}
    for username, user in (("alice", cast["alice"]), ("dave", dave), ("alice2", cast["alice"])):
        communicator, ok = await connect("/ws/runs/?view=overview", user)
        assert ok
        sockets[username] = communicator
    try:
        acme = await db(ws_run)("acme", suspend=True, drain=drain)
        pushed = {name: await collect(c, str(acme.id)) for name, c in sockets.items()}

        def suspended_tile(html: str) -> int:
            return int(
                re.findall(r'data-status="suspended">\s*<span class="n">(\d+)</span>', html)[-1]
            )

        assert suspended_tile(pushed["alice"]) == suspended_tile(pushed["alice2"]) == 1
        assert suspended_tile(pushed["dave"]) == 2
    finally:
        for communicator in sockets.values():
            await communicator.disconnect()


def test_staff_scope_set_binds_rebinds_and_unbinds(world, cast) -> None:
    alice = cast["alice"]
    assert selectors.scope_for(alice).key == ("acme",)
    assert services.staff_scope_set(user=alice, resource_ids=["globex", "acme", "globex"]) == [
        "acme",
        "globex",
    ]
    assert selectors.scope_for(alice).key == ("acme", "globex")  # the cached scope was dropped
    assert signed_in(alice).get(reverse("runs:inbox")).context["total"] == 4
    services.staff_scope_set(user=alice, resource_ids=[])
    assert selectors.scope_for(alice) is selectors.UNSCOPED
    assert signed_in(alice).get(reverse("runs:inbox")).context["total"] == 6
    with pytest.raises(ValidationFailed):
        services.staff_scope_set(user=alice, resource_ids=["acme", " "])
    assert not StaffScope.objects.filter(user=alice).exists()  # nothing changed


def test_bulk_retry_retries_only_the_users_runs(world, cast) -> None:
    everyone = [r.id for t in world.values() for r in (t.cancelled,)]
    alice = signed_in(cast["alice"])
    form = {"run_ids": [str(i) for i in everyone], "step": "preview"}
    preview = alice.post(reverse("runs:runs_bulk_retry"), form, headers=HX)
    assert preview.status_code == 200
    form.update(step="confirm", expected="1")
    done = alice.post(reverse("runs:runs_bulk_retry"), form, headers=HX)
    assert done.status_code == 200, done.content[:300]
    retried = set(Run.objects.filter(retry_of__isnull=False).values_list("retry_of_id", flat=True))
    assert retried == {world["acme"].cancelled.id}
    # "Every run matching" is the list as alice sees it, never another tenant's.
    form = {"all_matching": "on", "status": "interrupted", "step": "confirm", "expected": "1"}
    again = alice.post(reverse("runs:runs_bulk_retry"), form, headers=HX)
    assert again.status_code == 200, again.content[:300]
    retried = set(Run.objects.filter(retry_of__isnull=False).values_list("retry_of_id", flat=True))
    assert retried == {world["acme"].cancelled.id}
