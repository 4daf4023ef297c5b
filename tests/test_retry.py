"""Retry and rerun: the service, the JSON API (`/api/runs/{id}/retry`, `/api/runs/retry`), the
`retryruns` command and the dashboard (run page "Retry…", runs list "Retry selected…")."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from runs import services
from runs.exceptions import Conflict, ValidationFailed
from runs.models import AuditEntry, Run, RunEvent, RunStatus, Thread

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ended(drain: Any, *, agent_id: str = "echo", input: Any = None, resource: str = "acme") -> Run:
    thread = services.thread_create(metadata={"resource_id": resource, "customer": "c-1"})
    run = services.run_create(
        agent_id=agent_id, thread_id=thread.id, input=input or {"q": 1}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    return run


def api_key(resource: str | None = None) -> str:
    _key, raw = services.api_key_create(name=f"k-{resource}", resource_id=resource)
    return raw


def post_json(client: Client, url: str, body: Any, key: str) -> Any:
    return client.post(
        url, data=json.dumps(body), content_type="application/json", headers={"x-api-key": key}
    )


# --- the service -----------------------------------------------------------------------------


def test_it_retries_an_ended_run_on_its_thread_with_the_same_input(drain) -> None:
    original = ended(drain, input={"q": 7})
    new = services.run_retry(run=original, actor="alice")
    new.refresh_from_db()
    assert new.status == RunStatus.PENDING
    assert new.thread_id == original.thread_id
    assert new.input == {"q": 7}
    assert new.retry_of_id == original.id
    assert new.metadata["retry_of"] == str(original.id)
    assert list(original.retries.all()) == [new]
    entry = AuditEntry.objects.get(action="retry")
    assert (entry.actor, entry.run_id) == ("alice", original.id)
    assert entry.after["retried_as"] == str(new.id)
    assert RunEvent.objects.filter(run=original, kind="retried").exists()
    drain()
    new.refresh_from_db()
    assert new.status == RunStatus.SUCCESS
    assert new.output == {"echo": {"q": 7}}


def test_it_retries_with_edited_input_checked_against_the_agents_schema(drain) -> None:
    original = ended(drain, agent_id="slow", input={"steps": 0})
    with pytest.raises(ValidationFailed):
        services.run_retry(run=original, actor="t", input={"steps": "many"})
    assert Run.objects.count() == 1
    assert not AuditEntry.objects.filter(action="retry").exists()
    new = services.run_retry(run=original, actor="t", input={"steps": 1, "delay_ms": 0})
    assert new.input == {"steps": 1, "delay_ms": 0}
    assert AuditEntry.objects.get(action="retry").after["input"] == {"steps": 1, "delay_ms": 0}


def test_it_retries_on_a_new_thread_copying_metadata_and_resource(drain) -> None:
    original = ended(drain, resource="acme")
    new = services.run_retry(run=original, actor="t", new_thread=True)
    assert new.thread_id != original.thread_id
    thread = Thread.objects.get(id=new.thread_id)
    assert thread.resource_id == "acme"
    assert new.resource_id == "acme"
    assert thread.metadata["customer"] == "c-1"
    assert thread.metadata["retry_of"] == str(original.id)


@pytest.mark.parametrize("status", ["pending", "suspended"])
def test_it_refuses_to_retry_a_run_that_has_not_ended(drain, status: str) -> None:
    if status == "pending":
        run = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    else:
        thread = services.thread_create(metadata={})
        run = services.run_create(
            agent_id="refund",
            thread_id=thread.id,
            input={"order_id": "A-1", "amount": 25.0},
            actor="t",
        )
        drain()
    run.refresh_from_db()
    assert run.status == status
    with pytest.raises(Conflict) as exc:
        services.run_retry(run=run, actor="t")
    assert exc.value.code == "run_not_ended"
    assert Run.objects.count() == 1


def test_a_retry_on_a_thread_held_by_a_suspended_run_queues_behind_it(drain) -> None:
    original = ended(drain)
    held = services.run_create(
        agent_id="refund",
        thread_id=original.thread_id,
        input={"order_id": "A-1", "amount": 25.0},
        actor="t",
    )
    drain()
    held.refresh_from_db()
    assert held.status == RunStatus.SUSPENDED
    new = services.run_retry(run=original, actor="t")
    drain()
    new.refresh_from_db()
    assert new.status == RunStatus.PENDING  # the thread's suspended run holds it


def test_a_bulk_retry_skips_runs_that_have_not_ended_and_refuses_above_the_cap(drain) -> None:
    a, b = ended(drain), ended(drain)
    busy = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    result = services.runs_retry_many(actor="t", run_ids=[a.id, b.id, busy.id])
    assert {old for old, _ in result.retried} == {a.id, b.id}
    assert [old for old, _ in result.skipped] == [busy.id]
    with pytest.raises(ValidationFailed):
        services.runs_retry_many(actor="t", run_ids=[a.id, b.id], limit=1)
    assert Run.objects.filter(retry_of__isnull=False).count() == 2


def test_deleting_the_original_keeps_the_retry(drain) -> None:
    original = ended(drain)
    new = services.run_retry(run=original, actor="t")
    drain()
    services.run_delete(run=original, actor="t")
    new.refresh_from_db()
    assert new.retry_of_id is None
    assert new.metadata["retry_of"] == str(original.id)


# --- the JSON API ----------------------------------------------------------------------------


def test_it_retries_one_run_over_the_api(client: Client, drain) -> None:
    original = ended(drain, input={"q": 2})
    response = post_json(client, f"/api/runs/{original.id}/retry", {}, api_key())
    assert response.status_code == 201
    body = response.json()
    assert body["retry_of"] == str(original.id)
    assert body["status"] == "pending"
    new = Run.objects.get(id=body["run_id"])
    assert new.input == {"q": 2}
    assert AuditEntry.objects.get(action="retry").actor.startswith("api:")


def test_the_api_retries_with_edited_input_or_explains_why_not(client: Client, drain) -> None:
    original = ended(drain, agent_id="slow", input={"steps": 0})
    key = api_key()
    bad = post_json(client, f"/api/runs/{original.id}/retry", {"input": {"steps": -1}}, key)
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "input.steps"
    unknown = post_json(client, f"/api/runs/{original.id}/retry", {"inptu": {}}, key)
    assert unknown.status_code == 422
    assert "inptu" in unknown.json()["detail"]
    assert Run.objects.count() == 1
    good = post_json(
        client, f"/api/runs/{original.id}/retry", {"input": {"steps": 0}, "new_thread": True}, key
    )
    assert good.status_code == 201
    assert good.json()["thread_id"] != str(original.thread_id)


def test_the_api_answers_409_for_a_run_that_has_not_ended(client: Client) -> None:
    run = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    response = post_json(client, f"/api/runs/{run.id}/retry", {}, api_key())
    assert response.status_code == 409
    assert response.json()["code"] == "run_not_ended"
    assert Run.objects.count() == 1


def test_a_key_pinned_to_a_resource_retries_only_its_resources_runs(client: Client, drain) -> None:
    mine, theirs = ended(drain, resource="acme"), ended(drain, resource="globex")
    key = api_key("acme")
    other = post_json(client, f"/api/runs/{theirs.id}/retry", {}, key)
    assert other.status_code == 404
    ok = post_json(client, f"/api/runs/{mine.id}/retry", {}, key)
    assert ok.status_code == 201
    many = post_json(client, "/api/runs/retry", {"status": "success"}, key)
    assert many.status_code == 200
    assert [r["run_id"] for r in many.json()["retried"]] == [str(mine.id)]
    by_ids = post_json(client, "/api/runs/retry", {"run_ids": [str(theirs.id)]}, key)
    assert by_ids.status_code == 200
    assert by_ids.json()["retried"] == []
    assert by_ids.json()["skipped"][0]["run_id"] == str(theirs.id)
    assert not Run.objects.filter(retry_of=theirs).exists()


def test_the_bulk_api_takes_ids_or_a_filter_never_both(client: Client, drain) -> None:
    a = ended(drain)
    key = api_key()
    both = post_json(client, "/api/runs/retry", {"run_ids": [str(a.id)], "status": "error"}, key)
    assert both.status_code == 422
    neither = post_json(client, "/api/runs/retry", {}, key)
    assert neither.status_code == 422
    active = post_json(client, "/api/runs/retry", {"status": "pending"}, key)
    assert active.status_code == 422
    assert Run.objects.count() == 1
    done = post_json(client, "/api/runs/retry", {"status": "success", "agent_id": "echo"}, key)
    assert done.status_code == 200
    assert len(done.json()["retried"]) == 1


def test_the_bulk_api_refuses_more_than_the_cap(client: Client, drain, monkeypatch) -> None:
    ended(drain), ended(drain)
    monkeypatch.setattr("runs.services.retry.RETRY_MANY_LIMIT", 1)
    response = post_json(client, "/api/runs/retry", {"status": "success"}, api_key())
    assert response.status_code == 422
    assert "more than 1 runs" in response.json()["detail"]
    assert Run.objects.count() == 2


# --- the command -----------------------------------------------------------------------------


def test_the_command_retries_by_status_after_a_dry_run(drain) -> None:
    ended(drain), ended(drain)
    out = io.StringIO()
    call_command("retryruns", "--status", "success", "--dry-run", stdout=out)
    assert "2 ended run(s) selected" in out.getvalue()
    assert Run.objects.count() == 2
    call_command("retryruns", "--status", "success", "--agent", "echo", "--yes", stdout=out)
    assert "Retried 2, skipped 0" in out.getvalue()
    assert Run.objects.filter(retry_of__isnull=False).count() == 2
    assert AuditEntry.objects.filter(action="retry", actor="command:retryruns").count() == 2


def test_the_command_refuses_ids_and_a_status_together(drain) -> None:
    a = ended(drain)
    with pytest.raises(CommandError):
        call_command("retryruns", str(a.id), "--status", "success", "--yes")
    with pytest.raises(CommandError):
        call_command("retryruns", "not-a-uuid", "--yes")
    assert Run.objects.count() == 1


# --- the dashboard ---------------------------------------------------------------------------


def test_an_ended_runs_page_offers_retry_to_support_only(drain, support, reviewer) -> None:
    run = ended(drain, input={"q": "hello"})
    page = signed_in(support).get(reverse("runs:run_detail", args=[run.id]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="run-retry"' in body
    assert "&quot;q&quot;: &quot;hello&quot;" in body  # the editor is prefilled with the input
    other = signed_in(reviewer).get(reverse("runs:run_detail", args=[run.id]))
    assert 'id="run-retry"' not in other.content.decode()
    pending = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    active = signed_in(support).get(reverse("runs:run_detail", args=[pending.id]))
    assert 'id="run-retry"' not in active.content.decode()


def test_retry_from_the_run_page_links_both_runs(drain, support) -> None:
    run = ended(drain, input={"q": 3})
    client = signed_in(support)
    response = client.post(
        reverse("runs:run_retry", args=[run.id]),
        {"input": '{"q": 3}', "reason": "flaky upstream"},
        headers=HX,
    )
    assert response.status_code == 200
    new = Run.objects.get(retry_of=run)
    assert response["HX-Redirect"] == reverse("runs:run_detail", args=[new.id])
    assert new.input == {"q": 3}
    entry = AuditEntry.objects.get(action="retry")
    assert (entry.actor, entry.reason) == ("sam", "flaky upstream")
    assert "input" not in entry.after  # unchanged input is not an edit
    new_page = client.get(reverse("runs:run_detail", args=[new.id])).content.decode()
    assert "data-retry-of" in new_page
    assert reverse("runs:run_detail", args=[run.id]) in new_page
    old_page = client.get(reverse("runs:run_detail", args=[run.id])).content.decode()
    assert "data-retried-as" in old_page
    assert f"retried as run {str(new.id)[:8]}…" in old_page  # the timeline says so too
    assert reverse("runs:run_detail", args=[new.id]) in old_page


def test_retry_from_the_run_page_checks_the_edited_input(drain, support) -> None:
    run = ended(drain, agent_id="slow", input={"steps": 0})
    client = signed_in(support)
    url = reverse("runs:run_retry", args=[run.id])
    broken = client.post(url, {"input": '{"steps": '}, headers=HX)
    assert broken.status_code == 422
    assert "Not valid JSON" in broken.content.decode()
    wrong = client.post(url, {"input": '{"steps": "many"}'}, headers=HX)
    assert wrong.status_code == 422
    assert "steps" in wrong.content.decode()
    assert '{"steps": "many"}' in wrong.content.decode().replace("&quot;", '"')
    assert Run.objects.count() == 1
    ok = client.post(url, {"input": '{"steps": 1, "delay_ms": 0}', "new_thread": "on"})
    assert ok.status_code == 302
    new = Run.objects.get(retry_of=run)
    assert new.input == {"steps": 1, "delay_ms": 0}
    assert new.thread_id != run.thread_id
    assert AuditEntry.objects.get(action="retry").after["input"] == {"steps": 1, "delay_ms": 0}


def test_retry_from_the_run_page_refuses_a_run_in_flight(support) -> None:
    run = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    response = signed_in(support).post(
        reverse("runs:run_retry", args=[run.id]), {"input": "{}"}, headers=HX
    )
    assert response.status_code == 409
    assert "only ended runs" in response.content.decode()
    assert Run.objects.count() == 1


def test_retry_selected_previews_the_count_then_retries(drain, support) -> None:
    runs = [ended(drain) for _ in range(3)]
    busy = services.run_create(agent_id="echo", input={}, after_seconds=3600, actor="t")
    client = signed_in(support)
    data = {"run_ids": [str(r.id) for r in [*runs, busy]]}
    url = reverse("runs:runs_bulk_retry")
    preview = client.post(url, {**data, "step": "preview"}, headers=HX)
    assert preview.status_code == 200
    body = preview.content.decode()
    assert "data-preview-count>3<" in body
    assert "1 not ended (skipped)" in body
    assert Run.objects.count() == 4
    done = client.post(url, {**data, "step": "confirm", "expected": 3}, headers=HX)
    assert done.status_code == 200
    assert "Retried 3 runs; skipped 1." in done.content.decode()
    assert set(Run.objects.filter(retry_of__isnull=False).values_list("retry_of", flat=True)) == {
        r.id for r in runs
    }


def test_retry_selected_of_more_than_20_runs_needs_the_count_typed(drain, support) -> None:
    for _ in range(21):
        ended(drain)
    client = signed_in(support)
    url = reverse("runs:runs_bulk_retry")
    data = {"all_matching": "on", "status": "success", "step": "confirm", "expected": 21}
    wrong = client.post(url, {**data, "confirm_text": "20"}, headers=HX)
    assert wrong.status_code == 422
    assert not Run.objects.filter(retry_of__isnull=False).exists()
    done = client.post(url, {**data, "confirm_text": "21"}, headers=HX)
    assert done.status_code == 200
    assert Run.objects.filter(retry_of__isnull=False).count() == 21


def test_retry_selected_refuses_more_than_the_cap(drain, support, monkeypatch) -> None:
    ended(drain), ended(drain)
    monkeypatch.setattr("runs.services.RETRY_MANY_LIMIT", 1)
    response = signed_in(support).post(
        reverse("runs:runs_bulk_retry"), {"all_matching": "on", "step": "preview"}, headers=HX
    )
    assert response.status_code == 422
    assert "at most 1 can be retried" in response.content.decode()
    assert Run.objects.count() == 2


def test_the_runs_list_offers_retry_selected_with_ended_runs_selectable(drain, support) -> None:
    run = ended(drain)
    body = signed_in(support).get(reverse("runs:run_list")).content.decode()
    assert "data-bulk-retry" in body
    row = re.search(rf'<input type="checkbox" name="run_ids" value="{run.id}"[^>]*>', body)
    assert row is not None and "disabled" not in row.group(0)


# --- LangGraph graphs --------------------------------------------------------------------------


def test_it_retries_a_graph_run_with_the_same_input(
    transactional_db: Any, register_agent: Any, drain: Any
) -> None:
    from runs.graphs.loader import load_graphs
    from tests.test_graphs import graphs_config

    register_agent(load_graphs(graphs_config())["slow"])
    thread = services.thread_create()
    run = services.run_create(
        agent_id="slow", thread_id=thread.id, input={"steps": 2, "delay_ms": 1}, actor="t"
    )
    drain()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCESS
    new = services.run_retry(run=run, actor="t", new_thread=True)
    drain()
    new.refresh_from_db()
    assert new.status == RunStatus.SUCCESS
    assert new.output["items"] == [0, 1]
    assert new.retry_of_id == run.id
