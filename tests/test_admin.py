"""The admin: every model is inspectable by staff, read-only, and its one action goes through
the service layer."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse

from runs import services
from runs.models import ApiKey, AuditEntry, Run, RunStatus

pytestmark = pytest.mark.django_db

RUNS_MODELS = [m for m in admin.site._registry if m._meta.app_label == "runs"]
# Notification rules are configuration, edited in the admin (tests/test_webhooks.py).
READ_ONLY_MODELS = [m for m in RUNS_MODELS if m.__name__ != "NotificationRule"]


@pytest.fixture
def data(drain, settings):
    settings.RUNS_WEBHOOK_ALLOW_PRIVATE = True  # the webhook below is never called
    thread = services.thread_create(metadata={"resource_id": "acme"})
    run = services.run_create(
        agent_id="refund",
        thread_id=thread.id,
        input={"order_id": "<b>x</b>", "amount": 4},
        actor="t",
    )
    drain()
    services.api_key_create(name="k")
    services.run_cancel(
        run=services.run_create(
            agent_id="echo", thread_id=None, input=1, actor="t", webhook="http://127.0.0.1:9/"
        ),
        action="interrupt",
        actor="t",
    )
    return run


def test_every_model_of_the_app_is_registered() -> None:
    names = {m.__name__ for m in RUNS_MODELS}
    assert names == {
        "Thread",
        "Run",
        "Checkpoint",
        "ToolCall",
        "RunEvent",
        "AuditEntry",
        "ApiKey",
        "NotificationRule",
        "Delivery",
    }


@pytest.mark.parametrize("model", READ_ONLY_MODELS, ids=lambda m: m.__name__)
def test_staff_see_every_list_and_object_read_only(client, staff, data, model) -> None:
    client.force_login(staff)
    opts = model._meta
    response = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert response.status_code == 200
    obj = model.objects.first()
    response = client.get(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    )
    assert response.status_code == 200
    assert b'name="_save"' not in response.content  # nothing is editable
    assert client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_add")).status_code == 403


def test_json_is_shown_escaped_and_readable(client, staff, data) -> None:
    client.force_login(staff)
    response = client.get(reverse("admin:runs_run_change", args=[data.pk]))
    assert b"&lt;b&gt;x&lt;/b&gt;" in response.content
    assert b"<b>x</b>" not in response.content


def test_list_filters_and_search_by_id(client, staff, data) -> None:
    client.force_login(staff)
    url = reverse("admin:runs_run_changelist")
    assert str(data.id) in client.get(url, {"status": "suspended"}).content.decode()
    assert str(data.id) not in client.get(url, {"status": "success"}).content.decode()
    assert str(data.id) in client.get(url, {"q": str(data.id)}).content.decode()


def test_the_cancel_action_goes_through_the_service_layer(client, staff, data) -> None:
    client.force_login(staff)
    response = client.post(
        reverse("admin:runs_run_changelist"),
        {"action": "cancel_interrupt", "_selected_action": [str(data.id)]},
        follow=True,
    )
    assert response.status_code == 200
    assert Run.objects.get(id=data.id).status == RunStatus.INTERRUPTED
    entry = AuditEntry.objects.filter(run_id=data.id, action="cancel_interrupt").get()
    assert entry.actor == staff.username


def test_non_staff_cannot_enter(client, reviewer) -> None:
    client.force_login(reviewer)
    response = client.get(reverse("admin:runs_run_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_api_keys_never_show_their_hash(client, staff, data) -> None:
    client.force_login(staff)
    key = ApiKey.objects.get()
    response = client.get(reverse("admin:runs_apikey_change", args=[key.pk]))
    assert key.key_hash.encode() not in response.content
