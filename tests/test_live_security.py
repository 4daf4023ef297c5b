"""Every route of the URL conf is accounted for: the dashboard needs a login, its POSTs a
permission and a CSRF token; websockets need a session and a same-site origin.

The enumeration walks the resolver, so a route added later fails here until it is classified.
"""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from runs import services
from runs.models import AuditEntry, Run, RunStatus
from runsite.asgi import application
from tests import reliability
from tests.helpers import session_cookie_for

pytestmark = pytest.mark.django_db

# Routes outside the dashboard, by prefix, and who guards them.
PUBLIC = {"healthz", "readyz", "metrics"}  # metrics: RUNS_METRICS_TOKEN (tests/test_health.py)
GUARDED_ELSEWHERE = ("api/", "admin/", "accounts/")  # API keys (test_hostile), staff, auth views
# Every dashboard POST and the permission it needs.
DASHBOARD_POSTS = {
    "runs:tool_call_approve": "runs.review_run",
    "runs:tool_call_decline": "runs.review_run",
    "runs:tool_call_answer": "runs.review_run",
    "runs:tool_call_claim": "runs.review_run",
    "runs:tool_call_release": "runs.review_run",
    "runs:run_cancel": "runs.cancel_run",
    "runs:runs_bulk_cancel": "runs.cancel_run",
    "runs:run_retry": "runs.cancel_run",
    "runs:runs_bulk_retry": "runs.cancel_run",
}
# POSTs any signed-in user may make: they change only that user's own saved views (who may
# change which view is tested in tests/test_saved_views.py).
DASHBOARD_POSTS_OWN = {"runs:saved_view_create", "runs:saved_view_rename", "runs:saved_view_delete"}
BULK = ("runs:runs_bulk_cancel", "runs:runs_bulk_retry")


