"""Exports: the runs list as CSV or JSON (streamed, the list's filters, search and sort, every
page of it) and a run's full history as a JSON download."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from runs import services
from runs.forms import PAGE_SIZE
from runs.models import Run

pytestmark = pytest.mark.django_db

CSV_URL = reverse("runs:runs_export_csv")
JSON_URL = reverse("runs:runs_export_json")


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def client(reviewer: Any) -> Client:
    c = Client()
    c.force_login(reviewer)
    return c


def body(response: Any) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


def pending(input: Any, agent_id: str = "echo") -> Run:
    return services.run_create(agent_id=agent_id, input=input, after_seconds=3600, actor="t")


def test_it_exports_every_run_of_the_list_as_csv_in_its_order(client: Client) -> None:
    runs = [pending({"n": i}) for i in range(PAGE_SIZE + 3)]  # more than one page
    response = client.get(CSV_URL)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="runsite-runs.csv"'
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [r["id"] for r in rows] == [str(r.id) for r in reversed(runs)]
    assert json.loads(rows[0]["input"]) == {"n": PAGE_SIZE + 2}
    assert rows[0]["status"] == "pending"


def test_it_exports_the_same_filters_search_and_sort_as_the_page(client: Client) -> None:
    a = pending({"animal": "lynx"})
    b = pending({"animal": "lynx"})
    pending({"animal": "moose"})
    services.run_create(agent_id="refund", input={"order_id": "lynx", "amount": 1}, actor="t")
    query = {"q": "lynx", "agent": "echo", "sort": "created"}
    rows = list(csv.DictReader(io.StringIO(body(client.get(CSV_URL, query)))))
    assert [r["id"] for r in rows] == [str(a.id), str(b.id)]
    records = json.loads(body(client.get(JSON_URL, query)))
    assert [r["id"] for r in records] == [str(a.id), str(b.id)]
    assert records[0]["input"] == {"animal": "lynx"}


def test_it_exports_json_as_one_valid_array(client: Client) -> None:
    response = client.get(JSON_URL, {"status": "error"})
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="runsite-runs.json"'
    assert json.loads(body(response)) == []
    pending("x")
    records = json.loads(body(client.get(JSON_URL)))
    assert len(records) == 1 and set(records[0]) >= {"id", "status", "input", "output", "error"}


def test_it_refuses_an_export_with_a_bad_parameter(client: Client) -> None:
    pending("x")
    for url in (CSV_URL, JSON_URL):
        response = client.get(url, {"sort": "colour"})
        assert response.status_code == 400
        assert "sort" in response.content.decode()
        assert client.get(url, {"status": "lost"}).status_code == 400


def test_it_defuses_spreadsheet_formulas_in_csv_cells(client: Client) -> None:
    pending("=HYPERLINK(1)")
    rows = list(csv.DictReader(io.StringIO(body(client.get(CSV_URL)))))
    assert rows[0]["input"] == '"=HYPERLINK(1)"'  # JSON text starts with a quote: harmless
    services.thread_create(metadata={})
    run = pending({})
    Run.objects.filter(id=run.id).update(resource_id="=cmd")
    rows = list(csv.DictReader(io.StringIO(body(client.get(CSV_URL)))))
    assert rows[0]["resource_id"] == "'=cmd"


def test_it_downloads_a_runs_full_history(client: Client, drain: Any) -> None:
    run = services.run_create(agent_id="refund", input={"order_id": "H-1", "amount": 3}, actor="t")
    drain()
    call = run.tool_calls.get(tool_name="issue_refund")
    services.tool_call_approve(run=run, tool_call_id=call.tool_call_id, actor="rita")
    drain()
    run.refresh_from_db()
    response = client.get(reverse("runs:run_history_json", args=[run.id]))
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.id}.json"'
    history = json.loads(body(response))
    assert history["run"]["id"] == str(run.id) and history["run"]["status"] == "success"
    assert [tc["tool_name"] for tc in history["tool_calls"]] == ["lookup_order", "issue_refund"]
    assert history["tool_calls"][1]["decided_by"] == "rita"
    assert [c["step"] for c in history["checkpoints"]] == sorted(
        run.checkpoints.values_list("step", flat=True)
    )
    assert [e["seq"] for e in history["events"]] == list(range(1, run.last_seq + 1))
    assert history["events"][0]["kind"] == "created"


def test_it_links_the_history_from_the_run_page(client: Client) -> None:
    run = pending({})
    html = client.get(reverse("runs:run_detail", args=[run.id])).content.decode()
    assert reverse("runs:run_history_json", args=[run.id]) in html


def test_it_answers_404_for_the_history_of_a_missing_run(client: Client) -> None:
    url = reverse("runs:run_history_json", args=["01a22d0e-0000-7000-8000-000000000000"])
    assert client.get(url).status_code == 404


def test_it_links_the_exports_with_the_lists_query(client: Client) -> None:
    html = client.get(reverse("runs:run_list"), {"status": "pending", "q": "yak"}).content.decode()
    assert f"{CSV_URL}?status=pending&amp;q=yak" in html
    assert f"{JSON_URL}?status=pending&amp;q=yak" in html