def all_routes() -> list[tuple[str, URLPattern]]:
    out: list[tuple[str, URLPattern]] = []

    def walk(patterns: list[Any], prefix: str, namespace: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
                walk(p.url_patterns, prefix + str(p.pattern), ns)
            else:
                out.append((prefix + str(p.pattern), p, f"{namespace}{p.name}" if p.name else ""))

    walk(get_resolver().url_patterns, "", "")
    return out


def dashboard_routes() -> list[tuple[str, URLPattern, str]]:
    return [
        r for r in all_routes() if not r[0].startswith(GUARDED_ELSEWHERE) and r[0] not in PUBLIC
    ]


def test_every_route_is_classified() -> None:
    names = {name for _, _, name in dashboard_routes()}
    assert all(name.startswith("runs:") for name in names), names
    posts = {name for route, pattern, name in dashboard_routes() if _is_post(pattern)}
    assert posts == set(DASHBOARD_POSTS) | DASHBOARD_POSTS_OWN, (
        "classify new POST routes in DASHBOARD_POSTS or DASHBOARD_POSTS_OWN"
    )


def _is_post(pattern: URLPattern) -> bool:
    # require_POST wraps the view; its closure names the allowed methods
    view = pattern.callback
    return any(cell.cell_contents == ["POST"] for cell in getattr(view, "__closure__", None) or ())


def _url(route: str, run: Run) -> str:
    return "/" + route.replace("<uuid:run_id>", str(run.id)).replace(
        "<uuid:thread_id>", str(run.thread_id)
    ).replace("<uuid:checkpoint_id>", "01a22d0e-0000-7000-8000-000000000000").replace(
        "<int:view_id>", "1"
    ).replace("<int:seq>", "1")


@pytest.fixture
def run(drain) -> Run:
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id="refund", thread_id=thread.id, input={"order_id": "S", "amount": 2}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED
    return run


def _post_body(name: str, run: Run) -> dict[str, str]:
    tc = run.tool_calls.get(tool_name="issue_refund")
    return {
        "tool_call_id": tc.tool_call_id,
        "action": "interrupt",
        "reason": "x",
        "scope": "selected",
        "run_ids": str(run.id),
        "confirm": "",
    }


@pytest.mark.parametrize("route", [r for r in dashboard_routes()], ids=lambda r: r[2])
def test_every_dashboard_route_needs_a_login(client: Client, run: Run, route) -> None:
    path, pattern, name = route
    url = _url(path, run)
    method = "post" if _is_post(pattern) else "get"
    response = getattr(client, method)(url, _post_body(name, run) if method == "post" else None)
    assert response.status_code in (302, 403), (url, response.status_code)
    if response.status_code == 302:
        assert response["Location"].startswith(reverse("login"))
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("name", sorted(DASHBOARD_POSTS))
def test_every_dashboard_post_needs_the_permission(
    client: Client, run: Run, nobody, reviewer, support, name
) -> None:
    url = reverse(name, args=[] if name in BULK else [run.id])
    # a user in no group, and a user with the other permission
    wrong = support if DASHBOARD_POSTS[name] == "runs.review_run" else reviewer
    for user in (nobody, wrong):
        client.force_login(user)
        response = client.post(url, _post_body(name, run))
        assert response.status_code == 403, (name, user.username, response.status_code)
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("name", sorted(DASHBOARD_POSTS))
def test_every_dashboard_post_needs_a_csrf_token(run: Run, reviewer, support, name) -> None:
    client = Client(enforce_csrf_checks=True)
    user = reviewer if DASHBOARD_POSTS[name] == "runs.review_run" else support
    client.force_login(user)
    url = reverse(name, args=[] if name in BULK else [run.id])
    response = client.post(url, _post_body(name, run))
    assert response.status_code == 403
    assert Run.objects.get(id=run.id).status == RunStatus.SUSPENDED
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("name", sorted(DASHBOARD_POSTS_OWN))
def test_every_own_view_post_needs_a_csrf_token(run: Run, support, name) -> None:
    from runs.models import SavedView

    view = services.saved_view_create(owner=support, name="mine", query="")
    client = Client(enforce_csrf_checks=True)
    client.force_login(support)
    url = reverse(name, args=[] if name == "runs:saved_view_create" else [view.id])
    response = client.post(url, {"name": "other", "query": ""})
    assert response.status_code == 403
    assert list(SavedView.objects.values_list("name", flat=True)) == ["mine"]


WS_PATHS = ["/ws/runs/", "/ws/runs/?view=inbox", "/ws/runs/{run}/", "/ws/threads/{thread}/"]


async def _connect(path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    try:
        connected, _ = await communicator.connect(timeout=5)
        return connected
    finally:
        await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", WS_PATHS)
async def test_websockets_refuse_no_session_and_a_foreign_origin(path: str) -> None:
    from asgiref.sync import sync_to_async
    from django.contrib.auth.models import User

    def setup() -> tuple[str, str, str]:
        user = User.objects.create_user("wsuser", password="x")
        thread = services.thread_create(metadata={})
        r = services.run_create(agent_id="echo", thread_id=thread.id, input=1, actor="t")
        return session_cookie_for(user), str(r.id), str(thread.id)

    cookie, run_id, thread_id = await sync_to_async(setup)()
    path = path.format(run=run_id, thread=thread_id)
    same = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    session = [(b"cookie", f"sessionid={cookie}".encode())]
    assert await _connect(path, same + session) is True  # the control: a signed-in same-site page
    assert await _connect(path, same) is False  # no session
    assert await _connect(path, same + [(b"cookie", b"sessionid=forged")]) is False
    assert (
        await _connect(
            path, [(b"origin", b"http://evil.example"), (b"host", b"127.0.0.1")] + session
        )
        is False
    )


def test_record_the_permission_checks() -> None:
    routes = dashboard_routes()
    reliability.record(
        "dashboard routes without login, POSTs without permission or CSRF; websockets without a session, with a forged session or a foreign origin",
        runs=1,
        observed=(
            f"all {len(routes)} dashboard routes redirect to login or answer 403; all {len(DASHBOARD_POSTS)} POST actions "
            f"answer 403 without the permission or the CSRF token; all {len(WS_PATHS)} websocket paths refuse; nothing written"
        ),
    )


@pytest.mark.django_db(transaction=True)
async def test_open_websockets_are_counted_in_the_metrics() -> None:
    from asgiref.sync import sync_to_async
    from django.contrib.auth.models import User

    from runs.metrics import WEBSOCKETS

    cookie = await sync_to_async(lambda: session_cookie_for(User.objects.create_user("gauge")))()
    before = WEBSOCKETS._value.get()
    communicator = WebsocketCommunicator(
        application,
        "/ws/runs/",
        headers=[
            (b"origin", b"http://127.0.0.1"),
            (b"host", b"127.0.0.1"),
            (b"cookie", f"sessionid={cookie}".encode()),
        ],
    )
    connected, _ = await communicator.connect(timeout=5)
    assert connected
    assert WEBSOCKETS._value.get() == before + 1
    await communicator.disconnect()
    assert WEBSOCKETS._value.get() == before
